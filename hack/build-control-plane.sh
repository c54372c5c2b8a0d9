#!/usr/bin/env bash
# Build (once) and cache the local control plane's binaries from their Go modules:
#   etcd, kube-apiserver, kubectl (from k8s.io/kubernetes) and helm;
#   on request, the single-node cluster's too: kubelet, kube-controller-manager,
#   kube-scheduler, kube-proxy (`node`, same k8s.io/kubernetes version) and CoreDNS; stripe-mock
#   (github.com/stripe/stripe-mock, the Stripe connector's conformance server); and promtool
#   (github.com/prometheus/prometheus, which checks and unit-tests the chart's alert rules).
#
# Versions are pinned in hack/versions.env. Binaries land in
#   ${AGENT_SAGA_CACHE:-~/.cache/agent-saga}/bin/<name>-<version>/<name>
# and are reused by every later run: the script is idempotent and exits in well under a
# second when everything is cached. Binaries the user supplies win and are never built:
#   KUBEBUILDER_ASSETS=<dir with etcd, kube-apiserver[, kubectl]>  (envtest's name)
#   TEST_ASSET_ETCD / TEST_ASSET_KUBE_APISERVER / TEST_ASSET_KUBECTL / TEST_ASSET_HELM
#   (and TEST_ASSET_KUBELET / _KUBE_CONTROLLER_MANAGER / _KUBE_SCHEDULER / _KUBE_PROXY /
#   _COREDNS for the node; TEST_ASSET_STRIPE_MOCK, TEST_ASSET_PROMTOOL)
#
# Usage: hack/build-control-plane.sh [--print-paths] [etcd|kube|helm|node|coredns|stripe-mock|promtool ...]
#   With no component names, builds etcd, kube and helm (what `make control-plane` needs);
#   `make node` adds node and coredns, `make stripe-mock` stripe-mock, `make promtool` promtool.
#
# Why scratch modules: `go install k8s.io/kubernetes/cmd/kube-apiserver@v1.Y.Z` is refused
# because k8s.io/kubernetes's go.mod replaces its k8s.io/<staging> modules with ./staging
# paths. A scratch module that requires k8s.io/kubernetes and replaces each staging module
# with its published v0.Y.Z tag builds the same code. etcd's server module has replace
# directives too, and gets a scratch module of its own so its dependency versions never
# leak into the apiserver's build (and vice versa).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HACK_DIR/versions.env"

CACHE="${AGENT_SAGA_CACHE:-$HOME/.cache/agent-saga}"
BIN_ROOT="$CACHE/bin"
BUILD_ROOT="$CACHE/build"
LOG_DIR="$CACHE/logs"
mkdir -p "$BIN_ROOT" "$BUILD_ROOT" "$LOG_DIR"

log() { printf '[control-plane] %s\n' "$*" >&2; }
die() { printf '[control-plane] ERROR: %s\n' "$*" >&2; exit 1; }

PRINT_PATHS=0
COMPONENTS=()
for arg in "$@"; do
    case "$arg" in
        --print-paths) PRINT_PATHS=1 ;;
        etcd|kube|helm|node|coredns) COMPONENTS+=("$arg") ;;
        stripe-mock) COMPONENTS+=(stripe_mock) ;;
        promtool) COMPONENTS+=(promtool) ;;
        -h|--help) sed -n '2,23p' "${BASH_SOURCE[0]}"; exit 0 ;;
        *) die "unknown argument: $arg (expected etcd, kube, helm, node, coredns, stripe-mock, promtool or --print-paths)" ;;
    esac
