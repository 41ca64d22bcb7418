#!/usr/bin/env bash
# shellcheck disable=SC2015  # `test && test || die` is meant: die when the check fails
# held-memory.sh: thaw's RSS growth with HELD (10,000) requests held on a slow-to-start revision.
#
# One service `slow` starts at zero (max-scale 1: the autoscaler would otherwise ask for
# 10000/70 replicas, all slow, which costs the machine but not thaw's RSS); its replica takes
# STARTUP_DELAY (40 s) to listen. Not 60 s: `thaw local`'s platform kills a replica not ready
# within 60 s (LocalOptions::startup_timeout, not configurable), and the revision then fails. The
# generated config-activator allows the load (queue-depth, max-held-requests, max-connections
# above HELD). hey opens HELD connections with one request each; they are all held while the
# replica starts. The script reads thaw's VmRSS (/proc/PID/status) before any request and once
# /revisions reports all HELD held (then once more a second later, taking the larger), prints
# KiB per held request, then lets the replica come up and checks every request got a 200.
#
# Open files: thaw raises its own soft limit to the hard limit; the client needs one descriptor
# per held connection too, so the script raises `ulimit -n` to the hard limit for itself and
# its children, and refuses to run if that is below HELD + 500.
#
# REUSE=1 holds the requests on reused keep-alive connections instead: a second service `warm`
# (one replica) answers one request on each connection first (loadtests/hold_reused.py), so the
# held request is a connection's second one. thaw holds a new connection's first request before
# hyper reads it (src/activator/early.rs); a later request is held after hyper has read it, with
# hyper's per-connection buffers alive. The figure includes the connection either way.
#
# Knobs (environment): HELD (10000), STARTUP_DELAY (40s; 10..55 s, long enough to open HELD
# connections), REUSE (0). Run time ~ STARTUP_DELAY + 15 s.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

HELD=${HELD:-10000}
STARTUP_DELAY=${STARTUP_DELAY:-40s}
REUSE=${REUSE:-0}
[ "$HELD" -ge 1 ] && [ "$HELD" -le 40000 ] || die "HELD must be 1..40000"
SECS=${STARTUP_DELAY%s}
[[ "$SECS" =~ ^[0-9]+$ ]] && [ "$SECS" -ge 10 ] && [ "$SECS" -le 55 ] ||
    die "STARTUP_DELAY must be whole seconds in 10..55 (e.g. 40s)"

lt_init held-memory
need hey
ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -ge $((HELD + 500)) ] ||
    die "open-files hard limit $(ulimit -Hn) < HELD + 500: raise it (e.g. /etc/security/limits.conf) or lower HELD"

LIMIT=$((HELD * 2 + 1000))
# queue-depth (per revision) must stay below max-held-requests (all revisions).
write_configmaps "$OUT" "queue-depth: \"$((HELD + 1000))\"
max-held-requests: \"$LIMIT\"
max-connections: \"$LIMIT\""
SERVICES=$(service_yaml slow '{autoscaling.knative.dev/initial-scale: "0", autoscaling.knative.dev/max-scale: "1"}' \
    "[\"--startup-delay\", \"$STARTUP_DELAY\"]")
if [ "$REUSE" = 1 ]; then
    SERVICES="$SERVICES
$(service_yaml warm '{autoscaling.knative.dev/min-scale: "1", autoscaling.knative.dev/max-scale: "1"}' '[]')"
fi
local_yaml "$OUT" "$SERVICES"
start_thaw "$OUT"

held_now() { revisions | python3 -c 'import json, sys; print(json.load(sys.stdin)["held"])'; }
wait_until 30 "slow revision listed" test "$(held_now)" = 0
warm_ready() {
    revisions | python3 -c '
import json, sys
print(sum(r["ready"]["count"] for r in json.load(sys.stdin)["revisions"] if r["name"] == "warm-00001"))'
}
[ "$REUSE" = 1 ] && wait_until 30 "the warm replica" test "$(warm_ready)" = 1
sleep 1
RSS0=$(rss_kib "$THAW_PID")
log "thaw RSS before: $RSS0 KiB"

