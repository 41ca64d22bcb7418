#!/usr/bin/env bash
# shellcheck disable=SC2015  # `test && test || die` is meant: die when the check fails
# warm.sh: thaw vs nginx in front of the SAME warm replica, side by side in one run.
#
# One service `warm` (min-scale 1, max-scale 1: exactly one replica that stays) runs
# `thaw sample-app`. Its replica's address comes from /revisions; nginx (as many workers as thaw
# has runtime worker threads = nproc, upstream keepalive, access_log off) proxies to that same
# address. For each connection count, wrk runs against thaw then nginx (fixed duration), then
# hey (or ab if hey is unavailable) does the same as a second opinion. This is repeated ROUNDS
# times, alternating the two proxies and which of them goes first (odd rounds thaw, even rounds
# nginx), so drift in a shared VM favours neither; prints every run, then per tool and connection
# count the median of the per-round thaw/nginx ratios with its 95 % bootstrap interval; a row
# whose interval spans 1 is named as within the run's noise (more rounds are needed to tell the
# proxies apart there). Each run records the share of CPU time the hypervisor stole meanwhile
# (/proc/stat); a pair in which either run lost more than MAX_STEAL percent measured the host,
# not the proxies, and is left out of the medians (and counted).
#
# With hey, each round ends with a paced pair (PACE): hey held to the same offered load for both
# proxies, PACE x nginx's saturated hey req/s of that round. At saturation hey (Go, the heaviest
# process on the box) is the bottleneck and its own scheduling sets the tail for either proxy,
# so the saturated hey row is judged on req/s and the paced row on p99 at equal load (thaw must
# also serve at least 97 % of the offered rate); the saturated p99 is still printed.
#
# Knobs (environment): ROUNDS (9), DURATION (4s per run), CONNS ("32 64"), HEY_CONNS (64),
# RESPONSE_DELAY (0s), REQ_PATH (/; since 2026-11-23 the sample app's `/` answers at once at
# --response-delay 0s, as /healthz does, so both measure alike),
# WRK_THREADS (nproc), MAX_STEAL (2, percent), NGINX_HEADERS (bare: nginx forwards the client's
# headers and sets Host, the issue's baseline; forward: nginx also adds the two forwarding
# headers thaw local adds on every request, X-Forwarded-For and X-Forwarded-Proto (thaw local
# sends no sidecar headers: a replica has no queue sidecar); all: and an X-Request-Id both
# ways, as thaw does, from nginx's $request_id), REPLICA_THREADS (1: the replica serves on one thread; more, on that many
# runtime workers, so the replica is not the one serial stage every request passes),
# REQ_HEADERS (none: wrk sends Host only, hey its usual four; browser: every request also carries
# ten header fields a browser sends, User-Agent, Accept, Cookie and the like, ~450 bytes),
# PACE (0.75; 0 leaves the paced pair out), HOLD (unset; 1 stops after the set-up and keeps
# everything running for profiling by hand, addresses and PIDs in loadtests/out/warm/hold.env).
# Total run time ~ ROUNDS * (2*len(CONNS) + 4) * DURATION + 15 s (about 5 minutes by default).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ROUNDS=${ROUNDS:-9}
DURATION=${DURATION:-4s}
CONNS=${CONNS:-32 64}
HEY_CONNS=${HEY_CONNS:-64}
RESPONSE_DELAY=${RESPONSE_DELAY:-0s}
REPLICA_THREADS=${REPLICA_THREADS:-1}
REQ_PATH=${REQ_PATH:-/}
WRK_THREADS=${WRK_THREADS:-$(nproc)}
MAX_STEAL=${MAX_STEAL:-2}
NGINX_HEADERS=${NGINX_HEADERS:-bare}
PACE=${PACE:-0.75}
REQ_HEADERS=${REQ_HEADERS:-none}
HOST=warm.default.example.com
EXTRA=()
case $REQ_HEADERS in
    none) ;;
    browser)
        for h in "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko)" \
            "Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8" \
            "Accept-Encoding: gzip, deflate, br" "Accept-Language: en-US,en;q=0.9" \
            "Cache-Control: no-cache" "Cookie: session=0123456789abcdef0123456789abcdef; theme=dark" \
            "Referer: http://warm.default.example.com/" "Sec-Fetch-Mode: navigate" \
            "Upgrade-Insecure-Requests: 1" "DNT: 1"; do
            EXTRA+=(-H "$h")
        done
        ;;
    *) die "REQ_HEADERS must be none or browser (not $REQ_HEADERS)" ;;
