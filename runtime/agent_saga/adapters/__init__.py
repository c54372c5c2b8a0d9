"""Framework adapters: drop the saga engine into an existing graph, crew or agent.

    from agent_saga.adapters.langgraph import wrap_tool, saga_run

One module per framework, each an optional extra (``pip install 'agent-saga[langgraph]'``):
``langgraph``, ``openai_agents``, ``llamaindex``, ``autogen``, ``crewai``. Each offers
``wrap_tool`` (the original tool's name, description and argument schema, run as a saga
step with declared semantics and compensation) and ``saga_run`` (a whole run as one
saga: any failure compensates every tool that ran, newest first; a refusal reaches the
model through the framework's own tool-error channel). See docs/adapters.md.

Importing this package (or ``agent_saga``) imports no framework: only importing one
adapter module imports its framework.
"""
