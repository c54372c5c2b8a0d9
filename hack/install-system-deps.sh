#!/usr/bin/env bash
# Install the Debian packages the tests need: redis-server and postgresql (integration),
# and for the single-node cluster (tests/node/, `make cluster`): containerd, runc and the
# CNI plugins (the container runtime), iptables and conntrack (kube-proxy), buildah (builds
# the images from the Dockerfile) and mmdebstrap (the Debian root filesystem they start
# from), and chromium (the debugger's browser tests in tests/ui/ drive it with Playwright).
# Idempotent and fast: when all are present it touches neither apt nor the network.
#
# The packages' own services (redis on 6379, the "main" PostgreSQL cluster on 5432, a
# system containerd) are not started here: the tests start private ones (tests/fixtures/).
set -euo pipefail

log() { printf '[system-deps] %s\n' "$*" >&2; }

have_redis() { command -v redis-server >/dev/null 2>&1 || [ -x /usr/bin/redis-server ]; }
have_postgres() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ] && return 0
    done
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1
}
have_tools() { command -v setpriv >/dev/null 2>&1 && command -v flock >/dev/null 2>&1; }
# The node: each package's command, as the fixtures look for it (tests/fixtures/binaries.py).
NODE_PACKAGES=(
    "containerd:containerd" "runc:runc" "containernetworking-plugins:/usr/lib/cni/bridge"
    "iptables:iptables" "conntrack:conntrack" "buildah:buildah" "mmdebstrap:mmdebstrap"
)
have() { case "$1" in /*) [ -x "$1" ] ;; *) command -v "$1" >/dev/null 2>&1 ;; esac; }

missing=()
have_redis || missing+=(redis-server)
have_postgres || missing+=(postgresql)
have_tools || missing+=(util-linux)
have chromium || missing+=(chromium)
for entry in "${NODE_PACKAGES[@]}"; do
    have "${entry#*:}" || missing+=("${entry%%:*}")
done
# PostgreSQL refuses root: as root the fixtures run it as the `postgres` user, which the
# postgresql package creates.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1 && [ -z "${AGENT_SAGA_PG_USER:-}" ]; then
    missing+=(postgresql)
fi

if [ ${#missing[@]} -eq 0 ]; then
    log "redis-server, postgresql, chromium and the node's packages already installed"
    exit 0
fi

SUDO=()
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=(sudo -n)
    else
        log "missing: ${missing[*]}; not root and no passwordless sudo."
        log "install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}"
        exit 1
    fi
fi
command -v apt-get >/dev/null 2>&1 || {
    log "missing: ${missing[*]}, and this is not a Debian/Ubuntu system (no apt-get)."
    log "install redis-server and PostgreSQL (initdb, pg_ctl) with your package manager,"
    log "or point AGENT_SAGA_REDIS_SERVER / AGENT_SAGA_PG_BINDIR at them."
    exit 1
}

# Keep the packages' maintainer scripts from starting their system services: in a
# container there is no init to manage them, and the tests do not use them.
POLICY=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$POLICY" ]; then
    "${SUDO[@]}" sh -c "printf '#!/bin/sh\nexit 101\n' > $POLICY && chmod 755 $POLICY"
    created_policy=1
fi
cleanup() { [ $created_policy = 1 ] && "${SUDO[@]}" rm -f "$POLICY"; return 0; }
trap cleanup EXIT

log "installing: ${missing[*]}"
"${SUDO[@]}" apt-get update -q
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"

have_redis || { log "redis-server still missing after apt-get install"; exit 1; }
have_postgres || { log "PostgreSQL (initdb, pg_ctl) still missing after apt-get install"; exit 1; }
have chromium || { log "chromium still missing after apt-get install"; exit 1; }
for entry in "${NODE_PACKAGES[@]}"; do
    have "${entry#*:}" || { log "${entry#*:} still missing after apt-get install ${entry%%:*}"; exit 1; }
done
log "done"