esac

lt_init warm
need wrk
need nginx nginx-light
SECOND=$(second_opinion_tool)

write_configmaps "$OUT"
local_yaml "$OUT" "$(service_yaml warm \
    '{autoscaling.knative.dev/min-scale: "1", autoscaling.knative.dev/max-scale: "1"}' \
    "[\"--response-delay\", \"$RESPONSE_DELAY\", \"--threads\", \"$REPLICA_THREADS\"]")"
start_thaw "$OUT"

# The one replica, once ready.
replica_addr() {
    revisions | python3 -c '
import json, sys
for r in json.load(sys.stdin)["revisions"]:
    if r["name"] == "warm-00001" and r["ready"]["count"] == 1:
        print(r["ready"]["addresses"][0])'
}
wait_until 30 "the warm replica" test -n "$(replica_addr)"
UPSTREAM=$(replica_addr)
log "replica at $UPSTREAM"

# nginx: same replica, nproc workers, upstream keepalive, no access log.
case $NGINX_HEADERS in
    bare) NGINX_ADDS="" ;;
    forward | all)
        NGINX_ADDS='
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;'
        if [ "$NGINX_HEADERS" = all ]; then
            NGINX_ADDS="$NGINX_ADDS"'
            proxy_set_header X-Request-Id $request_id;
            add_header X-Request-Id $request_id;'
        fi
        ;;
    *) die "NGINX_HEADERS must be bare, forward or all (not $NGINX_HEADERS)" ;;
esac
NGX="$OUT/nginx"
mkdir -p "$NGX/tmp"
NGINX_PORT=$(free_port)
WORKERS=$(nproc)
cat >"$NGX/nginx.conf" <<EOF
worker_processes $WORKERS;
pid $NGX/nginx.pid;
error_log $NGX/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $NGX/tmp/body;
    proxy_temp_path $NGX/tmp/proxy;
    fastcgi_temp_path $NGX/tmp/fastcgi;
    uwsgi_temp_path $NGX/tmp/uwsgi;
    scgi_temp_path $NGX/tmp/scgi;
    upstream replica {
        server $UPSTREAM;
        keepalive 128;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://replica;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;$NGINX_ADDS
        }
    }
}
EOF
lt_bg nginx -p "$NGX" -c "$NGX/nginx.conf" -g 'daemon off;'
NGINX_PID=$LAST_PID
wait_until 10 "nginx" curl -sf -H "Host: $HOST" "http://127.0.0.1:$NGINX_PORT/"
log "nginx ($WORKERS workers) on 127.0.0.1:$NGINX_PORT -> $UPSTREAM"

# Both answer from the replica.
for url in "http://$DATA/" "http://127.0.0.1:$NGINX_PORT/"; do
    body=$(curl -sf -H "Host: $HOST" "$url") || die "$url failed"
    [ "$body" = "Hello from warm!" ] || die "$url answered: $body"
done

declare -A TARGET=([thaw]="http://$DATA$REQ_PATH" [nginx]="http://127.0.0.1:$NGINX_PORT$REQ_PATH")
NGINX_WORKERS=$(pgrep -P "$NGINX_PID" | tr '\n' ' ')
# shellcheck disable=SC2086
declare -A PIDS=([thaw]="$THAW_PID" [nginx]="$NGINX_PID $NGINX_WORKERS")
[ -n "$NGINX_WORKERS" ] || die "no nginx workers found"

# HOLD=1: stop after the set-up, leave both proxies and the replica running, and write their
# addresses and PIDs to $OUT/hold.env (for profiling by hand); Ctrl-C stops everything.
if [ -n "${HOLD:-}" ]; then
    {
        echo "THAW_URL=${TARGET[thaw]}"
        echo "NGINX_URL=${TARGET[nginx]}"
        echo "HOST=$HOST"
        echo "THAW_PID=$THAW_PID"
        echo "NGINX_PIDS=\"${PIDS[nginx]}\""
        echo "REPLICA_PID=$(pgrep -P "$THAW_PID" | head -1)"
        echo "UPSTREAM=$UPSTREAM"
    } >"$OUT/hold.env"
    log "HOLD: set-up done, see $OUT/hold.env; Ctrl-C stops"
    # In the background and waited for, so Ctrl-C runs the cleanup at once (bash runs a trap
    # only after the foreground command ends).
    lt_bg sleep infinity
    wait "$LAST_PID"
