#!/usr/bin/env bash
# Build (once per source version) and cache the container images the single-node cluster
# runs -- no registry, no daemon, nothing pulled:
#
#   debian-python  Debian 12 (python3 3.11) from a root filesystem made with mmdebstrap:
#                  the Dockerfile's PYTHON_IMAGE
#   agent-saga-operator, agent-saga-recoveryd    the Dockerfile's targets, built by buildah
#   payments-agent, payments-recoveryd,          examples/payments/Dockerfile, FROM the
#   payments-mcp                                 recoveryd image (as docs/install.md says)
#   redis          Debian's redis-server, for the chart's in-chart trial Redis
#   pause          the pod sandbox, k8s.io/kubernetes's build/pause/linux/pause.c
#   coredns        cluster DNS (the binary hack/build-control-plane.sh coredns builds)
#
# Every image is agent-saga.local/<name>:<tag>. The project's and the example's tags are
# <appVersion>-<hash of what they are built from>, so a source change is a new tag (and
# `imagePullPolicy: IfNotPresent` can never run a stale one). Each image is written as an
# OCI archive to ${AGENT_SAGA_CACHE:-~/.cache/agent-saga}/images/, which the node imports
# into containerd (tests/fixtures/node.py); `kind load image-archive` takes the same files.
#
# Usage: hack/build-images.sh            build what is missing, print the manifest
#        hack/build-images.sh --print    print the manifest only; exit 1 if an image is missing
#   manifest lines: <name>=<reference> <archive>
#
# Python packages come from PyPI once, into a wheel house resolved by the image's own
# interpreter; the Dockerfile builds then run with no network (`--network none`).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$HACK_DIR")"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"

CACHE="${AGENT_SAGA_CACHE:-$HOME/.cache/agent-saga}"
OUT="$CACHE/images"
WORK="$CACHE/build/images"
LOG_DIR="$CACHE/logs"
REGISTRY=agent-saga.local
BUILDAH=(buildah --root "$CACHE/buildah/root" --runroot "$CACHE/buildah/run")

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] ERROR: %s\n' "$*" >&2; exit 1; }

PRINT_ONLY=0
case "${1:-}" in
    --print) PRINT_ONLY=1 ;;
    -h|--help) sed -n '2,26p' "${BASH_SOURCE[0]}"; exit 0 ;;
    "") ;;
    *) die "unknown argument: $1 (expected --print)" ;;
esac

