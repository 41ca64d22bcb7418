#!/usr/bin/env python3
"""warm.sh's summary: reads its run rows on stdin, prints the per-run table, the per-row table of
thaw/nginx ratios (median and 95 % bootstrap interval) and one verdict line.

A row is `TOOL cCONNS PROXY REQ_PER_S P50_MS P99_MS ERRORS CPU_US_PER_REQ ROUND OTHERS_PCT
[OFFERED_REQ_PER_S]` (space separated; OTHERS_PCT is lib.sh's noise check). MAX_OTHERS (env,
percent): a pair with a run above it is left out of the medians.
"""
import os, statistics, sys
sys.dont_write_bytecode = True  # no __pycache__ beside the scripts
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bootstrap import ci
max_others = float(os.environ["MAX_OTHERS"])
rows = [l.split() for l in sys.stdin if l.strip()]
print("| round | tool | conns | proxy | req/s | offered req/s | p50 ms | p99 ms | errors "
      "| proxy CPU us/req | others % |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    tool, c, proxy, rps, p50, p99, err, cpu, rnd, others = r[:10]
    offered = r[10] if len(r) > 10 else "-"
    print(f"| {rnd} | {tool} | {c[1:]} | {proxy} | {float(rps):.0f} | {offered} | {p50} | {p99} "
          f"| {err} | {cpu} | {others} |")
print()
print("| tool | conns | thaw/nginx req/s per round | median [95% CI] | thaw/nginx p99 per round "
      "| median [95% CI] | CPU us/req thaw / nginx (medians) | pairs left out for noise "
      "| target met |")
print("|---|---|---|---|---|---|---|---|---|")
groups = {}
for r in rows:
    groups.setdefault((r[0], r[1]), {}).setdefault(r[8], {})[r[2]] = r
paced = any(tool == "hey-paced" for tool, _ in groups)
# Each row ends as one of: met (every median meets the target), noise (a median misses, but its
# 95 % interval spans 1), behind (a missed criterion whose whole interval is on nginx's side,
# or thaw not keeping up with the paced rate), few (fewer than 5 clean pairs: not judged).
status = {}
for (tool, c), by_round in groups.items():
    name = f"{tool} c{c[1:]}"
    num = lambda x: x.replace(".", "", 1).isdigit()
    complete = [v for v in by_round.values() if "thaw" in v and "nginx" in v
                and all(num(v[p][3]) and num(v[p][5]) for p in ("thaw", "nginx"))]
    pairs = [v for v in complete
             if all(float(v[p][9]) <= max_others for p in ("thaw", "nginx"))]
    noisy = len(complete) - len(pairs)
    if not pairs:
        print(f"| {tool} | {c[1:]} | - | - | - | - | - | {noisy} of {len(complete)} | not judged (no clean pair) |")
        status[name] = "few"
        continue
    rr = [float(p["thaw"][3]) / float(p["nginx"][3]) for p in pairs]
    pr = [float(p["thaw"][5]) / float(p["nginx"][5]) for p in pairs]
    cpu_t = statistics.median(float(p["thaw"][7]) for p in pairs)
    cpu_n = statistics.median(float(p["nginx"][7]) for p in pairs)
    mr, mp = statistics.median(rr), statistics.median(pr)
    (rlo, rhi), (plo, phi) = ci(rr), ci(pr)
    # The criteria of this row: (what, median, interval, whether the median meets the target).
    # At saturation hey (Go, the heaviest process on the box) is the bottleneck and its own
    # scheduling sets the tail for either proxy: with a paced pair, the saturated hey row is
    # judged on req/s and the paced row on p99 at equal load, where thaw must also serve at
    # least 97 % of the offered rate.
    req = ("req/s", mr, (rlo, rhi), mr >= 1, lambda lo, hi: hi < 1)
    p99 = ("p99", mp, (plo, phi), mp <= 1, lambda lo, hi: lo > 1)
    kept_ok = True
    if tool == "hey-paced":
        criteria = [p99]
        kept = statistics.median(float(p["thaw"][3]) / float(p["thaw"][10]) for p in pairs)
        kept_ok = kept >= 0.97
    elif tool == "hey" and paced:
        criteria = [req]
    else:
        criteria = [req, p99]
    missed = [(w, m, iv, behind) for w, m, iv, ok, behind in criteria if not ok]
    if len(pairs) < 5:
        st, said = "few", f"not judged ({len(pairs)} clean pairs)"
    elif not kept_ok:
        st, said = "behind", f"NO: thaw served {kept:.0%} of the offered rate"
    elif not missed:
        st, said = "met", "yes (" + " and ".join(w for w, *_ in criteria) + ")"
    elif any(behind(*iv) for _, _, iv, behind in missed):
        st, said = "behind", "NO: " + ", ".join(f"{w} {m:.3f}" for w, m, _, _ in missed)
    else:
        st, said = "noise", "within the noise: " + ", ".join(f"{w} {m:.3f}" for w, m, _, _ in missed)
    status[name] = st
    fmt = lambda xs: " ".join("%.2f" % x for x in xs)
    print(f"| {tool} | {c[1:]} | {fmt(rr)} | {mr:.2f} [{rlo:.2f}-{rhi:.2f}] | {fmt(pr)} "
          f"| {mp:.2f} [{plo:.2f}-{phi:.2f}] "
          f"| {cpu_t:.1f} / {cpu_n:.1f} | {noisy} of {len(complete)} | {said} |")
print()
of = lambda st: ", ".join(n for n, s in status.items() if s == st)
# One verdict, the first that applies: a row not judged makes the run say nothing of the others.
few, behind, noise = of("few"), of("behind"), of("noise")
if few:
    print(f"Verdict: not judged: fewer than 5 clean pairs in {few} "
          "(raise ROUNDS, or run on a quieter machine)")
elif behind:
    print(f"Verdict: NOT met: thaw is behind nginx in {behind}")
elif noise:
    print(f"Verdict: not shown either way: a median misses in {noise}, but its 95% "
          "interval spans 1 (more rounds needed)")
else:
    print("Verdict: met in every row (median req/s >= nginx, median p99 <= nginx)")
