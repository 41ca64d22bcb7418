#!/usr/bin/env bash
# shellcheck disable=SC2015  # `test && test || die` is meant: die when the check fails
# queue.sh: the queue sidecar's overhead. `thaw queue` vs nginx as a sidecar in front of the SAME
# warm app (`thaw sample-app`), and the app straight, side by side in one run; then the
# sidecar's RSS idle and with HELD requests in flight.
#
# For each connection count wrk runs against the three targets (fixed duration), then hey (or ab)
# does the same as a second opinion. Repeated ROUNDS times, rotating which target goes first, so
# drift on a shared VM favours none. Prints every run, then per tool and connection count the
# median of the per-round queue/nginx req/s ratios (95 % bootstrap interval) and the p99 each
# sidecar adds over the app straight (median of the per-round differences). Pairs with a run
# in which others (steal and other processes: lib.sh's noise check) used more than MAX_OTHERS
# percent of the CPU are left out, as in warm.sh.
#
# The h2c row: h2load (H2C_SHAPE connections x streams, over h2c prior knowledge) against the
# same three targets; nginx as an h2c sidecar is a second `listen ... http2` server proxying to
# the app over HTTP/1.1 with keepalive (thaw queue and the app take h2c on their one port).
# p50/p99 come from h2load's per-request log. H2C_SHAPE= (empty) leaves the row out.
#
# Both sidecars get SIDECAR_WORKERS (1) workers: `thaw queue --threads`, nginx `worker_processes`
# (a sidecar gets a fraction of a core; one worker each is the fair comparison). The sidecar runs
# with containerConcurrency 0 (CC>0 adds one uncontended limiter admission per request).
#
# Knobs (environment): ROUNDS (7), DURATION (4s), CONNS ("32 64"), HEY_CONNS (64),
# H2C_SHAPE (16x32), SIDECAR_WORKERS (1), REPLICA_THREADS (1), MAX_OTHERS (3), HELD (1000), HOLD_DELAY (6s: how long
# the app holds each of the HELD requests). THAW (target/release/thaw).
# Run time ~ ROUNDS * (3 * (len(CONNS) + 1)) * DURATION + 30 s (about 5 minutes by default).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ROUNDS=${ROUNDS:-7}
DURATION=${DURATION:-4s}
CONNS=${CONNS:-32 64}
HEY_CONNS=${HEY_CONNS:-64}
SIDECAR_WORKERS=${SIDECAR_WORKERS:-1}
REPLICA_THREADS=${REPLICA_THREADS:-1}
MAX_OTHERS=${MAX_OTHERS:-3}
HELD=${HELD:-1000}
HOLD_DELAY=${HOLD_DELAY:-6s}
H2C_SHAPE=${H2C_SHAPE-16x32}

lt_init queue
need wrk
need nginx nginx-light
SECOND=$(second_opinion_tool)
[ -z "$H2C_SHAPE" ] || need h2load nghttp2-client
ulimit -n 65536 2>/dev/null || true

# start_app PORT ARGS...: `thaw sample-app` on PORT, once it answers.
start_app() {
    local port=$1
    shift
    lt_bg "$THAW" sample-app --port "$port" "$@" >>"$OUT/app-$port.log" 2>&1
    wait_until 30 "the app on $port" curl -sf "http://127.0.0.1:$port/healthz"
}

# start_queue PORT ADMIN USER_PORT: `thaw queue` in front of 127.0.0.1:USER_PORT, once ready.
start_queue() {
    lt_bg env SERVING_NAMESPACE=default SERVING_REVISION=bench-00001 SERVING_POD=bench \
        USER_PORT="$3" THAW_DRAIN_DELAY=0s RUST_LOG=warn \
        "$THAW" queue --listen "127.0.0.1:$1" --admin-listen "127.0.0.1:$2" \
        --threads "$SIDECAR_WORKERS" >>"$OUT/queue-$1.log" 2>&1
    wait_until 30 "thaw queue on $1" curl -sf "http://127.0.0.1:$2/readyz"
}

