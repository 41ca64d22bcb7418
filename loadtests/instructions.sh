#!/usr/bin/env bash
# instructions.sh: CPU instructions thaw spends per proxied warm request, counted exactly by
# valgrind's callgrind (no timing noise, unlike warm.sh on a shared VM). Runs `thaw local` under
# callgrind twice, with N and 3N requests (hey, 8 connections, loopback), and prints
# (Ir(3N) - Ir(N)) / 2N, so start-up and shutdown cancel out. The replica runs natively.
# Knobs: N (5000), REQ_PATH (/healthz), PROTO (http1: hey, 8 connections; h2c: h2load over h2c
# with prior knowledge, 8 connections x 8 streams), UPSTREAM (http1 or h2c: the replica's port
# name, so what thaw speaks to it). Needs valgrind (installed if missing). ~2 minutes.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
N=${N:-5000}
REQ_PATH=${REQ_PATH:-/healthz}
PROTO=${PROTO:-http1}
UPSTREAM=${UPSTREAM:-http1}
case $PROTO in http1 | h2c) ;; *) die "PROTO must be http1 or h2c (not $PROTO)" ;; esac
case $UPSTREAM in http1 | h2c) ;; *) die "UPSTREAM must be http1 or h2c (not $UPSTREAM)" ;; esac
HOST=warm.default.example.com
lt_init instructions
need valgrind
need callgrind_annotate valgrind
need hey
[ "$PROTO" = http1 ] || need h2load nghttp2-client
write_configmaps "$OUT"
local_yaml "$OUT" "$(service_yaml warm \
    '{autoscaling.knative.dev/min-scale: "1", autoscaling.knative.dev/max-scale: "1"}' \
    '["--response-delay", "0s"]' "$UPSTREAM")"

run() {  # requests -> total instructions
    local data admin line out="$OUT/callgrind.$1"
    : >"$OUT/thaw.log"
    valgrind --tool=callgrind --callgrind-out-file="$out" --trace-children=no \
        "$THAW" local --listen 127.0.0.1:0 --admin-listen 127.0.0.1:0 \
        --config "$OUT/local.yaml" >>"$OUT/thaw.log" 2>&1 &
    local vp=$!
    LT_PIDS+=("$vp")
    for _ in $(seq 600); do
        line=$(sed 's/\x1b\[[0-9;]*m//g' "$OUT/thaw.log" | grep -m1 'thaw local listening' || true)
        [ -n "$line" ] && break
        sleep 0.1
    done
    [ -n "$line" ] || die "thaw did not start under valgrind (see $OUT/thaw.log)"
    data=$(printf '%s' "$line" | sed -n 's/.*data=\([0-9.:]*\).*/\1/p')
    wait_until 60 "the warm replica" curl -sf -H "Host: $HOST" "http://$data$REQ_PATH"
    if [ "$PROTO" = h2c ]; then
        h2load -n "$1" -c 8 -m 8 -H ":authority: $HOST" "http://$data$REQ_PATH" |
            grep -E '^(requests|status codes):' >&2
    else
        hey -n "$1" -c 8 -host "$HOST" "http://$data$REQ_PATH" | grep -E '\[[0-9]+\]' >&2
    fi
    kill -INT "$vp"
    wait "$vp" || true
    callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}

a=$(run "$N")
b=$(run $((3 * N)))
log "instructions: $a for $N requests, $b for $((3 * N))"
echo "instructions per request ($PROTO client, $UPSTREAM upstream): $(( (b - a) / (2 * N) ))"
