# shellcheck shell=bash disable=SC2015
# Shared helpers of the load-test scripts. Source it: `. "$(dirname "$0")/lib.sh"`.
#
# Contract:
# - `lt_init NAME` makes a fresh run folder loadtests/out/NAME/ (OUT; `LT_OUT=DIR` puts it in
#   DIR/NAME instead), installs the EXIT trap that stops every process started through
#   `lt_bg`/`start_thaw` (by PID: SIGTERM, then SIGKILL after 10 s), and builds
#   target/release/thaw if it is missing. `THAW=PATH` runs that thaw binary instead (no build).
# - `start_thaw` runs `thaw local` on ports the kernel picks (127.0.0.1:0), reads them back from
#   its log, and waits (at most 30 s) for /healthz. It sets THAW_PID, DATA (host:port of the data
#   port) and ADMIN (host:port of the admin port).
# - Everything is loopback only; nothing here opens a non-local address.

set -euo pipefail

LT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$LT_DIR/.." && pwd)"
THAW=${THAW:-"$REPO/target/release/thaw"}
LT_PIDS=()

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# need CMD [DEBIAN_PACKAGE]: installs the package with apt-get if CMD is missing.
need() {
    local cmd=$1 pkg=${2:-$1}
    command -v "$cmd" >/dev/null 2>&1 && return 0
    log "installing $pkg (for $cmd)"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$pkg" >/dev/null 2>&1 ||
        { $sudo apt-get update -q >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$pkg" >/dev/null; } ||
        die "cannot install $pkg"
    command -v "$cmd" >/dev/null 2>&1 || die "$pkg installed but $cmd not found"
}

# A second-opinion load generator: hey (Debian package), else ab (apache2-utils). Prints its name.
second_opinion_tool() {
    if command -v hey >/dev/null 2>&1 || apt-get install -y -q hey >/dev/null 2>&1; then
        echo hey
    else
        need ab apache2-utils
        log "hey is not available: using ab (apache2-utils) as the second opinion"
        echo ab
    fi
}

lt_init() {
    local name=$1
    OUT="${LT_OUT:-$REPO/loadtests/out}/$name"
    rm -rf "$OUT"
    mkdir -p "$OUT"
    trap lt_cleanup EXIT
    trap 'exit 130' INT TERM
    need curl
    need python3
    if [ ! -x "$THAW" ] || [ -n "${LT_REBUILD:-}" ]; then
        [ "$THAW" = "$REPO/target/release/thaw" ] ||
            die "THAW=$THAW is not an executable (unset THAW to build target/release/thaw)"
        log "building thaw (cargo build --release): about 15 minutes on 2 cores in a fresh" \
            "clone, seconds once built; THAW=/path/to/thaw uses a binary you already have"
        (cd "$REPO" && cargo build --release -q) || die "cargo build --release failed"
    fi
    log "thaw binary: $THAW"
}

# lt_bg CMD...: starts CMD in the background and remembers its PID for the cleanup. Sets LAST_PID.
lt_bg() {
    "$@" &
    LAST_PID=$!
    LT_PIDS+=("$LAST_PID")
}

# Stops every process this script started, newest first: SIGTERM, wait up to 10 s, SIGKILL.
lt_cleanup() {
    local rc=$?
    set +e
    local i pid
    for ((i = ${#LT_PIDS[@]} - 1; i >= 0; i--)); do
        pid=${LT_PIDS[$i]}
        kill -0 "$pid" 2>/dev/null || continue
        kill -TERM "$pid" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            log "pid $pid did not stop on SIGTERM: SIGKILL"
            kill -KILL "$pid" 2>/dev/null
        fi
        wait "$pid" 2>/dev/null
    done
    exit "$rc"
}

# write_config DIR ACTIVATOR_EXTRA AUTOSCALER_EXTRA: writes the three ConfigMaps into DIR.
# Extra arguments are YAML `key: "value"` lines (newline separated) added to `data:`.
write_configmaps() {
    local dir=$1 act_extra=${2:-} as_extra=${3:-}
    mkdir -p "$dir"
    {
        printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config-activator, namespace: knative-serving}\ndata:\n'
        printf '  drain-delay: "0s"\n  drain-timeout: "10s"\n'
        [ -z "$act_extra" ] || printf '%s\n' "$act_extra" | sed 's/^/  /'
    } >"$dir/config-activator.yaml"
    {
        printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config-autoscaler, namespace: knative-serving}\ndata:\n'
        printf '  allow-zero-initial-scale: "true"\n'
        [ -z "$as_extra" ] || printf '%s\n' "$as_extra" | sed 's/^/  /'
    } >"$dir/config-autoscaler.yaml"
    printf 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: config-defaults, namespace: knative-serving}\ndata: {}\n' \
        >"$dir/config-defaults.yaml"
}

# service_yaml NAME ANNOTATIONS_FLOW_MAP SAMPLE_APP_ARGS_FLOW_LIST [PORT_NAME]: one Service entry
# of local.yaml; PORT_NAME is http1 (the default) or h2c (the replica is reached over h2c).
# e.g. service_yaml hello '{autoscaling.knative.dev/min-scale: "1"}' '["--response-delay", "10ms"]'
service_yaml() {
    cat <<EOF
  - apiVersion: serving.knative.dev/v1
    kind: Service
    metadata: {name: $1, namespace: default}
    spec:
      template:
        metadata:
          annotations: $2
        spec:
          containerConcurrency: 0
          containers:
            - command: [thaw, sample-app]
              args: $3
              env: [{name: TARGET, value: $1}]
              ports: [{name: ${4:-http1}}]
EOF
}

# local_yaml DIR SERVICES_YAML: writes DIR/local.yaml naming the ConfigMaps next to it.
local_yaml() {
    {
        printf 'domain: example.com\nconfigMaps:\n  autoscaler: config-autoscaler.yaml\n'
        printf '  defaults: config-defaults.yaml\n  activator: config-activator.yaml\nservices:\n'
        printf '%s\n' "$2"
    } >"$1/local.yaml"
}

# start_thaw CONFIG_DIR: starts `thaw local` with CONFIG_DIR/local.yaml; logs to CONFIG_DIR/thaw.log.
start_thaw() {
    local dir=$1
    : >"$dir/thaw.log"
    lt_bg "$THAW" local --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
        --config "$dir/local.yaml" 2>>"$dir/thaw.log" >>"$dir/thaw.log"
    THAW_PID=$LAST_PID
    local line=""
    for _ in $(seq 300); do
        kill -0 "$THAW_PID" 2>/dev/null || { cat "$dir/thaw.log" >&2; die "thaw local exited"; }
        line=$(grep -m1 'thaw local listening' "$dir/thaw.log" || true)
        [ -n "$line" ] && break
        sleep 0.1
    done
    [ -n "$line" ] || die "thaw local did not log its ports within 30 s (see $dir/thaw.log)"
    # strip ANSI colours, then pick data=... admin=...
    line=$(printf '%s' "$line" | sed 's/\x1b\[[0-9;]*m//g')
    DATA=$(printf '%s' "$line" | sed -n 's/.*data=\([0-9.:]*\).*/\1/p')
    ADMIN=$(printf '%s' "$line" | sed -n 's/.*admin=\([0-9.:]*\).*/\1/p')
    [ -n "$DATA" ] && [ -n "$ADMIN" ] || die "cannot read the ports from: $line"
    wait_until 30 "thaw /healthz" curl -sf "http://$ADMIN/healthz" -o /dev/null
    log "thaw local pid $THAW_PID: data $DATA, admin $ADMIN, log $dir/thaw.log"
}

# wait_until SECONDS WHAT CMD...: polls CMD every 0.1 s until it succeeds; dies after SECONDS.
wait_until() {
    local secs=$1 what=$2
    shift 2
    local deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || die "timed out after ${secs}s waiting for $what"
        sleep 0.1
    done
}

# revisions: the /revisions JSON.
revisions() { curl -sf "http://$ADMIN/revisions"; }

# metric_sum NAME: the sum over all series of one metric sample name in /metrics (0 if absent).
metric_sum() {
    curl -sf "http://$ADMIN/metrics" | awk -v n="$1" '
        $1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.9f\n", s + 0 }'
}

# rss_kib PID: VmRSS of PID in KiB.
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# machine: one line describing the machine.
machine() {
    printf 'nproc=%s, kernel %s, %s, %s GiB RAM' "$(nproc)" "$(uname -r)" \
        "$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)" \
        "$(awk '/MemTotal/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)"
}

# free_port: a port on 127.0.0.1 that was free a moment ago (for tools that cannot take port 0).
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# to_ms VALUE UNIT: a wrk/hey latency in ms.
to_ms() {
    awk -v v="$1" -v u="$2" 'BEGIN {
        f = (u == "us") ? 0.001 : (u == "ms") ? 1 : (u == "s" || u == "secs") ? 1000 : (u == "m") ? 60000 : -1
        if (f < 0) { print "nan"; exit }
        printf "%.3f\n", v * f }'
}