APP_PORT=$(free_port)
start_app "$APP_PORT" --threads "$REPLICA_THREADS"
APP_PID=$LAST_PID
Q_PORT=$(free_port)
Q_ADMIN=$(free_port)
start_queue "$Q_PORT" "$Q_ADMIN" "$APP_PORT"
QUEUE_PID=$LAST_PID
RSS_START=$(rss_kib "$QUEUE_PID")
log "app $APP_PORT (pid $APP_PID), thaw queue $Q_PORT/$Q_ADMIN (pid $QUEUE_PID, $RSS_START KiB at start)"

NGX="$OUT/nginx"
mkdir -p "$NGX/tmp"
NGINX_PORT=$(free_port)
NGINX_H2C_PORT=$(free_port)
{ nginx_head "$NGX" "$SIDECAR_WORKERS"; cat <<EOF
    upstream app {
        server 127.0.0.1:$APP_PORT;
        keepalive 128;
    }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
        }
    }
    server {
        listen 127.0.0.1:$NGINX_H2C_PORT http2;
        http2_max_concurrent_streams 128;
        keepalive_requests 1000000;
        location / {
            proxy_pass http://app;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
        }
    }
}
EOF
} >"$NGX/nginx.conf"
lt_bg nginx -p "$NGX" -c "$NGX/nginx.conf" -g 'daemon off;'
NGINX_PID=$LAST_PID
wait_until 10 "nginx" curl -sf "http://127.0.0.1:$NGINX_PORT/"
NGINX_WORKERS=$(pgrep -P "$NGINX_PID" | tr '\n' ' ')
[ -n "$NGINX_WORKERS" ] || die "no nginx workers found"

declare -A TARGET=([direct]="http://127.0.0.1:$APP_PORT/" [queue]="http://127.0.0.1:$Q_PORT/"
    [nginx]="http://127.0.0.1:$NGINX_PORT/")
declare -A TARGET_H2C=([direct]="${TARGET[direct]}" [queue]="${TARGET[queue]}"
    [nginx]="http://127.0.0.1:$NGINX_H2C_PORT/")
declare -A PIDS=([direct]="$APP_PID" [queue]="$QUEUE_PID" [nginx]="$NGINX_PID $NGINX_WORKERS")
# The benchmark's own processes, for the noise check.
OWN_PIDS="$APP_PID $QUEUE_PID $NGINX_PID $NGINX_WORKERS"
for t in direct queue nginx; do
    body=$(curl -sf "${TARGET[$t]}") || die "$t failed"
    [ "$body" = "Hello from thaw!" ] || die "$t answered: $body"
    [ -z "$H2C_SHAPE" ] || {
        body=$(curl -sf --http2-prior-knowledge "${TARGET_H2C[$t]}") || die "$t (h2c) failed"
        [ "$body" = "Hello from thaw!" ] || die "$t (h2c) answered: $body"
    }
done

proxy_cpu() {  # name ms_before requests: CPU us per request of that target's processes
    # shellcheck disable=SC2086
    awk -v a="$2" -v b="$(cpu_ms ${PIDS[$1]})" -v n="$3" 'BEGIN { printf "%.1f", (n > 0) ? (b - a) * 1000 / n : 0 }'
}
ROWS=()
run() {  # tool target conns
    local f="$OUT/$1-$2-c$3-r$ROUND.txt" cpu0 n ticks s
    log "$1 -c$3 ($DURATION) -> $2"
    # shellcheck disable=SC2086
    cpu0=$(cpu_ms ${PIDS[$2]})
    ticks=$(cpu_ticks)
    case $1 in
        wrk)
            wrk -t"$(nproc)" -c"$3" -d"$DURATION" --latency "${TARGET[$2]}" >"$f"
            n=$(awk '/requests in/ { print $1 }' "$f")
            s=$(wrk_summary "$f")
            ;;
        hey)
            hey -z "$DURATION" -c "$3" "${TARGET[$2]}" >"$f"
            n=$(awk '/^ +\[[0-9]+\]/ { n += $2 } END { print n + 0 }' "$f")
            s=$(hey_summary "$f")
            ;;
        ab)
            ab -q -k -t "${DURATION%s}" -n 10000000 -c "$3" "${TARGET[$2]}" >"$f" 2>&1 || true
            n=$(awk '/^Complete requests:/ { print $3 }' "$f")
            s=$(awk '/^Requests per second:/ { rps = $4 } /^  50%/ { p50 = $2 } /^  99%/ { p99 = $2 }
                /^Failed requests:/ { e += $3 } /^Non-2xx responses:/ { e += $3 }
                END { printf "%s %.3f %.3f %d\n", rps, p50, p99, e }' "$f")
            ;;
        h2load)
            local t=$(nproc)
            [ "$t" -le "${3%x*}" ] || t=${3%x*}
            h2load -c "${3%x*}" -m "${3#*x}" -t "$t" -D "${DURATION%s}" --log-file="$f.log" \
                "${TARGET_H2C[$2]}" >"$f"
            n=$(awk '/^requests:/ { gsub(",", ""); print $8 }' "$f")
            s=$(h2load_summary "$f" "$f.log")
            ;;
    esac
    ROWS+=("$1 c$3 $2 $s $(proxy_cpu "$2" "$cpu0" "$n") $ROUND $(others_pct_since "$ticks")")
}

