"""The README's figures from callN/eager_layout.jsonl (python summarize.py, from this folder):
per call and condition the cv of the process medians and the median cv within a process; per
call, the cv of the processes that had the model at one address; and the ratio of the two
conditions' cvs with a bootstrap over processes (5,000 resamples, seed 0, 90%)."""

import json
import random
import statistics as st
from collections import Counter
from pathlib import Path


def cv(xs):
    return st.stdev(xs) / st.mean(xs)


def medians(rows, condition):
    return [st.median(r["result"]["step_ms"]) for r in rows if r["condition"] == condition]


def bootstrap_ratio(default, fixed, resamples=5000, seed=0):
    """90% interval of cv(fixed) / cv(default), resampling each condition's processes."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        a, b = rng.choices(default, k=len(default)), rng.choices(fixed, k=len(fixed))
        if cv(a) > 0:
            ratios.append(cv(b) / cv(a))
    ratios.sort()
    return ratios[int(0.05 * len(ratios))], ratios[int(0.95 * len(ratios))]


for path in sorted(Path(__file__).parent.glob("call*/eager_layout.jsonl")):
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    print(path.parent.name)
    by = {condition: medians(rows, condition) for condition in ("default", "fixed")}
    for condition, m in by.items():
        within = [cv(r["result"]["step_ms"]) for r in rows if r["condition"] == condition]
        print(f"  {condition}: {len(m)} processes, medians {min(m):.2f}-{max(m):.2f} ms, cv "
              f"between {100 * cv(m):.1f}%, median cv within {100 * st.median(within):.1f}%")
    address, n = Counter(r["result"]["model_at"] for r in rows).most_common(1)[0]
    same = [st.median(r["result"]["step_ms"]) for r in rows if r["result"]["model_at"] == address]
    print(f"  {n} processes at {address}: cv {100 * cv(same):.1f}%")
    low, high = bootstrap_ratio(by["default"], by["fixed"])
    ratio = cv(by["fixed"]) / cv(by["default"])
    print(f"  cv fixed / default {ratio:.2f}, bootstrap 90% {low:.2f}-{high:.2f}")