fi

# proxy_cpu NAME MS_BEFORE REQUESTS: the proxy's CPU microseconds per request over one run.
proxy_cpu() {
    # shellcheck disable=SC2086
    awk -v a="$2" -v b="$(cpu_ms ${PIDS[$1]})" -v n="$3" 'BEGIN { printf "%.1f", (n > 0) ? (b - a) * 1000 / n : 0 }'
}
ROWS=()

run_wrk() {  # name conns
    local f="$OUT/wrk-$1-c$2-r$ROUND.txt" cpu0 n ticks
    log "wrk -t$WRK_THREADS -c$2 -d$DURATION -> $1"
    # shellcheck disable=SC2086
    cpu0=$(cpu_ms ${PIDS[$1]})
    ticks=$(cpu_ticks)
    wrk -t"$WRK_THREADS" -c"$2" -d"$DURATION" --latency -H "Host: $HOST" ${EXTRA[@]+"${EXTRA[@]}"} "${TARGET[$1]}" >"$f"
    n=$(awk '/requests in/ { print $1 }' "$f")
    ROWS+=("wrk c$2 $1 $(wrk_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(steal_pct_since "$ticks")")
}

run_second() {  # name conns
    local f="$OUT/$SECOND-$1-c$2-r$ROUND.txt" cpu0 n ticks
    log "$SECOND -c$2 ($DURATION) -> $1"
    # shellcheck disable=SC2086
    cpu0=$(cpu_ms ${PIDS[$1]})
    ticks=$(cpu_ticks)
    if [ "$SECOND" = hey ]; then
        hey -z "$DURATION" -c "$2" -host "$HOST" ${EXTRA[@]+"${EXTRA[@]}"} "${TARGET[$1]}" >"$f"
        n=$(awk '/^ +\[[0-9]+\]/ { n += $2 } END { print n + 0 }' "$f")
        ROWS+=("hey c$2 $1 $(hey_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(steal_pct_since "$ticks")")
    else
        ab -q -k -t "${DURATION%s}" -n 10000000 -c "$2" -H "Host: $HOST" ${EXTRA[@]+"${EXTRA[@]}"} "${TARGET[$1]}" >"$f" 2>&1 || true
        n=$(awk '/^Complete requests:/ { print $3 }' "$f")
        ROWS+=("ab c$2 $1 $(ab_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(steal_pct_since "$ticks")")
    fi
}

# run_paced NAME CONNS QPS_PER_WORKER: hey again, held to the same offered load for both
# proxies (QPS_PER_WORKER x CONNS requests per second), so their latencies are compared at equal
# throughput instead of at each one's saturation (see PACE above).
run_paced() {
    local f="$OUT/hey-paced-$1-c$2-r$ROUND.txt" cpu0 n ticks
    log "hey -c$2 -q$3 ($DURATION, $(($2 * $3)) req/s offered) -> $1"
    # shellcheck disable=SC2086
    cpu0=$(cpu_ms ${PIDS[$1]})
    ticks=$(cpu_ticks)
    hey -z "$DURATION" -c "$2" -q "$3" -host "$HOST" ${EXTRA[@]+"${EXTRA[@]}"} "${TARGET[$1]}" >"$f"
    n=$(awk '/^ +\[[0-9]+\]/ { n += $2 } END { print n + 0 }' "$f")
    ROWS+=("hey-paced c$2 $1 $(hey_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(steal_pct_since "$ticks") $(($2 * $3))")
}

# The per-worker rate for this round's paced runs: PACE x nginx's saturated hey req/s this round.
paced_qps() {
    local rps
    rps=$(printf '%s\n' "${ROWS[@]}" | awk -v r="$ROUND" -v c="c$HEY_CONNS" \
        '$1 == "hey" && $2 == c && $3 == "nginx" && $9 == r { print $4 }' | tail -1)
    awk -v rps="${rps:-0}" -v pace="$PACE" -v c="$HEY_CONNS" \
        'BEGIN { q = int(rps * pace / c + 0.5); print (q > 0) ? q : 0 }'
}