# wrk_summary FILE: "req/s p50_ms p99_ms errors" from `wrk --latency` output.
wrk_summary() {
    local f=$1 rps p50 p99 errs
    rps=$(awk '/^Requests\/sec:/ { print $2 }' "$f")
    p50=$(awk '$1 == "50%" { print $2 }' "$f" | sed -E 's/([0-9.]+)([a-z]+)/\1 \2/')
    p99=$(awk '$1 == "99%" { print $2 }' "$f" | sed -E 's/([0-9.]+)([a-z]+)/\1 \2/')
    errs=$(awk '/Non-2xx or 3xx responses:/ { n += $NF }
                /Socket errors:/ { gsub(",", ""); n += $4 + $6 + $8 + $10 }
                END { print n + 0 }' "$f")
    # shellcheck disable=SC2086
    printf '%s %s %s %s\n' "$rps" "$(to_ms $p50)" "$(to_ms $p99)" "$errs"
}

# hey_summary FILE: "req/s p50_ms p99_ms errors" from hey's text output (errors: non-2xx +
# failures). A percentile hey did not print is "n/a" (hey 0.1.4 prints a bogus "0% in 0" line
# instead of 99% when there are fewer than 100 answers).
hey_summary() {
    local f=$1
    awk '
        BEGIN { p50 = "n/a"; p99 = "n/a" }
        /Requests\/sec:/ { rps = $2 }
        /^ +50% in / { p50 = sprintf("%.3f", $3 * 1000) }
        /^ +99% in / { p99 = sprintf("%.3f", $3 * 1000) }
        /^Status code distribution:/ { s = 1; next }
        /^Error distribution:/ { s = 0; e = 1; next }
        s && /\[[0-9]+\]/ { code = $1; gsub(/[\[\]]/, "", code); if (code !~ /^2/) err += $2 }
        e && /\[[0-9]+\]/ { n = $1; gsub(/[\[\]]/, "", n); err += n }
        END { printf "%s %s %s %d\n", rps, p50, p99, err }' "$f"
}

# nginx_head DIR WORKERS: the start of an nginx.conf the scripts share (WORKERS workers, pid,
# error log and temp paths under DIR, no access log), open inside `http {`.
nginx_head() {
    cat <<EOF
worker_processes $2;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $1/tmp/body;
    proxy_temp_path $1/tmp/proxy;
    fastcgi_temp_path $1/tmp/fastcgi;
    uwsgi_temp_path $1/tmp/uwsgi;
    scgi_temp_path $1/tmp/scgi;
EOF
}

# h2load_summary FILE LOG: "req/s p50_ms p99_ms errors" from h2load's output and its
# --log-file (one line per request: start us, status, duration us; h2load prints no
# percentiles itself). Errors: failed + errored + timed-out requests, and non-2xx answers.
h2load_summary() {
    local rps errs pct
    rps=$(awk '/^finished in/ { gsub(",", ""); print $4 }' "$1")
    errs=$(awk '/^requests:/ { gsub(",", ""); print $10 + $12 + $14 }' "$1")
    pct=$(awk -F'\t' '$2 !~ /^2/ { bad++ } { print $3 }
        END { print bad + 0 > "/dev/stderr" }' "$2" 2>"$2.bad" | sort -n | awk '
        { v[NR] = $1 } END {
            if (NR == 0) { print "n/a n/a"; exit }
            i50 = int(NR * 0.50); if (i50 < 1) i50 = 1
            i99 = int(NR * 0.99); if (i99 < 1) i99 = 1
            printf "%.3f %.3f\n", v[i50] / 1000, v[i99] / 1000 }')
    printf '%s %s %s\n' "$rps" "$pct" "$((errs + $(cat "$2.bad")))"
    rm -f "$2" "$2.bad"
}

# The noise check. A run records what share of the machine's CPU time went to anything but the
# benchmark: the hypervisor's steal (other VMs) plus every process other than OWN_PIDS (the
# script sets it: the proxies and the replica, space separated) and the script's own children
# (the load generator). A run with much of it measured the machine, not the proxies.
# cpu_ticks: a snapshot "TOTAL_TICKS BUSY_AND_STEAL_TICKS OWN_MS" for `others_pct_since`.
cpu_ticks() {
    local own
    # shellcheck disable=SC2086
    own=$(($(cpu_ms ${OWN_PIDS:-}) + $(children_ms)))
    awk -v own="$own" '/^cpu / { t = 0; for (i = 2; i <= 9; i++) t += $i
        print t, $2 + $3 + $4 + $7 + $8 + $9, own }' /proc/stat
}
# others_pct_since SNAPSHOT: percent of all CPU time since the snapshot used by others (see above).
others_pct_since() {
    # shellcheck disable=SC2086
    set -- $1 $(cpu_ticks)
    awk -v t0="$1" -v b0="$2" -v o0="$3" -v t1="$4" -v b1="$5" -v o1="$6" -v tck="$(getconf CLK_TCK)" \
        'BEGIN { d = (t1 - t0) * 1000 / tck; x = (b1 - b0) * 1000 / tck - (o1 - o0); if (x < 0) x = 0
                 printf "%.1f", (d > 0) ? 100 * x / d : 0 }'
}
# children_ms: CPU time (user + system, ms) of this script's children that have ended (cutime and
# cstime of the script's shell: wrk, hey, curl, ...).
children_ms() {
    local tck
    tck=$(getconf CLK_TCK)
    sed 's/.*) //' "/proc/$$/stat" | awk -v tck="$tck" '{ printf "%d\n", ($14 + $15) * 1000 / tck }'
}

# cpu_ms PID...: user + system CPU time of the given processes so far, in ms (from /proc/PID/stat).
cpu_ms() {
    local tck total=0 p t
    tck=$(getconf CLK_TCK)
    for p in "$@"; do
        # fields after the ")" of the command name: utime is the 12th, stime the 13th
        t=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }') || t=0
        total=$((total + ${t:-0}))
    done
    echo $((total * 1000 / tck))
}