# Warm-up (not measured): every upstream pool holds the connections the runs need.
WARM_CONNS=$(printf '%s\n' $CONNS "$HEY_CONNS" | sort -n | tail -1)
for t in direct queue nginx; do wrk -t"$(nproc)" -c"$WARM_CONNS" -d2s "${TARGET[$t]}" >/dev/null; done
[ -z "$H2C_SHAPE" ] || for t in direct queue nginx; do
    h2load -c "${H2C_SHAPE%x*}" -m "${H2C_SHAPE#*x}" -D 2 "${TARGET_H2C[$t]}" >/dev/null
done

ORDERS=("direct queue nginx" "queue nginx direct" "nginx direct queue")
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    order=${ORDERS[$(((ROUND - 1) % 3))]}
    for c in $CONNS; do for t in $order; do run wrk "$t" "$c"; done; done
    for t in $order; do run "$SECOND" "$t" "$HEY_CONNS"; done
    [ -z "$H2C_SHAPE" ] || for t in $order; do run h2load "$t" "$H2C_SHAPE"; done
done

# Idle RSS after the load (connections closed, pools idle).
sleep 2
RSS_IDLE=$(rss_kib "$QUEUE_PID")

# RSS with HELD requests in flight: a second app holding each request HOLD_DELAY, a second
# sidecar in front of it, HELD clients at once; read once the app holds them all.
SLOW_PORT=$(free_port)
start_app "$SLOW_PORT" --response-delay "$HOLD_DELAY" --threads 2
Q2_PORT=$(free_port)
Q2_ADMIN=$(free_port)
start_queue "$Q2_PORT" "$Q2_ADMIN" "$SLOW_PORT"
Q2_PID=$LAST_PID
RSS2_IDLE=$(rss_kib "$Q2_PID")
lt_bg hey -n "$HELD" -c "$HELD" -t 60 "http://127.0.0.1:$Q2_PORT/" >"$OUT/held-hey.txt"
HEY_PID=$LAST_PID
held_all() {
    [ "$(curl -sf "http://127.0.0.1:$SLOW_PORT/inflight" | python3 -c 'import json,sys; print(json.load(sys.stdin)["inFlight"])')" -ge "$HELD" ]
}
wait_until 60 "$HELD requests in flight" held_all
RSS_HELD=$(rss_kib "$Q2_PID")
wait "$HEY_PID" || true
HELD_ERRS=$(hey_summary "$OUT/held-hey.txt" | awk '{ print $4 }')

{
    echo
    echo "queue.sh: $(machine)"
    echo "app: thaw sample-app --threads $REPLICA_THREADS; sidecars: thaw queue --threads $SIDECAR_WORKERS, nginx worker_processes $SIDECAR_WORKERS (upstream keepalive, access_log off); $DURATION per run, $ROUNDS rounds"
    echo
    printf '%s\n' "${ROWS[@]}" | MAX_OTHERS="$MAX_OTHERS" LT_DIR="$LT_DIR" python3 -c '
import os, statistics, sys
sys.dont_write_bytecode = True
sys.path.insert(0, os.environ["LT_DIR"])
from bootstrap import ci
max_others = float(os.environ["MAX_OTHERS"])
rows = [l.split() for l in sys.stdin if l.strip()]
print("| round | tool | conns | target | req/s | p50 ms | p99 ms | errors | CPU us/req | others % |")
print("|---|---|---|---|---|---|---|---|---|---|")
for tool, c, t, rps, p50, p99, err, cpu, rnd, others in rows:
    print(f"| {rnd} | {tool} | {c[1:]} | {t} | {float(rps):.0f} | {p50} | {p99} | {err} | {cpu} | {others} |")
print()
print("| tool | conns | req/s direct / queue / nginx (medians) | queue/nginx req/s median [95% CI] "
      "| p99 ms direct / queue / nginx (medians) | p99 added over direct: queue / nginx (median of per-round differences) "
      "| CPU us/req queue / nginx | rounds left out for noise | target met |")
print("|---|---|---|---|---|---|---|---|---|")
groups = {}
for r in rows:
    groups.setdefault((r[0], r[1]), {}).setdefault(r[8], {})[r[2]] = r
missed = []
for (tool, c), by_round in groups.items():
    complete = [v for v in by_round.values() if len(v) == 3]
    ok = [v for v in complete if all(float(v[t][9]) <= max_others for t in v)]
    if not ok:
        print(f"| {tool} | {c[1:]} | - | - | - | - | - | {len(complete)} of {len(complete)} | NO (all stolen) |")
        missed.append(f"{tool} c{c[1:]}")
        continue
    med = lambda t, i: statistics.median(float(v[t][i]) for v in ok)
    rr = [float(v["queue"][3]) / float(v["nginx"][3]) for v in ok]
    aq = statistics.median(float(v["queue"][5]) - float(v["direct"][5]) for v in ok)
    an = statistics.median(float(v["nginx"][5]) - float(v["direct"][5]) for v in ok)
    lo, hi = ci(rr)
    fails = [f"req/s {statistics.median(rr):.3f}"] * (statistics.median(rr) < 1) + [f"added p99 {aq:.3f} > {an:.3f} ms"] * (aq > an)
    if fails:
        missed.append(f"{tool} c{c[1:]} (" + ", ".join(fails) + ")")
    rd, rq, rn = (med(t, 3) for t in ("direct", "queue", "nginx"))
    pd, pq, pn = (med(t, 5) for t in ("direct", "queue", "nginx"))
    cq, cn = med("queue", 7), med("nginx", 7)
    verdict = "yes" if not fails else "NO: " + ", ".join(fails)
    print(f"| {tool} | {c[1:]} | {rd:.0f} / {rq:.0f} / {rn:.0f} "
          f"| {statistics.median(rr):.2f} [{lo:.2f}-{hi:.2f}] "
          f"| {pd:.3f} / {pq:.3f} / {pn:.3f} "
          f"| {aq:+.3f} / {an:+.3f} | {cq:.1f} / {cn:.1f} "
          f"| {len(complete) - len(ok)} of {len(complete)} | {verdict} |")
print()
print("Target (req/s >= nginx, added p99 <= nginx added p99): " + ("met in every row" if not missed else "NOT met: " + "; ".join(missed)))
'
    echo
    echo "thaw queue RSS: $RSS_START KiB at start, $RSS_IDLE KiB idle after the load runs;" \
        "$RSS2_IDLE KiB idle -> $RSS_HELD KiB with $HELD requests in flight (app holding each $HOLD_DELAY; $HELD_ERRS errors)" \
        "= $(awk -v a="$RSS2_IDLE" -v b="$RSS_HELD" -v n="$HELD" 'BEGIN { printf "%.1f", (b - a) / n }') KiB per request in flight"
    echo "Target: idle RSS < 8 MiB (8192 KiB): $([ "$RSS_IDLE" -lt 8192 ] && echo met || echo NOT met)"
} | tee "$OUT/summary.md"
