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
# proxies apart there). Each run records the share of the machine's CPU time that went to others
# meanwhile: the hypervisor's steal and every process but the proxies, the replica and the load
# generator (lib.sh's noise check); a pair in which either run saw more than MAX_OTHERS percent
# measured the machine, not the proxies, and is left out of the medians (and counted). The
# summary ends with one verdict line: met, NOT met (thaw shown behind nginx), not shown either
# way (a median misses but its interval spans 1), or not judged (fewer than 5 clean pairs in a
# row: raise ROUNDS).
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
# WRK_THREADS (nproc), MAX_OTHERS (3, percent), NGINX_HEADERS (bare: nginx forwards the client's
# headers and sets Host, the baseline; forward: nginx also adds the two forwarding
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
MAX_OTHERS=${MAX_OTHERS:-3}
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
{ nginx_head "$NGX" "$WORKERS"; cat <<EOF
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
} >"$NGX/nginx.conf"
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
# The benchmark's own processes, for the noise check: thaw, its replica, nginx and its workers.
OWN_PIDS="$THAW_PID $(pgrep -P "$THAW_PID" | tr '\n' ' ') ${PIDS[nginx]}"

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
    ROWS+=("wrk c$2 $1 $(wrk_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(others_pct_since "$ticks")")
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
        ROWS+=("hey c$2 $1 $(hey_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(others_pct_since "$ticks")")
    else
        ab -q -k -t "${DURATION%s}" -n 10000000 -c "$2" -H "Host: $HOST" ${EXTRA[@]+"${EXTRA[@]}"} "${TARGET[$1]}" >"$f" 2>&1 || true
        n=$(awk '/^Complete requests:/ { print $3 }' "$f")
        ROWS+=("ab c$2 $1 $(ab_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(others_pct_since "$ticks")")
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
    ROWS+=("hey-paced c$2 $1 $(hey_summary "$f") $(proxy_cpu "$1" "$cpu0" "$n") $ROUND $(others_pct_since "$ticks") $(($2 * $3))")
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
        "pairs with a run above $MAX_OTHERS% of the CPU used by others (steal and other" \
        "processes) are left out of the medians"
    echo
    printf '%s\n' "${ROWS[@]}" | MAX_OTHERS="$MAX_OTHERS" python3 "$LT_DIR/warm_summary.py"
} | tee "$OUT/summary.md"
