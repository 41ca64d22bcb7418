#!/usr/bin/env bash
# shellcheck disable=SC2015  # `test && test || die` is meant: die when the check fails
# h2c.sh: thaw's h2c path vs nginx (and haproxy) in front of the SAME warm replicas, side by side.
#
# Two services, each with exactly one replica that stays (min-scale 1, max-scale 1), both
# `thaw sample-app`: `h1` speaks HTTP/1.1 to its proxy (port name http1), `h2` speaks h2c (port
# name h2c). The client is h2load over h2c (prior knowledge) in every run. Two upstream kinds:
# - h1: h2c -> HTTP/1.1 upstream. thaw vs nginx `listen ... http2` + `proxy_pass` to the h1
#   replica with upstream keepalive (nginx 1.22 spells `http2 on` as a `listen` parameter).
# - h2: h2c -> h2c upstream. thaw vs nginx `grpc_pass` (nginx's only h2 upstream) and haproxy
#   (`proto h2` on both sides) to the h2 replica.
# Shapes (SHAPES, CONNSxSTREAMS): 16x32 first (16 connections x 32 concurrent streams each: the
# issue's first measurement), then 32x1 (one stream per connection), 4x100.
# Rounds rotate which proxy goes first, as warm.sh does; per upstream kind and shape the summary
# prints every run, then the median of the per-round thaw/other req/s and p99 ratios with their
# 95 % bootstrap interval; pairs in which others used more than MAX_OTHERS percent of the CPU
# (lib.sh's noise check) are left out. p50/p99 come from h2load's per-request log.
# All proxies get as many workers as thaw has runtime workers (nproc).
#
# Knobs (environment): ROUNDS (5), DURATION (4: seconds per run), SHAPES ("16x32 32x1 4x100"),
# UPSTREAMS ("h1 h2"), REPLICA_THREADS (1), MAX_OTHERS (3), H2LOAD_THREADS (nproc).
# Run time ~ ROUNDS * len(SHAPES) * 5 * DURATION + 20 s (about 5 minutes by default).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-4}
SHAPES=${SHAPES:-16x32 32x1 4x100}
UPSTREAMS=${UPSTREAMS:-h1 h2}
REPLICA_THREADS=${REPLICA_THREADS:-1}
MAX_OTHERS=${MAX_OTHERS:-3}
H2LOAD_THREADS=${H2LOAD_THREADS:-$(nproc)}
WORKERS=$(nproc)

lt_init h2c
need h2load nghttp2-client
need nginx nginx-light
need haproxy
ulimit -n 65536 2>/dev/null || true

app_args="[\"--response-delay\", \"0s\", \"--threads\", \"$REPLICA_THREADS\"]"
pinned='{autoscaling.knative.dev/min-scale: "1", autoscaling.knative.dev/max-scale: "1"}'
write_configmaps "$OUT"
local_yaml "$OUT" "$(service_yaml h1 "$pinned" "$app_args" http1)
$(service_yaml h2 "$pinned" "$app_args" h2c)"
start_thaw "$OUT"

# replica_addr SERVICE: its one replica's address, once ready.
replica_addr() {
    revisions | python3 -c '
import json, sys
for r in json.load(sys.stdin)["revisions"]:
    if r["name"] == sys.argv[1] + "-00001" and r["ready"]["count"] == 1:
        print(r["ready"]["addresses"][0])' "$1"
}
for s in h1 h2; do wait_until 30 "the $s replica" test -n "$(replica_addr "$s")"; done
declare -A UP=([h1]="$(replica_addr h1)" [h2]="$(replica_addr h2)")
log "replicas: h1 at ${UP[h1]}, h2 (h2c) at ${UP[h2]}"

NGX="$OUT/nginx"
mkdir -p "$NGX/tmp"
NGINX_H1=$(free_port)
NGINX_H2=$(free_port)
{ nginx_head "$NGX" "$WORKERS"; cat <<EOF
    http2_max_concurrent_streams 128;
    keepalive_requests 1000000;
    upstream h1 { server ${UP[h1]}; keepalive 128; keepalive_requests 1000000; }
    upstream h2 { server ${UP[h2]}; keepalive 128; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$NGINX_H1 http2;
        location / {
            proxy_pass http://h1;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
        }
    }
    server {
        listen 127.0.0.1:$NGINX_H2 http2;
        location / {
            grpc_pass grpc://h2;
            grpc_set_header Host \$host;
        }
    }
}
EOF
} >"$NGX/nginx.conf"
lt_bg nginx -p "$NGX" -c "$NGX/nginx.conf" -g 'daemon off;'
NGINX_PID=$LAST_PID