# ------------------------------------------------------------------------------- versions
hash_files() {  # sha256 (12 hex) of the named files/dirs' contents and paths, sorted
    (cd "$1" && shift && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' \
        ! -path '*/build/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -c1-12
}
hash_text() { printf '%s' "$*" | sha256sum | cut -c1-12; }

APP_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$REPO/charts/agent-saga/Chart.yaml")
[ -n "$APP_VERSION" ] || die "no appVersion in charts/agent-saga/Chart.yaml"

# Debian 12 minbase + what the Dockerfile's stages run (python -m venv, groupadd/useradd).
# Documentation, man pages and translations are left out.
DEBIAN_SUITE=bookworm
BASE_PACKAGES="python3,python3-venv,python-is-python3"
REDIS_PACKAGES="redis-server"
MMDEBSTRAP_OPTS=(--variant=minbase --skip=output/dev
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
    --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*')
BASE_TAG="12-$(hash_text "$DEBIAN_SUITE $BASE_PACKAGES ${MMDEBSTRAP_OPTS[*]}")"
REDIS_TAG="12-$(hash_text "$DEBIAN_SUITE $REDIS_PACKAGES ${MMDEBSTRAP_OPTS[*]}")"
PAUSE_TAG="3.10-$KUBE_VERSION"
SRC_HASH=$(hash_files "$REPO" Dockerfile .dockerignore pyproject.toml README.md runtime operator recoveryd)
PROJECT_TAG="$APP_VERSION-$(hash_text "$SRC_HASH $BASE_TAG")"
EXAMPLE_TAG="$APP_VERSION-$(hash_text "$(hash_files "$REPO/examples/payments" .) $PROJECT_TAG")"

declare -A REF=(
    [debian-python]="$REGISTRY/debian-python:$BASE_TAG"
    [redis]="$REGISTRY/redis:$REDIS_TAG"
    [pause]="$REGISTRY/pause:$PAUSE_TAG"
    [coredns]="$REGISTRY/coredns:$COREDNS_VERSION-node"  # the plugins the node uses
    [agent-saga-operator]="$REGISTRY/agent-saga-operator:$PROJECT_TAG"
    [agent-saga-recoveryd]="$REGISTRY/agent-saga-recoveryd:$PROJECT_TAG"
    [payments-recoveryd]="$REGISTRY/payments-recoveryd:$EXAMPLE_TAG"
    [payments-agent]="$REGISTRY/payments-agent:$EXAMPLE_TAG"
    [payments-mcp]="$REGISTRY/payments-mcp:$EXAMPLE_TAG"
)
ORDER=(debian-python redis pause coredns agent-saga-operator agent-saga-recoveryd payments-recoveryd payments-agent
    payments-mcp)
archive() { local r="${REF[$1]##*/}"; printf '%s/%s.oci.tar' "$OUT" "${r/:/_}"; }

print_manifest() {
    local n missing=0
    for n in "${ORDER[@]}"; do
        printf '%s=%s %s\n' "$n" "${REF[$n]}" "$(archive "$n")"
        [ -f "$(archive "$n")" ] || missing=1
    done
    return $missing
}
if [ $PRINT_ONLY = 1 ]; then print_manifest; exit $?; fi

# ------------------------------------------------------------------------------ the tools
for tool in buildah mmdebstrap gcc; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found: run \`make system-deps\` (apt-get install buildah mmdebstrap gcc)"
done
mkdir -p "$OUT" "$WORK" "$LOG_DIR"
# One build at a time per cache (buildah's store and the archives are shared).
exec 8>"$CACHE/.images.lock"
flock -w 3600 8 || die "timed out waiting for another image build holding $CACHE/.images.lock"

have_image() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# Write the image's OCI archive (its layers as buildah stored them).
export_image() {  # $1 = name
    local ref="${REF[$1]}" out
    out="$(archive "$1")"
    "${BUILDAH[@]}" push --quiet --disable-compression --format oci "$ref" "oci-archive:$out.tmp:$ref" >/dev/null
    mv -f "$out.tmp" "$out"
    log "$1: $ref -> $out ($(du -h "$out" | cut -f1))"
    # Earlier versions of the same image: their archives and their tags in buildah's store.
    local old
    find "$OUT" -maxdepth 1 -name "${1}_*.oci.tar" ! -path "$out" -delete
    # (`|| true` inside: on a first build there is no earlier version, grep finds nothing,
    # and under pipefail that would end the script.)
    "${BUILDAH[@]}" images --format '{{.Name}}:{{.Tag}}' 2>/dev/null | { grep -Fx -v "$ref" || true; } \
        | { grep "^${ref%:*}:" || true; } | while read -r old; do "${BUILDAH[@]}" rmi "$old" >/dev/null 2>&1 || true; done
}

timed() {  # $1 = name, rest = command; output to $LOG_DIR/image-<name>.log
    local name="$1" start rc=0; shift
    start=$(date +%s)
    log "building $name (log: $LOG_DIR/image-$name.log)"
    # A subshell with -e of its own: a failing step stops the build (not so under `||`).
    set +e
    ( set -e; "$@" ) >"$LOG_DIR/image-$name.log" 2>&1
    rc=$?
    set -e
    if [ $rc -ne 0 ]; then
        tail -n 30 "$LOG_DIR/image-$name.log" >&2
        die "building $name failed (exit $rc); full log: $LOG_DIR/image-$name.log"
    fi
    printf '%s\timage-%s\t%s\t%ss\n' "$(date -u +%FT%TZ)" "$name" "${REF[$name]}" "$(( $(date +%s) - start ))" \
        >>"$LOG_DIR/build-times.tsv"
    log "built $name in $(( $(date +%s) - start ))s"
}

# An image of one root filesystem tarball (mmdebstrap --include=$2).
rootfs_image() {  # $1 = name, $2 = packages (comma-separated)
    local tar="$WORK/$1-rootfs.tar" c
    rm -f "$tar"
    mmdebstrap "${MMDEBSTRAP_OPTS[@]}" --include="$2" "$DEBIAN_SUITE" "$tar"
    c=$("${BUILDAH[@]}" from scratch)
    "${BUILDAH[@]}" add "$c" "$tar" / >/dev/null
    "${BUILDAH[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd '["/bin/sh"]' --label "org.opencontainers.image.description=Debian $DEBIAN_SUITE minbase + $2" "$c"
    "${BUILDAH[@]}" commit --quiet --rm "$c" "${REF[$1]}"
    rm -f "$tar"
}

# A one-file image: $2 copied to /$3, run as $4.
file_image() {  # $1 = name, $2 = file, $3 = path in the image, $4 = user
    local c
    c=$("${BUILDAH[@]}" from scratch)
    "${BUILDAH[@]}" copy --chmod 0755 "$c" "$2" "/$3" >/dev/null
    "${BUILDAH[@]}" config --entrypoint "[\"/$3\"]" --user "$4" "$c"
    "${BUILDAH[@]}" commit --quiet --rm "$c" "${REF[$1]}"
}

build() {  # build $1 with the rest unless its archive exists; then export it
    local name="$1"; shift
    if [ -f "$(archive "$name")" ]; then log "$name: cached (${REF[$name]})"; return; fi
    have_image "${REF[$name]}" || timed "$name" "$@"
    export_image "$name"
}

# ---------------------------------------------------------------- the wheel house (PyPI)
# Resolved by the base image's own python3 (its markers, e.g. python_full_version, decide
# what is needed), with the host's network and CA bundle; the builds then use only it.
WHEELS="$WORK/wheels-$(hash_text "$BASE_TAG $(cat "$REPO/pyproject.toml" "$REPO/examples/payments/pyproject.toml")")"
wheel_house() {
    local c cert=/etc/ssl/certs/ca-certificates.crt mounts=() certopt=""
    [ -d "$WHEELS" ] && return 0
    log "downloading the Python packages into $WHEELS"
    rm -rf "$WHEELS.tmp" && mkdir -p "$WHEELS.tmp"
    python3 -c 'import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
example = tomllib.load(open(sys.argv[2], "rb"))["project"]["optional-dependencies"]
print("\n".join(sorted(set(extras["operator"] + extras["recoveryd"] + extras["fast"] + example["mcp"]))))' "$REPO/pyproject.toml" \
        "$REPO/examples/payments/pyproject.toml" >"$WHEELS.tmp/requirements.txt" \
        || die "cannot read the extras of $REPO/pyproject.toml (needs python3 >= 3.11)"
    # Build backends: the project's (setuptools>=77) and the example's.
    printf 'setuptools>=77\nwheel\n' >>"$WHEELS.tmp/requirements.txt"
    mounts=(-v "$WHEELS.tmp:/wheels")
    if [ -f "$cert" ]; then mounts+=(-v "$cert:$cert:ro"); certopt="--cert $cert"; fi
    c=$("${BUILDAH[@]}" from --pull=never "${REF[debian-python]}")
    "${BUILDAH[@]}" run --network host "${mounts[@]}" "$c" -- sh -c "python3 -m venv /tmp/pip \
        && /tmp/pip/bin/pip download --quiet --disable-pip-version-check $certopt --dest /wheels \
           -r /wheels/requirements.txt" \
        || { "${BUILDAH[@]}" rm "$c" >/dev/null; die "downloading the Python packages from PyPI failed"; }
    "${BUILDAH[@]}" rm "$c" >/dev/null
    printf '[global]\nno-index = true\nfind-links = /wheels\n' >"$WHEELS.tmp/pip.conf"
    mv "$WHEELS.tmp" "$WHEELS"
}

# buildah bud, offline: FROM images only from the local store (--pull=never), pip only
# from the wheel house (through /etc/pip.conf), no network in RUN steps.
bud() {  # $1 = name, $2 = context, rest = bud arguments
    local name="$1" ctx="$2"; shift 2
    wheel_house
    "${BUILDAH[@]}" bud --layers --pull=never --network none \
        -v "$WHEELS:/wheels:ro" -v "$WHEELS/pip.conf:/etc/pip.conf:ro" -t "${REF[$name]}" "$@" "$ctx"
}

# Put an image whose archive exists but which buildah's store lost back into the store
# (a later build is FROM it).
restore() {  # $1 = name
    have_image "${REF[$1]}" || "${BUILDAH[@]}" pull --quiet "oci-archive:$(archive "$1")" >/dev/null
}

# ------------------------------------------------------------------------------ pause
pause_image() {
    local go src
    go=$(command -v go || echo /usr/local/go/bin/go)
    src="$("$go" env GOMODCACHE)/k8s.io/kubernetes@$KUBE_VERSION/build/pause/linux/pause.c"
    if [ ! -f "$src" ]; then
        (cd "$WORK" && GOFLAGS= "$go" mod download "k8s.io/kubernetes@$KUBE_VERSION") \
            || die "cannot download k8s.io/kubernetes@$KUBE_VERSION (for pause.c) from the Go module proxy"
    fi
    gcc -Os -static -DVERSION="$PAUSE_TAG" -o "$WORK/pause" "$src"
    strip "$WORK/pause"
    file_image pause "$WORK/pause" pause 65535:65535
}

coredns_image() {
    local bin
    bash "$HACK_DIR/build-control-plane.sh" coredns
    bin=$(bash "$HACK_DIR/build-control-plane.sh" --print-paths coredns 2>/dev/null | sed -n 's/^coredns=//p')
    [ -x "$bin" ] || die "coredns not built: run \`bash hack/build-control-plane.sh coredns\`"
    file_image coredns "$bin" coredns 0:0
}

# ------------------------------------------------------------------------------------ go
build debian-python rootfs_image debian-python "$BASE_PACKAGES"
build redis rootfs_image redis "$REDIS_PACKAGES"
build pause pause_image
restore debian-python
build agent-saga-operator bud agent-saga-operator "$REPO" -f "$REPO/Dockerfile" --target operator \
    --build-arg "PYTHON_IMAGE=${REF[debian-python]}"
build agent-saga-recoveryd bud agent-saga-recoveryd "$REPO" -f "$REPO/Dockerfile" --target recoveryd \
    --build-arg "PYTHON_IMAGE=${REF[debian-python]}"
restore agent-saga-recoveryd
build payments-recoveryd bud payments-recoveryd "$REPO/examples/payments" --target recoveryd \
    --build-arg "RECOVERYD_IMAGE=${REF[agent-saga-recoveryd]}"
build payments-agent bud payments-agent "$REPO/examples/payments" --target agent \
    --build-arg "RECOVERYD_IMAGE=${REF[agent-saga-recoveryd]}"
build payments-mcp bud payments-mcp "$REPO/examples/payments" --target mcp-server \
    --build-arg "RECOVERYD_IMAGE=${REF[agent-saga-recoveryd]}"
build coredns coredns_image

print_manifest