T0=$SECONDS
if [ "$REUSE" = 1 ]; then
    log "hold_reused.py: $HELD connections, one request to warm each, then one to slow (replica starts in $STARTUP_DELAY)"
    rm -f "$OUT/idle" "$OUT/go"
    lt_bg python3 "$(dirname "$0")/hold_reused.py" --addr "$DATA" --conns "$HELD" \
        --warm-host warm.default.example.com --cold-host slow.default.example.com \
        --ready-file "$OUT/idle" --go-file "$OUT/go" --timeout $((SECS + 120)) >"$OUT/hey.txt" 2>&1
    wait_until 120 "$HELD kept-alive connections" test -e "$OUT/idle"
    sleep 1
    RSS_IDLE=$(rss_kib "$THAW_PID")
    log "thaw RSS with $HELD idle kept-alive connections: $RSS_IDLE KiB"
    T0=$SECONDS
    touch "$OUT/go"
else
    log "hey -n $HELD -c $HELD -> slow (replica starts in $STARTUP_DELAY)"
    lt_bg hey -n "$HELD" -c "$HELD" -t $((SECS + 60)) -host slow.default.example.com "http://$DATA/" \
        >"$OUT/hey.txt" 2>&1
fi
HEY_PID=$LAST_PID

# All held: before the replica can start (leave it 3 s of margin).
H=0
while [ $((SECONDS - T0)) -lt $((SECS - 3)) ]; do
    H=$(held_now)
    [ "$H" -ge "$HELD" ] && break
    sleep 0.2
done
[ "$H" -ge "$HELD" ] || die "only $H of $HELD requests held after $((SECONDS - T0)) s"
OPEN_S=$((SECONDS - T0))
RSS1=$(rss_kib "$THAW_PID")
sleep 1
RSS1b=$(rss_kib "$THAW_PID")
[ "$RSS1b" -gt "$RSS1" ] && RSS1=$RSS1b
H2=$(held_now)
log "all $H held after ~${OPEN_S}s; thaw RSS $RSS1 KiB (held now $H2)"

log "waiting for the replica (up to $STARTUP_DELAY + 60 s) and for hey"
wait "$HEY_PID" || true
RSS2=$(rss_kib "$THAW_PID")
read -r _ P50 P99 ERRS < <(hey_summary "$OUT/hey.txt")
OK=$(awk '/^ +\[200\]/ { print $2 }' "$OUT/hey.txt")

{
    echo
    echo "held-memory.sh: $HELD requests held on a revision whose replica starts in $STARTUP_DELAY$([ "$REUSE" = 1 ] && echo ", each on a reused keep-alive connection"); $(machine)"
    echo "open-files limit (script and children): $(ulimit -n)"
    echo
    echo "| held | RSS before KiB | RSS all held KiB | growth KiB | KiB per held request | RSS after all answered KiB |"
    echo "|---|---|---|---|---|---|"
    awk -v h="$HELD" -v a="$RSS0" -v b="$RSS1" -v c="$RSS2" 'BEGIN {
        printf "| %d | %d | %d | %d | %.2f | %d |\n", h, a, b, b - a, (b - a) / h, c }'
    echo
    echo "answered: ${OK:-0} x 200, $ERRS errors; latency p50 $P50 ms, p99 $P99 ms (includes the $STARTUP_DELAY start)"
    awk -v a="$RSS0" -v b="$RSS1" -v h="$HELD" 'BEGIN {
        k = (b - a) / h; printf "target < 10 KiB per held request: %s (%.2f KiB)\n", (k < 10) ? "met" : "MISSED", k }'
    if [ "$REUSE" = 1 ]; then
        awk -v a="$RSS0" -v i="$RSS_IDLE" -v b="$RSS1" -v h="$HELD" 'BEGIN {
            printf "of which: %.2f KiB per idle kept-alive connection (RSS %d KiB with all idle), %.2f KiB per request held on one\n", (i - a) / h, i, (b - i) / h }'
    fi
    grep -A10 '^Error distribution' "$OUT/hey.txt" || true
} | tee "$OUT/summary.md"