HAP_PORT=$(free_port)
cat >"$OUT/haproxy.cfg" <<EOF
global
    nbthread $WORKERS
    maxconn 8192
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
frontend h2c
    bind 127.0.0.1:$HAP_PORT proto h2
    default_backend replica
backend replica
    http-reuse always
    server r ${UP[h2]} proto h2
EOF
lt_bg haproxy -f "$OUT/haproxy.cfg" -db
HAP_PID=$LAST_PID

# h2c_get URL HOST: one h2c (prior knowledge) GET; prints the body.
h2c_get() { curl -sf --http2-prior-knowledge -H "Host: $2" "$1"; }
declare -A URL=(
    [thaw/h1]="http://$DATA/" [nginx/h1]="http://127.0.0.1:$NGINX_H1/"
    [thaw/h2]="http://$DATA/" [nginx/h2]="http://127.0.0.1:$NGINX_H2/"
    [haproxy/h2]="http://127.0.0.1:$HAP_PORT/")
declare -A PROXIES=([h1]="thaw nginx" [h2]="thaw nginx haproxy")
for up in $UPSTREAMS; do
    for p in ${PROXIES[$up]}; do
        wait_until 10 "$p ($up)" h2c_get "${URL[$p/$up]}" "$up.default.example.com"
        body=$(h2c_get "${URL[$p/$up]}" "$up.default.example.com") || die "$p/$up failed"
        [ "$body" = "Hello from $up!" ] || die "$p/$up answered: $body"
    done
done
NGINX_WORKERS=$(pgrep -P "$NGINX_PID" | tr '\n' ' ')
[ -n "$NGINX_WORKERS" ] || die "no nginx workers found"
declare -A PIDS=([thaw]="$THAW_PID" [nginx]="$NGINX_PID $NGINX_WORKERS" [haproxy]="$HAP_PID")
OWN_PIDS="$THAW_PID $(pgrep -P "$THAW_PID" | tr '\n' ' ') ${PIDS[nginx]} $HAP_PID"
log "nginx h1 :$NGINX_H1, h2 :$NGINX_H2; haproxy h2 :$HAP_PORT; $WORKERS workers each"

