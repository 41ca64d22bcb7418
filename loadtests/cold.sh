#!/usr/bin/env bash
# shellcheck disable=SC2015  # `test && test || die` is meant: die when the check fails
# cold.sh: N sequential true cold starts, and how much of each thaw adds.
#
# Why N distinct services: each service c01..cN starts at zero (initial-scale 0), so its first
# request is a true cold start (spawn, startup, readiness, forward) with no waiting in between.
# Scaling one service back to zero between requests would cost the stable window (>= 6 s) plus
# the scale-to-zero grace period each time, and would measure a revision thaw has already
# warmed (balancer, connection pool) once.
#
# Per request: the client-measured total (curl's time_total, connection setup included), the
# replica's spawn-to-ready time as the platform measured it (that revision's own series
# thaw_platform_replica_startup_seconds_sum, which only this cold start feeds), and the
# thaw-added part = total - spawn-to-ready. Spawn-to-ready includes the readiness probe's
# detection delay, so thaw-added slightly under-counts what thaw costs (see docs/benchmarks.md).
#
# Knobs (environment): N (20), STARTUP_DELAY (0s: the replica's own --startup-delay),
# RESPONSE_DELAY (0s), REQ_PATH (/: the sample app's hello; note that it always waits one tokio
# timer tick, ~1 ms, even at --response-delay 0s, while /healthz answers at once). Run time ~ N * (STARTUP_DELAY + 0.3 s) + 5 s.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

N=${N:-20}
STARTUP_DELAY=${STARTUP_DELAY:-0s}
RESPONSE_DELAY=${RESPONSE_DELAY:-0s}
REQ_PATH=${REQ_PATH:-/}
[ "$N" -ge 1 ] && [ "$N" -le 200 ] || die "N must be 1..200"

lt_init cold
write_configmaps "$OUT"
services=""
for i in $(seq -w 1 "$N"); do
    services+="$(service_yaml "c$i" '{autoscaling.knative.dev/initial-scale: "0"}' \
        "[\"--startup-delay\", \"$STARTUP_DELAY\", \"--response-delay\", \"$RESPONSE_DELAY\"]")"$'\n'
done
local_yaml "$OUT" "$services"
start_thaw "$OUT"

# Every revision known to the activator, cold (no replica), none wanted: the state a real idle
# revision is in. (`desired` stays -1 for a revision that starts at zero: the scaler publishes
# a scale state only when its decision changes.)
all_cold() {
    revisions | python3 -c '
import json, sys
rs = [r for r in json.load(sys.stdin)["revisions"] if r["name"].startswith("c")]
sys.exit(0 if len(rs) == int(sys.argv[1]) and all((r["desired"] or 0) <= 0 and r["state"] == "cold" for r in rs) else 1)' "$N"
}
wait_until 30 "all $N revisions cold" all_cold

# startup_of REV: that revision's spawn-to-ready sum and count ("sum count").
startup_of() {
    curl -sf "http://$ADMIN/metrics" | awk -v r="revision=\"$1\"" '
        /^thaw_platform_replica_startup_seconds_sum\{/ && index($0, r) { s = $NF }
        /^thaw_platform_replica_startup_seconds_count\{/ && index($0, r) { c = $NF }
        END { printf "%s %s\n", s + 0, c + 0 }'
}

# phases_of REV: that revision's cold-start phase sums ("poke_to_decision ready_to_first_byte",
# seconds). Each phase series carries the revision's labels (namespace, revision, phase) and only
# this cold start feeds them; the deltas around the request are taken anyway.
phases_of() {
    curl -sf "http://$ADMIN/metrics" | awk -v r="revision=\"$1\"" '
        /^thaw_activator_cold_start_phase_seconds_sum\{/ && index($0, r) && /phase="poke_to_decision"/ { a = $NF }
        /^thaw_activator_cold_start_phase_seconds_sum\{/ && index($0, r) && /phase="ready_to_first_byte"/ { b = $NF }
        END { printf "%s %s\n", a + 0, b + 0 }'
}

RES="$OUT/results.tsv"
printf 'service\tstatus\ttotal_ms\tstartup_ms\tthaw_added_ms\tserver_timing_ms\tpoke_to_decision_ms\tready_to_first_byte_ms\n' >"$RES"
for i in $(seq -w 1 "$N"); do
    svc="c$i"
    rev="$svc-00001"
    read -r s0 c0 < <(startup_of "$rev")
    read -r pd0 rf0 < <(phases_of "$rev")
    [ "$c0" = 0 ] || die "$rev already started before its first request"
    out=$(curl -s -o "$OUT/body-$svc" -D "$OUT/headers-$svc" -w '%{http_code} %{time_total}' \
        --max-time 60 -H "Host: $svc.default.example.com" "http://$DATA$REQ_PATH")
    read -r code total <<<"$out"
    # The platform records spawn-to-ready before the endpoint is published, so it is there by
    # now; poll briefly anyway rather than race.
    deadline=$((SECONDS + 5))
    while read -r s1 c1 < <(startup_of "$rev"); [ "$c1" = 0 ] && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.05
    done
    [ "$c1" = 1 ] || die "$rev: expected exactly one replica start, metrics say $c1"
    read -r pd1 rf1 < <(phases_of "$rev")
    st=$(tr -d '\r' <"$OUT/headers-$svc" | sed -n 's/^server-timing: cold-start;dur=//Ip' | head -1)
    awk -v s="$svc" -v code="$code" -v t="$total" -v a="$s0" -v b="$s1" -v st="${st:--}" \
        -v pd="$pd0 $pd1" -v rf="$rf0 $rf1" 'BEGIN {
        split(pd, p, " "); split(rf, f, " ")
        printf "%s\t%s\t%.3f\t%.3f\t%.3f\t%s\t%.3f\t%.3f\n", s, code, t * 1000, (b - a) * 1000,
            (t - (b - a)) * 1000, st, (p[2] - p[1]) * 1000, (f[2] - f[1]) * 1000 }' >>"$RES"
    [ "$code" = 200 ] || log "$svc answered $code"
    tail -1 "$RES" >&2
done

{
    echo
    echo "cold.sh: N=$N sequential cold starts (distinct services at initial-scale 0); $(machine)"
    echo "replica: thaw sample-app --startup-delay $STARTUP_DELAY --response-delay $RESPONSE_DELAY; request path $REQ_PATH"
    echo
    python3 - "$RES" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
ok = [r for r in rows if r["status"] == "200"]
def q(xs, p):  # nearest-rank percentile
    xs = sorted(xs)
    return xs[max(0, min(len(xs) - 1, -(-len(xs) * p // 100) - 1))]
print(f"{len(ok)}/{len(rows)} answered 200")
print()
print("| ms | median | p90 | max |")
print("|---|---|---|---|")
for col, label in [("total_ms", "total (client)"), ("startup_ms", "replica spawn-to-ready"),
                   ("thaw_added_ms", "thaw-added (total - spawn-to-ready)"),
                   ("poke_to_decision_ms", "of which: poke to scale decision"),
                   ("ready_to_first_byte_ms", "of which: ready to first byte (replica's 1st answer)")]:
    xs = [float(r[col]) for r in ok]
    if xs:
        print(f"| {label} | {statistics.median(xs):.3f} | {q(xs, 90):.3f} | {max(xs):.3f} |")
xs = [float(r["thaw_added_ms"]) for r in ok]
if xs:
    m = statistics.median(xs)
    print()
    print(f"target thaw-added median < 5 ms: {'met' if m < 5 else 'MISSED'} ({m:.3f} ms)")
PY
} | tee "$OUT/summary.md"