ab_summary() {
    awk '/^Requests per second:/ { rps = $4 }
         /^  50%/ { p50 = $2 } /^  99%/ { p99 = $2 }
         /^Failed requests:/ { e += $3 } /^Non-2xx responses:/ { e += $3 }
         END { printf "%s %.3f %.3f %d\n", rps, p50, p99, e }' "$1"
}

# Warm-up both paths, not measured, at the highest connection count any run uses: each proxy's
# upstream pool then holds the connections the runs need, and no measured run pays for opening
# them (with 8 connections, the first c32/c64 run of either proxy carried that in its tail).
WARM_CONNS=$(printf '%s\n' $CONNS "$HEY_CONNS" | sort -n | tail -1)
for name in thaw nginx; do
    wrk -t"$WRK_THREADS" -c"$WARM_CONNS" -d2s -H "Host: $HOST" "${TARGET[$name]}" >/dev/null
done

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    if ((ROUND % 2)); then order="thaw nginx"; else order="nginx thaw"; fi
    for c in $CONNS; do
        for p in $order; do run_wrk "$p" "$c"; done
    done
    for p in $order; do run_second "$p" "$HEY_CONNS"; done
    if [ "$SECOND" = hey ] && [ "$PACE" != 0 ]; then
        q=$(paced_qps)
        if [ "$q" -gt 0 ]; then
            for p in $order; do run_paced "$p" "$HEY_CONNS" "$q"; done
        fi
    fi
done

# Still one replica, the same one nginx used (the comparison is only fair if so).
[ "$(replica_addr)" = "$UPSTREAM" ] || log "WARNING: the replica changed during the run"

{
    echo
    echo "warm.sh: $(machine); thaw runtime workers = nginx workers = $WORKERS"
    echo "replica: thaw sample-app --response-delay $RESPONSE_DELAY --threads $REPLICA_THREADS at $UPSTREAM, path $REQ_PATH; $DURATION per run"
    echo "nginx headers: $NGINX_HEADERS; extra request headers: $REQ_HEADERS"
    echo
    echo "$ROUNDS rounds, thaw and nginx alternating within each (odd rounds thaw first);" \
        "pairs with a run above $MAX_STEAL% steal are left out of the medians"
    echo
    printf '%s\n' "${ROWS[@]}" | MAX_STEAL="$MAX_STEAL" python3 -c '
import os, random, statistics, sys
def ci(xs, n=2000):
    # 95 % bootstrap interval of the median (fixed seed: the same rows give the same interval).
    rnd = random.Random(1)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]
