#!/usr/bin/env bash
# The third-party MCP servers from npm that the proxy's tests run (the reference
# filesystem server), pinned with their whole dependency tree by
# hack/mcp-servers/package-lock.json and installed once with `npm ci` into
#   ${AGENT_SAGA_CACHE:-~/.cache/agent-saga}/npm/mcp-servers-<first 12 hex of the lock's sha256>/
# (tests/fixtures/mcp_servers.py looks there). A new lock is a new directory. The servers
# from PyPI (mcp-server-git) are pinned in pyproject.toml's dev extra instead.
# Needs node and npm (Debian: nodejs, npm; installed here when missing and root).
set -euo pipefail

log() { printf '[mcp-servers] %s\n' "$*" >&2; }

HERE=$(cd "$(dirname "$0")" && pwd)
SRC="$HERE/mcp-servers"
CACHE="${AGENT_SAGA_CACHE:-$HOME/.cache/agent-saga}"
DIGEST=$(sha256sum "$SRC/package-lock.json" | cut -c1-12)
DEST="$CACHE/npm/mcp-servers-$DIGEST"

if [ -f "$DEST/.installed" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing nodejs and npm from Debian"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
    else
        log "npm is missing: install Node.js 20+ and npm (Debian: apt-get install nodejs npm), then re-run"
        exit 1
    fi
fi
rm -rf "$DEST.tmp"
mkdir -p "$DEST.tmp"
cp "$SRC/package.json" "$SRC/package-lock.json" "$DEST.tmp/"
log "npm ci into $DEST"
(cd "$DEST.tmp" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null)
touch "$DEST.tmp/.installed"
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