proxy_cpu() {  # name ms_before requests: CPU us per request of that proxy's processes
    # shellcheck disable=SC2086
    awk -v a="$2" -v b="$(cpu_ms ${PIDS[$1]})" -v n="$3" 'BEGIN { printf "%.1f", (n > 0) ? (b - a) * 1000 / n : 0 }'
}
ROWS=()
run() {  # proxy upstream shape [seconds]
    local p=$1 up=$2 c=${3%x*} m=${3#*x} secs=${4:-$DURATION}
    local f="$OUT/h2load-$p-$up-$3-r${ROUND:-0}.txt" cpu0 n ticks t=$H2LOAD_THREADS
    [ "$t" -le "$c" ] || t=$c
    log "h2load -c$c -m$m -t$t -D$secs -> $p ($up upstream)"
    # shellcheck disable=SC2086
    cpu0=$(cpu_ms ${PIDS[$p]})
    ticks=$(cpu_ticks)
    h2load -c "$c" -m "$m" -t "$t" -D "$secs" -H ":authority: $up.default.example.com" \
        --log-file="$f.log" "${URL[$p/$up]}" >"$f"
    n=$(awk '/^requests:/ { gsub(",", ""); print $8 }' "$f")
    [ -n "${ROUND:-}" ] || { rm -f "$f.log"; return; }
    ROWS+=("$up $3 $p $(h2load_summary "$f" "$f.log") $(proxy_cpu "$p" "$cpu0" "$n") $ROUND $(others_pct_since "$ticks")")
}

# Warm-up (not measured): every upstream pool opens what the runs need.
for up in $UPSTREAMS; do for p in ${PROXIES[$up]}; do run "$p" "$up" 16x32 2; done; done

for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    for up in $UPSTREAMS; do
        read -ra ps <<<"${PROXIES[$up]}"
        k=$(((ROUND - 1) % ${#ps[@]}))
        order=("${ps[@]:$k}" "${ps[@]:0:$k}")
        for shape in $SHAPES; do
            for p in "${order[@]}"; do run "$p" "$up" "$shape"; done
        done
    done
done

{
    echo
    echo "h2c.sh: $(machine); thaw runtime workers = nginx workers = haproxy threads = $WORKERS"
    echo "replicas: thaw sample-app --threads $REPLICA_THREADS (h1: HTTP/1.1 at ${UP[h1]}, h2: h2c at ${UP[h2]}); h2load over h2c, ${DURATION} s per run, $ROUNDS rounds rotating the proxies"
    echo
    printf '%s\n' "${ROWS[@]}" | MAX_OTHERS="$MAX_OTHERS" LT_DIR="$LT_DIR" python3 -c '
import os, statistics, sys
sys.dont_write_bytecode = True
sys.path.insert(0, os.environ["LT_DIR"])
from bootstrap import ci
max_others = float(os.environ["MAX_OTHERS"])
rows = [l.split() for l in sys.stdin if l.strip()]
print("| round | upstream | connections x streams | proxy | req/s | p50 ms | p99 ms | errors | CPU us/req | others % |")
print("|---|---|---|---|---|---|---|---|---|---|")
for up, shape, p, rps, p50, p99, err, cpu, rnd, others in rows:
    print(f"| {rnd} | {up} | {shape} | {p} | {float(rps):.0f} | {p50} | {p99} | {err} | {cpu} | {others} |")
print()
print("| upstream | connections x streams | vs | req/s thaw / other (medians) | thaw/other req/s median [95% CI] "
      "| thaw/other p99 median [95% CI] | CPU us/req thaw / other | pairs left out for noise | verdict |")
print("|---|---|---|---|---|---|---|---|---|")
groups = {}
for r in rows:
    groups.setdefault((r[0], r[1]), {}).setdefault(r[8], {})[r[2]] = r
behind = []
for (up, shape), by_round in groups.items():
    others = sorted({p for v in by_round.values() for p in v} - {"thaw"})
    for o in others:
        complete = [v for v in by_round.values() if "thaw" in v and o in v]
        ok = [v for v in complete if float(v["thaw"][9]) <= max_others and float(v[o][9]) <= max_others]
        left = f"{len(complete) - len(ok)} of {len(complete)}"
        if not ok:
            print(f"| {up} | {shape} | {o} | - | - | - | - | {left} | not judged (no clean pair) |")
            continue
        t = "thaw"
        med = lambda p, i: statistics.median(float(v[p][i]) for v in ok)
        rr = [float(v["thaw"][3]) / float(v[o][3]) for v in ok]
        pr = [float(v["thaw"][5]) / float(v[o][5]) for v in ok]
        (rlo, rhi), (plo, phi) = ci(rr), ci(pr)
        mr, mp = statistics.median(rr), statistics.median(pr)
        if len(ok) < 5:
            verdict = f"not judged ({len(ok)} clean pairs)"
        elif mr >= 1 and mp <= 1:
            verdict = "level or ahead"
        elif rhi < 1 or plo > 1:
            verdict = "BEHIND: " + ", ".join([f"req/s {mr:.2f}"] * (mr < 1) + [f"p99 {mp:.2f}"] * (mp > 1))
            behind.append(f"{up} {shape} vs {o}")
        else:
            verdict = "within the noise"
        print(f"| {up} | {shape} | {o} | {med(t, 3):.0f} / {med(o, 3):.0f} | {mr:.2f} [{rlo:.2f}-{rhi:.2f}] "
              f"| {mp:.2f} [{plo:.2f}-{phi:.2f}] | {med(t, 7):.1f} / {med(o, 7):.1f} | {left} | {verdict} |")
print()
print("thaw shown behind in: " + ("none" if not behind else "; ".join(behind)))
'
} | tee "$OUT/summary.md"