max_steal = float(os.environ["MAX_STEAL"])
rows = [l.split() for l in sys.stdin if l.strip()]
print("| round | tool | conns | proxy | req/s | offered req/s | p50 ms | p99 ms | errors "
      "| proxy CPU us/req | steal % |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    tool, c, proxy, rps, p50, p99, err, cpu, rnd, steal = r[:10]
    offered = r[10] if len(r) > 10 else "-"
    print(f"| {rnd} | {tool} | {c[1:]} | {proxy} | {float(rps):.0f} | {offered} | {p50} | {p99} "
          f"| {err} | {cpu} | {steal} |")
print()
print("| tool | conns | thaw/nginx req/s per round | median [95% CI] | thaw/nginx p99 per round "
      "| median [95% CI] | CPU us/req thaw / nginx (medians) | pairs left out for steal "
      "| target met |")
print("|---|---|---|---|---|---|---|---|---|")
groups = {}
for r in rows:
    groups.setdefault((r[0], r[1]), {}).setdefault(r[8], {})[r[2]] = r
paced = any(tool == "hey-paced" for tool, _ in groups)
verdicts = []
noise = []
behind = []
few = []
for (tool, c), by_round in groups.items():
    num = lambda x: x.replace(".", "", 1).isdigit()
    complete = [v for v in by_round.values() if "thaw" in v and "nginx" in v
                and all(num(v[p][3]) and num(v[p][5]) for p in ("thaw", "nginx"))]
    pairs = [v for v in complete
             if all(float(v[p][9]) <= max_steal for p in ("thaw", "nginx"))]
    stolen = len(complete) - len(pairs)
    if not pairs:
        print(f"| {tool} | {c[1:]} | - | - | - | - | - | {stolen} of {len(complete)} | NO (all stolen) |")
        verdicts.append((f"{tool} c{c[1:]}", False))
        continue
    rr = [float(p["thaw"][3]) / float(p["nginx"][3]) for p in pairs]
    pr = [float(p["thaw"][5]) / float(p["nginx"][5]) for p in pairs]
    cpu_t = statistics.median(float(p["thaw"][7]) for p in pairs)
    cpu_n = statistics.median(float(p["nginx"][7]) for p in pairs)
    mr, mp = statistics.median(rr), statistics.median(pr)
    # Each failed criterion is named with its median to three places (1.00 printed can be 0.998).
    short = lambda fails, what: ("NO: " + ", ".join(fails)) if fails else f"yes ({what})"
    if tool == "hey-paced":
        # Equal offered load: the req/s ratio only shows that both kept up (thaw must, within
        # 3 %); the latency at that load is the comparison.
        kept = statistics.median(float(p["thaw"][3]) / float(p["thaw"][10]) for p in pairs)
        fails = [f"p99 {mp:.3f}"] * (mp > 1) + [f"thaw served {kept:.0%} of the offered rate"] * (kept < 0.97)
        met = short(fails, f"p99 at equal load; thaw served {kept:.0%} of the offered rate")
        verdicts.append((f"hey c{c[1:]} p99 at equal load", not fails))
    elif tool == "hey" and paced:
        # At saturation hey (Go, the heaviest process on the box) is the bottleneck and its own
        # scheduling sets the tail, for either proxy: its p99 is shown, the verdict on latency is
        # the paced row.
        fails = [f"req/s {mr:.3f}"] * (mr < 1)
        met = short(fails, "req/s; p99 shown, judged in the paced row")
        verdicts.append((f"hey c{c[1:]} req/s", not fails))
    else:
        fails = [f"req/s {mr:.3f}"] * (mr < 1) + [f"p99 {mp:.3f}"] * (mp > 1)
        met = short(fails, "req/s and p99")
        verdicts.append((f"{tool} c{c[1:]}" + (" " + " and ".join(f.split()[0] for f in fails) if fails else ""), not fails))
    fmt = lambda xs: " ".join("%.2f" % x for x in xs)
    (rlo, rhi), (plo, phi) = ci(rr), ci(pr)
    judged = [] if tool == "hey-paced" else [("req/s", rlo, rhi)]
    if not (tool == "hey" and paced):
        judged.append(("p99", plo, phi))
    if len(pairs) < 5:
        # A bootstrap over fewer than five pairs says nothing; the interval is printed, not used.
        few.append(f"{tool} c{c[1:]}")
        judged = []
    noise += [f"{tool} c{c[1:]} {what}" for what, lo, hi in judged if lo < 1 < hi]
    # Thaw shown behind: the whole interval on the nginx side (req/s below 1, p99 above 1).
    behind += [f"{tool} c{c[1:]} {what}" for what, lo, hi in judged
               if (what == "req/s" and hi < 1) or (what == "p99" and lo > 1)]
    print(f"| {tool} | {c[1:]} | {fmt(rr)} | {mr:.2f} [{rlo:.2f}-{rhi:.2f}] | {fmt(pr)} "
          f"| {mp:.2f} [{plo:.2f}-{phi:.2f}] "
          f"| {cpu_t:.1f} / {cpu_n:.1f} | {stolen} of {len(complete)} | {met} |")
print()
missed = [name for name, ok in verdicts if not ok]
print("Target (median req/s >= nginx, median p99 <= nginx): "
      + ("met in every row" if not missed else "NOT met: " + ", ".join(missed)))
if noise:
    print("Within the noise of this run (the 95% interval of the median ratio spans 1, so more "
          "rounds are needed to tell the two apart): " + ", ".join(noise))
print("Shown behind nginx (the whole 95% interval on nginx\x27s side): "
      + (", ".join(behind) if behind else "none"))
if few:
    print("Fewer than 5 pairs (intervals not judged): " + ", ".join(few))
'
} | tee "$OUT/summary.md"
