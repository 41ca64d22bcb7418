#!/usr/bin/env bash
# shellcheck disable=SC2015  # `test && test || die` is meant: die when the check fails
# burst.sh: N concurrent requests (one connection each) at a revision at zero.
#
# One service `burst` starts at zero (initial-scale 0). hey sends N requests at once on N
# connections (-n N -c N: every worker sends exactly one request); those that arrive while no
# replica exists are held, the first poke wakes the revision, and the held requests
# are released to the replica(s) the autoscaler asks for. Prints errors (non-2xx and transport
# failures), p50/p99/max latency, and what thaw did (requests held, replicas started, pokes).
#
# Why STARTUP_DELAY defaults to 2s: on 2 cores hey needs ~100-300 ms to open 1000 connections,
# while a replica with no startup delay is ready in ~5 ms, so most of the "burst at zero" would
# meet a warm replica (STARTUP_DELAY=0s shows that case). With 2 s every request is held, as the
# "requests were held" line confirms, and latency minus the replica's spawn-to-ready is what
# holding and releasing N requests cost.
#
# Knobs (environment): N (1000), STARTUP_DELAY (2s), RESPONSE_DELAY (10ms), TIMEOUT (30 s per
# request). The run is bounded by 2 * TIMEOUT + ~10 s.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

N=${N:-1000}
STARTUP_DELAY=${STARTUP_DELAY:-2s}
RESPONSE_DELAY=${RESPONSE_DELAY:-10ms}
TIMEOUT=${TIMEOUT:-30}
[ "$N" -ge 1 ] && [ "$N" -le 10000 ] || die "N must be 1..10000"

lt_init burst
need hey
ulimit -n "$(ulimit -Hn)"
[ "$(ulimit -n)" -gt $((N + 100)) ] || die "open-files limit $(ulimit -n) too low for $N connections"

write_configmaps "$OUT"
APP_ARGS="[\"--startup-delay\", \"$STARTUP_DELAY\", \"--response-delay\", \"$RESPONSE_DELAY\"]"
# `warmref`: the same app kept warm (min-scale 1) for a baseline burst after the cold one.
local_yaml "$OUT" "$(service_yaml burst '{autoscaling.knative.dev/initial-scale: "0"}' "$APP_ARGS")
$(service_yaml warmref '{autoscaling.knative.dev/min-scale: "1"}' "$APP_ARGS")"
start_thaw "$OUT"

rev_field() {  # python expression on r, the burst revision
    revisions | python3 -c '
import json, sys
r = [r for r in json.load(sys.stdin)["revisions"] if r["name"] == "burst-00001"][0]
print(eval(sys.argv[1]))' "$1"
}
wait_until 30 "burst revision cold" test "$(rev_field 'r["state"]')" = cold

# Sample held/ready every 10 ms while hey runs (bounded by hey's lifetime), one process.
sample() {
    python3 - "$ADMIN" "$1" <<'PY'
import json, os, sys, time, urllib.request
admin, pid = sys.argv[1], int(sys.argv[2])
def alive():
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
while alive():
    try:
        d = json.load(urllib.request.urlopen(f"http://{admin}/revisions", timeout=2))
        r = [r for r in d["revisions"] if r["name"] == "burst-00001"][0]
        print(r["held"], r["ready"]["count"], flush=True)
    except Exception:
        pass
    time.sleep(0.01)
PY
}

log "hey -n $N -c $N -t $TIMEOUT -> burst (at zero)"
lt_bg hey -n "$N" -c "$N" -t "$TIMEOUT" -host burst.default.example.com "http://$DATA/" >"$OUT/hey.txt" 2>&1
HEY_PID=$LAST_PID
# In the background so a signal to this script is handled at once (bash defers traps while a
# foreground child runs).
lt_bg sample "$HEY_PID" >"$OUT/samples.txt"
SAMPLER_PID=$LAST_PID
wait "$HEY_PID" || true
wait "$SAMPLER_PID" || true

# Baseline: the same burst at a warm replica (what 1000 connections at once cost on this box
# without any cold start), after the cold burst so it cannot warm anything for it.
wait_until 30 "warmref ready" test "$(revisions | python3 -c '
import json, sys
print([r["ready"]["count"] for r in json.load(sys.stdin)["revisions"] if r["name"] == "warmref-00001"][0])')" -ge 1
log "hey -n $N -c $N -t $TIMEOUT -> warmref (warm, baseline)"
hey -n "$N" -c "$N" -t "$TIMEOUT" -host warmref.default.example.com "http://$DATA/" >"$OUT/hey-warm.txt" 2>&1 || true

read -r _ P50 P99 ERRS < <(hey_summary "$OUT/hey.txt")
OK=$(awk '/^ +\[200\]/ { print $2 }' "$OUT/hey.txt")
MAX=$(awk '/^ +Slowest:/ { printf "%.3f", $2 * 1000 }' "$OUT/hey.txt")
read -r _ WP50 WP99 WERRS < <(hey_summary "$OUT/hey-warm.txt")
WOK=$(awk '/^ +\[200\]/ { print $2 }' "$OUT/hey-warm.txt")
WMAX=$(awk '/^ +Slowest:/ { printf "%.3f", $2 * 1000 }' "$OUT/hey-warm.txt")
HELD_PEAK=$(awk '$1 > m { m = $1 } END { print m + 0 }' "$OUT/samples.txt")
COLD=$(curl -sf "http://$ADMIN/metrics" |
    awk '/^thaw_activator_cold_starts_total\{/ && /revision="burst-00001"/ { print $NF }')
HELD_TOTAL=$(curl -sf "http://$ADMIN/metrics" |
    awk '/^thaw_activator_hold_seconds_count\{/ && /revision="burst-00001"/ { print $NF }')
read -r STARTS FIRST_READY_MS < <(curl -sf "http://$ADMIN/metrics" | awk '
    /^thaw_platform_replica_startup_seconds_count\{/ && /revision="burst-00001"/ { c = $NF }
    /^thaw_platform_replica_startup_seconds_sum\{/ && /revision="burst-00001"/ { s = $NF }
    END { printf "%d %.1f\n", c, (c > 0) ? s / c * 1000 : 0 }')

{
    echo
    echo "burst.sh: $N concurrent requests at a revision at zero; $(machine)"
    echo "replica: thaw sample-app --startup-delay $STARTUP_DELAY --response-delay $RESPONSE_DELAY"
    echo
    echo "| revision | requests | 200 OK | errors | p50 ms | p99 ms | max ms |"
    echo "|---|---|---|---|---|---|---|"
    printf '| at zero (burst) | %s | %s | %s | %s | %s | %s |\n' "$N" "${OK:-0}" "$ERRS" "$P50" "$P99" "$MAX"
    printf '| warm baseline (warmref) | %s | %s | %s | %s | %s | %s |\n' "$N" "${WOK:-0}" "$WERRS" "$WP50" "$WP99" "$WMAX"
    echo
    echo "burst revision: ${HELD_TOTAL:-0} requests were held (thaw_activator_hold_seconds count);" \
        "held peak $HELD_PEAK in /revisions samples every 10 ms (a short cold start can fall between samples);" \
        "replicas started ${STARTS:-0} (mean spawn-to-ready $FIRST_READY_MS ms), cold starts (pokes) ${COLD:-0}"
    grep -A20 '^Error distribution' "$OUT/hey.txt" "$OUT/hey-warm.txt" || true
} | tee "$OUT/summary.md"
