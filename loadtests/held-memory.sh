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
# Knobs (environment): HELD (10000), STARTUP_DELAY (40s; 10..55 s, long enough to open HELD
# connections). Run time ~ STARTUP_DELAY + 15 s.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

HELD=${HELD:-10000}
STARTUP_DELAY=${STARTUP_DELAY:-40s}
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
local_yaml "$OUT" "$(service_yaml slow '{autoscaling.knative.dev/initial-scale: "0", autoscaling.knative.dev/max-scale: "1"}' \
    "[\"--startup-delay\", \"$STARTUP_DELAY\"]")"
start_thaw "$OUT"

held_now() { revisions | python3 -c 'import json, sys; print(json.load(sys.stdin)["held"])'; }
wait_until 30 "slow revision listed" test "$(held_now)" = 0
sleep 1
RSS0=$(rss_kib "$THAW_PID")
log "thaw RSS before: $RSS0 KiB"

T0=$SECONDS
log "hey -n $HELD -c $HELD -> slow (replica starts in $STARTUP_DELAY)"
lt_bg hey -n "$HELD" -c "$HELD" -t $((SECS + 60)) -host slow.default.example.com "http://$DATA/" \
    >"$OUT/hey.txt" 2>&1
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
    echo "held-memory.sh: $HELD requests held on a revision whose replica starts in $STARTUP_DELAY; $(machine)"
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
    grep -A10 '^Error distribution' "$OUT/hey.txt" || true
} | tee "$OUT/summary.md"
