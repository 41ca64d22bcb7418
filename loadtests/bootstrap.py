"""The statistics the load-test summaries share (warm_summary.py, queue.sh)."""
import random
import statistics


def ci(xs, n=2000):
    """95 % bootstrap interval of the median of xs (fixed seed: the same rows give the same
    interval)."""
    rnd = random.Random(1)
    meds = sorted(statistics.median(rnd.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]
