#!/usr/bin/env bash
# instructions.sh: CPU instructions thaw spends per proxied warm request, counted exactly by
# valgrind's callgrind (no timing noise, unlike warm.sh on a shared VM). Runs `thaw local` under
# callgrind twice, with N and 3N requests (hey, 8 connections, loopback), and prints
# (Ir(3N) - Ir(N)) / 2N, so start-up and shutdown cancel out. The replica runs natively.
# Knobs: N (5000), REQ_PATH (/healthz). Needs valgrind (installed if missing). ~2 minutes.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
N=${N:-5000}
REQ_PATH=${REQ_PATH:-/healthz}
HOST=warm.default.example.com
lt_init instructions
need valgrind
need callgrind_annotate valgrind
need hey
write_configmaps "$OUT"
local_yaml "$OUT" "$(service_yaml warm \
    '{autoscaling.knative.dev/min-scale: "1", autoscaling.knative.dev/max-scale: "1"}' \
    '["--response-delay", "0s"]')"

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
    hey -n "$1" -c 8 -host "$HOST" "http://$data$REQ_PATH" | grep -E '\[[0-9]+\]' >&2
    kill -INT "$vp"
    wait "$vp" || true
    callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }'
}

a=$(run "$N")
b=$(run $((3 * N)))
log "instructions: $a for $N requests, $b for $((3 * N))"
echo "instructions per request: $(( (b - a) / (2 * N) ))"
