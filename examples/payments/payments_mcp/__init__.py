"""The payments example's MCP server (see __main__)."""