done
[ ${#COMPONENTS[@]} -gt 0 ] || COMPONENTS=(etcd kube helm)

ETCD_BIN="$BIN_ROOT/etcd-$ETCD_VERSION/etcd"
KUBE_APISERVER_BIN="$BIN_ROOT/kube-$KUBE_VERSION/kube-apiserver"
KUBECTL_BIN="$BIN_ROOT/kube-$KUBE_VERSION/kubectl"
HELM_BIN="$BIN_ROOT/helm-$HELM_VERSION/helm"
KUBE_BIN_DIR="$BIN_ROOT/kube-$KUBE_VERSION"
NODE_COMMANDS=(kubelet kube-controller-manager kube-scheduler kube-proxy)
COREDNS_BIN="$BIN_ROOT/coredns-$COREDNS_VERSION-node/coredns"  # -node: the plugins the node uses
STRIPE_MOCK_BIN="$BIN_ROOT/stripe-mock-$STRIPE_MOCK_VERSION/stripe-mock"
PROMTOOL_BIN="$BIN_ROOT/promtool-$PROMETHEUS_VERSION/promtool"

# A user-supplied binary (envtest's variables) replaces the cached one.
user_asset() {  # $1 = TEST_ASSET_* variable name, $2 = file name inside KUBEBUILDER_ASSETS
    local var="$1" name="$2" val
    val="${!var:-}"
    if [ -n "$val" ]; then
        [ -x "$val" ] || die "$var=$val is not an executable file"
        printf '%s' "$val"; return 0
    fi
    if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/$name" ]; then
        printf '%s' "$KUBEBUILDER_ASSETS/$name"; return 0
    fi
    return 1
}

# ---------------------------------------------------------------------------- Go toolchain
find_go() {
    if command -v go >/dev/null 2>&1; then command -v go; return; fi
    for g in /usr/local/go/bin/go /usr/lib/go/bin/go "$HOME/go/bin/go" "$HOME/sdk/go/bin/go"; do
        [ -x "$g" ] && { echo "$g"; return; }
    done
    return 1
}

GO=""
need_go() {
    [ -n "$GO" ] && return 0
    GO="$(find_go)" || die "no Go toolchain found: install Go >= $GO_MIN_VERSION (https://go.dev/doc/install) and put it on PATH"
    local have
    have="$("$GO" env GOVERSION)"; have="${have#go}"
    if [ "$(printf '%s\n%s\n' "$GO_MIN_VERSION" "$have" | sort -V | head -1)" != "$GO_MIN_VERSION" ]; then
        die "Go $have is older than $GO_MIN_VERSION, which the pinned modules need"
    fi
    # Never download another toolchain (only the module proxy is reachable), build static
    # binaries, resolve the scratch modules' requirements, and drop local paths.
    export GOTOOLCHAIN=local CGO_ENABLED=0
    export GOFLAGS="-mod=mod -trimpath -buildvcs=false"
    log "using $GO ($have)"
}

# Memory the build adds to the whole machine: the drop of MemAvailable below its value at
# the start, sampled twice a second (it counts every compiler/linker running at once, which
# /usr/bin/time's "maximum RSS" of the largest single process does not; RSS also counts
# mmapped files, so the two differ both ways).
SAMPLER_PID=""
start_mem_sampler() {  # $1 = output file
    local out="$1"
    (
        start=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
        min=$start
        trap 'echo $(( (start - min) / 1024 )) > "$out"; exit 0' TERM
        while :; do
            avail=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
            [ "$avail" -lt "$min" ] && min=$avail
            echo $(( (start - min) / 1024 )) > "$out"
            sleep 0.5
        done
    ) &
    SAMPLER_PID=$!
}
stop_mem_sampler() {
    if [ -n "$SAMPLER_PID" ]; then
        kill "$SAMPLER_PID" 2>/dev/null || true
        wait "$SAMPLER_PID" 2>/dev/null || true
        SAMPLER_PID=""
    fi
}
trap stop_mem_sampler EXIT

# Run a build step under /usr/bin/time -v (when present) and append a one-line summary to
# $LOG_DIR/build-times.tsv: date, component, version, seconds, peak RSS MiB (largest
# process), peak memory the build added to the machine MiB, size of the output dir.
timed_build() {  # $1 = component label, $2 = version, $3 = output dir, rest = command
    local label="$1" version="$2" outdir="$3"; shift 3
    local tfile="$LOG_DIR/$label-$version.time" mfile="$LOG_DIR/$label-$version.mem"
    local blog="$LOG_DIR/$label-$version.log"
    local start end rc=0
    start=$(date +%s)
    start_mem_sampler "$mfile"
    log "building $label $version (log: $blog)"
    if [ -x /usr/bin/time ]; then
        /usr/bin/time -v -o "$tfile" "$@" >"$blog" 2>&1 || rc=$?
    else
        "$@" >"$blog" 2>&1 || rc=$?
    fi
    stop_mem_sampler
    end=$(date +%s)
    if [ $rc -ne 0 ]; then
        tail -n 40 "$blog" >&2
        die "building $label $version failed (exit $rc); full log: $blog"
    fi
    local rss="?" sysmem="?" size
    [ -f "$tfile" ] && rss=$(awk -F': ' '/Maximum resident set size/ {printf "%d", $2/1024}' "$tfile")
    [ -f "$mfile" ] && sysmem=$(cat "$mfile")
    size=$(du -sh "$outdir" | cut -f1)
    printf '%s\t%s\t%s\t%ss\tmaxrss=%sMiB\tmachine_added=%sMiB\tsize=%s\n' \
        "$(date -u +%FT%TZ)" "$label" "$version" "$((end - start))" "$rss" "$sysmem" "$size" \
        >>"$LOG_DIR/build-times.tsv"
    log "built $label $version in $((end - start))s (max RSS ${rss} MiB, machine +${sysmem} MiB, $size)"
}

# Write go.mod for a scratch module.
scratch_module() {  # $1 = dir, $2 = module name; go.mod body on stdin
    local dir="$1" name="$2"
    mkdir -p "$dir"
    {
        printf 'module %s\n\ngo %s\n\n' "$name" "$GO_MIN_VERSION"
        cat
    } >"$dir/go.mod.new"
    # Keep go.sum (and the resolved go.mod) between runs when the pins did not change.
    if ! cmp -s "$dir/go.mod.new" "$dir/go.mod.pins" 2>/dev/null; then
        cp "$dir/go.mod.new" "$dir/go.mod"
        cp "$dir/go.mod.new" "$dir/go.mod.pins"
        rm -f "$dir/go.sum"
    fi
    rm -f "$dir/go.mod.new"
}

# ------------------------------------------------------------------------------------ etcd
build_etcd() {
    if p=$(user_asset TEST_ASSET_ETCD etcd); then log "etcd: using $p (user-supplied)"; return; fi
    if [ -x "$ETCD_BIN" ]; then log "etcd $ETCD_VERSION: cached at $ETCD_BIN"; return; fi
    need_go
    local dir="$BUILD_ROOT/etcd-$ETCD_VERSION" out
    out="$(dirname "$ETCD_BIN")"
    scratch_module "$dir" agent-saga.local/build/etcd <<EOF
require go.etcd.io/etcd/server/v3 $ETCD_VERSION

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
EOF
    mkdir -p "$out"
    (cd "$dir" && timed_build etcd "$ETCD_VERSION" "$out" \
        "$GO" build -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3)
    mv -f "$out/etcd.tmp" "$ETCD_BIN"
}

# --------------------------------------------------------------- k8s.io/kubernetes commands
# The scratch module every k8s.io/kubernetes command is built in (one go.mod, one go.sum,
# one build cache: the node's commands reuse most of the apiserver's compiled packages).
KUBE_MODULE_DIR="$BUILD_ROOT/kube-$KUBE_VERSION"
kube_module() {
    need_go
    local modfile staging
    modfile="$("$GO" env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$KUBE_VERSION.mod"
    if [ ! -f "$modfile" ]; then
        (cd "$BUILD_ROOT" && GOFLAGS= "$GO" mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null) \
            || die "cannot download k8s.io/kubernetes@$KUBE_VERSION from the Go module proxy"
    fi
    # Every k8s.io/<staging> module k8s.io/kubernetes replaces with a ./staging path.
    staging=$(awk '$2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$modfile" | sort -u)
    [ -n "$staging" ] || die "no staging replace directives found in $modfile"
    {
        printf 'require k8s.io/kubernetes %s\n\nreplace (\n' "$KUBE_VERSION"
        for m in $staging; do printf '\t%s => %s %s\n' "$m" "$m" "$KUBE_STAGING_VERSION"; done
        printf ')\n'
    } | scratch_module "$KUBE_MODULE_DIR" agent-saga.local/build/kube
}

# `go build` the k8s.io/kubernetes commands named into $KUBE_BIN_DIR, version-stamped.
build_kube_commands() {  # $1 = log label, rest = command names
    local label="$1"; shift
    local major minor rest pkgs=() c f
    major="${KUBE_VERSION#v}"; major="${major%%.*}"
    rest="${KUBE_VERSION#v*.}"; minor="${rest%%.*}"
    local ld="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld="$ld -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=$(date -u +%FT%TZ)"
    done
    for c in "$@"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
    kube_module
    mkdir -p "$KUBE_BIN_DIR/.tmp"
    # One `go build` for all of them: they share most packages, so each extra one is cheap.
    (cd "$KUBE_MODULE_DIR" && timed_build "$label" "$KUBE_VERSION" "$KUBE_BIN_DIR" \
        "$GO" build -ldflags "$ld" -o "$KUBE_BIN_DIR/.tmp/" "${pkgs[@]}")
    for f in "$KUBE_BIN_DIR"/.tmp/*; do mv -f "$f" "$KUBE_BIN_DIR/$(basename "$f")"; done
    rmdir "$KUBE_BIN_DIR/.tmp"
}

# TEST_ASSET_<NAME> of a command (kube-apiserver -> TEST_ASSET_KUBE_APISERVER).
asset_var() { local v="${1^^}"; printf 'TEST_ASSET_%s' "${v//-/_}"; }

# Those of the commands named that are neither user-supplied nor cached, one per line.
wanted_kube_commands() {
    local c p
    for c in "$@"; do
        if p=$(user_asset "$(asset_var "$c")" "$c"); then log "$c: using $p (user-supplied)"
        elif [ -x "$KUBE_BIN_DIR/$c" ]; then log "$c $KUBE_VERSION: cached at $KUBE_BIN_DIR/$c"
        else echo "$c"; fi
    done
}

# ------------------------------------------------------------------ kube-apiserver, kubectl
build_kube() {
    local want
    mapfile -t want < <(wanted_kube_commands kube-apiserver kubectl)
    [ ${#want[@]} -eq 0 ] || build_kube_commands kube "${want[@]}"
}

# ------------------------------------------- kubelet, controller-manager, scheduler, proxy
# The node's commands, from the same k8s.io/kubernetes version as the API server.
build_node() {
    local want
    mapfile -t want < <(wanted_kube_commands "${NODE_COMMANDS[@]}")
    [ ${#want[@]} -eq 0 ] || build_kube_commands node "${want[@]}"
}

# ------------------------------------------------------------------------ helm, CoreDNS
# A command from a module that needs no replace directives: a scratch module requiring it.
build_one() {  # $1 = name, $2 = version, $3 = binary, $4 = module, $5 = package, $6 = ldflags[, $7 = build tags]
    local name="$1" version="$2" bin="$3" module="$4" pkg="$5" ld="$6" tags="${7:-}" p
    if p=$(user_asset "$(asset_var "$name")" "$name"); then log "$name: using $p (user-supplied)"; return; fi
    if [ -x "$bin" ]; then log "$name $version: cached at $bin"; return; fi
    need_go
    local dir="$BUILD_ROOT/$name-$version" out
    out="$(dirname "$bin")"
    printf 'require %s %s\n' "$module" "$version" | scratch_module "$dir" "agent-saga.local/build/$name"
    mkdir -p "$out"
    (cd "$dir" && timed_build "$name" "$version" "$out" \
        "$GO" build -tags "$tags" -ldflags "$ld" -o "$out/$name.tmp" "$pkg")
    mv -f "$out/$name.tmp" "$bin"
}

build_helm() {
    build_one helm "$HELM_VERSION" "$HELM_BIN" helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm \
        "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
}

# Cluster DNS for the node: CoreDNS with only the plugins the node's Corefile uses, in
# CoreDNS's execution order. The stock build compiles every plugin, cloud DNS providers'
# SDKs and tracers included, which is most of its build time.
COREDNS_PLUGINS=(ready health errors loadbalance cache kubernetes)
coredns_main() {
    local p
    printf '// CoreDNS with the plugins the node cluster DNS uses (generated by hack/build-control-plane.sh).\n'
    printf 'package main\n\nimport (\n\t"github.com/coredns/coredns/core/dnsserver"\n'
    printf '\t"github.com/coredns/coredns/coremain"\n'
    for p in "${COREDNS_PLUGINS[@]}"; do printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "$p"; done
    printf ')\n\nfunc init() {\n\tif err := dnsserver.SetDirectives([]string{'
    printf '"%s", ' "${COREDNS_PLUGINS[@]}"
    printf '}); err != nil {\n\t\tpanic(err)\n\t}\n}\n\nfunc main() { coremain.Run() }\n'
}
build_coredns() {
    local dir="$BUILD_ROOT/coredns-$COREDNS_VERSION"
    mkdir -p "$dir"
    coredns_main >"$dir/main.go"
    build_one coredns "$COREDNS_VERSION" "$COREDNS_BIN" github.com/coredns/coredns . "-s -w"
}

# ----------------------------------------------------------------------------- stripe-mock
build_stripe_mock() {
    if [ -n "${TEST_ASSET_STRIPE_MOCK:-}" ]; then
        [ -x "$TEST_ASSET_STRIPE_MOCK" ] || die "TEST_ASSET_STRIPE_MOCK=$TEST_ASSET_STRIPE_MOCK is not an executable file"
        log "stripe-mock: using $TEST_ASSET_STRIPE_MOCK (user-supplied)"; return
    fi
    if [ -x "$STRIPE_MOCK_BIN" ]; then log "stripe-mock $STRIPE_MOCK_VERSION: cached at $STRIPE_MOCK_BIN"; return; fi
    need_go
    local dir="$BUILD_ROOT/stripe-mock-$STRIPE_MOCK_VERSION" out
    out="$(dirname "$STRIPE_MOCK_BIN")"
    scratch_module "$dir" agent-saga.local/build/stripe-mock <<EOF
require github.com/stripe/stripe-mock $STRIPE_MOCK_VERSION
EOF
    mkdir -p "$out"
    # timed_build dies (with the log's tail) when the build fails; the hint says how to fix it.
    log "if this fails: the Go module proxy must be reachable (GOPROXY=$("$GO" env GOPROXY)), or set TEST_ASSET_STRIPE_MOCK to a stripe-mock binary"
    (cd "$dir" && timed_build stripe-mock "$STRIPE_MOCK_VERSION" "$out" \
        "$GO" build -ldflags "-s -w" -o "$out/stripe-mock.tmp" github.com/stripe/stripe-mock)
    mv -f "$out/stripe-mock.tmp" "$STRIPE_MOCK_BIN"
}

# -------------------------------------------------------------------------------- promtool
# Prometheus's rule checker and rule unit tester. Module v0.3MM.P is release 3.MM.P.
# `remove_all_sd` leaves out the service discovery plugins (cloud SDKs, most of the build)
# that `check rules` and `test rules` never use.
build_promtool() {
    local rel="${PROMETHEUS_VERSION#v0.}" pkg=github.com/prometheus/common/version
    rel="${rel:0:1}.$((10#${rel:1:2})).${rel#*.}"
    if ! user_asset TEST_ASSET_PROMTOOL promtool >/dev/null && [ ! -x "$PROMTOOL_BIN" ]; then
        need_go
        log "if this fails: the Go module proxy must be reachable (GOPROXY=$("$GO" env GOPROXY)), or set TEST_ASSET_PROMTOOL to a promtool binary"
    fi
    build_one promtool "$PROMETHEUS_VERSION" "$PROMTOOL_BIN" github.com/prometheus/prometheus \
        github.com/prometheus/prometheus/cmd/promtool \
        "-s -w -X $pkg.Version=$rel -X $pkg.Revision=$PROMETHEUS_VERSION -X $pkg.Branch=HEAD" remove_all_sd
}

# One build at a time per cache (two `make test` runs at once would otherwise race).
exec 9>"$CACHE/.build.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 7200 9 || die "timed out waiting for another build holding $CACHE/.build.lock"
fi

for c in "${COMPONENTS[@]}"; do "build_$c"; done

if [ $PRINT_PATHS = 1 ]; then
    printf 'etcd=%s\n' "$(user_asset TEST_ASSET_ETCD etcd || echo "$ETCD_BIN")"
    printf 'kube-apiserver=%s\n' "$(user_asset TEST_ASSET_KUBE_APISERVER kube-apiserver || echo "$KUBE_APISERVER_BIN")"
    printf 'kubectl=%s\n' "$(user_asset TEST_ASSET_KUBECTL kubectl || echo "$KUBECTL_BIN")"
    printf 'helm=%s\n' "$(user_asset TEST_ASSET_HELM helm || echo "$HELM_BIN")"
    for c in "${NODE_COMMANDS[@]}"; do
        printf '%s=%s\n' "$c" "$(user_asset "$(asset_var "$c")" "$c" || echo "$KUBE_BIN_DIR/$c")"
    done
    printf 'coredns=%s\n' "$(user_asset TEST_ASSET_COREDNS coredns || echo "$COREDNS_BIN")"
    printf 'stripe-mock=%s\n' "${TEST_ASSET_STRIPE_MOCK:-$STRIPE_MOCK_BIN}"
    printf 'promtool=%s\n' "${TEST_ASSET_PROMTOOL:-$PROMTOOL_BIN}"
fi
