#!/usr/bin/env bash
# Install (once) and cache the third-party MCP servers the proxy's tests run against.
#
#   server-everything   @modelcontextprotocol/server-everything (npm; Node.js >= 20)
#   mcp-servers         @modelcontextprotocol/server-filesystem (npm), pinned with its whole
#                       tree by hack/mcp-servers/package-lock.json, installed into
#                       .../npm/mcp-servers-<first 12 hex of the lock's sha256>/ (a new
#                       lock is a new directory)
#
# The servers from PyPI (mcp-server-git) are pinned in pyproject.toml's dev extra instead.
#
# Each server's npm project is hack/npm/<name>/ (package.json naming the version pinned in
# hack/versions.env, package-lock.json pinning every dependency). It is installed with
# `npm ci` into
#   ${AGENT_SAGA_CACHE:-~/.cache/agent-saga}/npm/<name>-<version>/
# and reused by every later run: once installed, nothing is fetched (offline), and the
# script exits at once. A missing node/npm or a failed install fails here, saying why.
#
# Usage: hack/install-mcp-servers.sh [--print-paths]
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"
CACHE="${AGENT_SAGA_CACHE:-$HOME/.cache/agent-saga}"

log() { printf '[mcp-servers] %s\n' "$*" >&2; }
die() { printf '[mcp-servers] ERROR: %s\n' "$*" >&2; exit 1; }

install_npm() {  # name version
  local name="$1" version="$2" src="$HACK_DIR/npm/$1" dest="$CACHE/npm/$1-$2"
  if [[ "${PRINT_PATHS:-}" == 1 ]]; then echo "$dest"; return; fi
  [[ -f "$dest/.installed" ]] && return
  grep -q "\"$version\"" "$src/package.json" \
    || die "$src/package.json does not pin $version (hack/versions.env): make them agree"
  command -v node >/dev/null || die "node not found: install Node.js >= 20 (Debian: apt-get install nodejs npm)"
  command -v npm >/dev/null || die "npm not found: install npm (Debian: apt-get install npm)"
  local major
  major="$(node -p 'process.versions.node.split(".")[0]')"
  (( major >= 20 )) || die "node $(node --version) is too old for $name: install Node.js >= 20"
  log "installing $name $version into $dest"
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  cp "$src/package.json" "$src/package-lock.json" "$dest.tmp/"
  (cd "$dest.tmp" && npm ci --omit=dev --no-audit --no-fund --loglevel=error >&2) \
    || die "npm ci failed for $name $version (is the npm registry reachable?)"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
  touch "$dest/.installed"
}

install_locked() {  # the npm project hack/mcp-servers, named by its lock's digest
  local src="$HACK_DIR/mcp-servers" digest dest
  digest="$(sha256sum "$src/package-lock.json" | cut -c1-12)"
  dest="$CACHE/npm/mcp-servers-$digest"
  if [[ "${PRINT_PATHS:-}" == 1 ]]; then echo "$dest"; return; fi
  [[ -f "$dest/.installed" ]] && return
  command -v npm >/dev/null || die "npm not found: install Node.js >= 20 and npm (Debian: apt-get install nodejs npm)"
  log "installing hack/mcp-servers into $dest"
  rm -rf "$dest.tmp"
  mkdir -p "$dest.tmp"
  cp "$src/package.json" "$src/package-lock.json" "$dest.tmp/"
  (cd "$dest.tmp" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2) \
    || die "npm ci failed for hack/mcp-servers (is the npm registry reachable?)"
  touch "$dest.tmp/.installed"
  rm -rf "$dest"
  mv "$dest.tmp" "$dest"
}

[[ "${1:-}" == "--print-paths" ]] && PRINT_PATHS=1
install_npm server-everything "$MCP_SERVER_EVERYTHING_VERSION"
install_locked
