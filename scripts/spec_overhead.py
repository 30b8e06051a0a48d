"""The speculative engine against an older commit's, side by side in one process (#18 item 5):
both engines run the default pair, interleaved in a shuffled order, and per engine, mode and K
this prints Leviathan's prediction (from the measured alpha and c, c from each engine's own
autoregressive loops) against the measured speedup, and where the iteration's time goes beyond
the prediction: the draft's passes in the loop over K passes in its own loop, the K+1-token
verification over one target step, and the host's overhead beyond the sampling that c already
counts. Beside them, the two costs that Leviathan's formula prices at one target step and K draft
steps: `verify` (the K+1-token verification pass over a one-token pass of the baseline) and
`draft` (a draft pass inside the loop, after the target has run, over one in its own loop).

    python scripts/spec_overhead.py [--before REV] [--threads 2] [--reps 8] [--ks 1 2 3 4 6 8]

REV's speculative.py and sampling.py are imported from `git show`; the rest is this tree's.
Models: results/models/{target,draft} (`decodelab prepare-model`, as the DAG trains them)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from decodelab.analysis.theory import expected_speedup, expected_tokens_per_call
from decodelab.backends import models
from decodelab.backends.train import heldout_prompts
from decodelab.config.settings import Sampling
from decodelab.engines import speculative as current

MODES = {"greedy": Sampling(temperature=0.0), "sampled": Sampling(temperature=1.0)}


def engine_at(rev: str):
    """REV's speculative module, with REV's sampling module beside it."""
    root = Path(tempfile.mkdtemp(prefix="spec_overhead_"))
    pkg = root / "before"
    pkg.mkdir()
    for name in ("speculative", "sampling"):
        text = subprocess.run(["git", "show", f"{rev}:src/decodelab/{name}.py"], check=True,
                              capture_output=True, text=True).stdout
        text = text.replace("from .sampling import", "from before.sampling import")
        (pkg / f"{name}.py").write_text(text.replace("from .", "from decodelab."))
    (pkg / "__init__.py").write_text("")
    sys.path.insert(0, str(root))
    spec = importlib.util.spec_from_file_location("before.speculative", pkg / "speculative.py")
    importlib.import_module("before")
    module = importlib.util.module_from_spec(spec)
    sys.modules["before.speculative"] = module
    spec.loader.exec_module(module)
    return module


def run_grid(engines, target, draft, prompts, reps, ks):
    gen = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    grid = [(e, m, method, k, p) for e in engines for m in MODES for p in range(len(prompts))
            for method, k in [("target", 0), ("draft", 0), *[("spec", k) for k in ks]]]
    for engine in engines.values():  # warm-up, untimed
        for s in MODES.values():
            engine.generate(target, draft, prompts[0], 64, 3, s, gen(0), gen(1))
            engine.autoregressive(target, prompts[0], 64, s, gen(0))
    rows = []
    for rep in range(reps):
        random.Random(rep).shuffle(grid)
        for i, (e, m, method, k, p) in enumerate(grid):
            engine, s, seed = engines[e], MODES[m], 1000 * rep + i
            if method == "spec":
                out = engine.generate(target, draft, prompts[p], 64, k, s, gen(seed), gen(seed + 1))
                passes = out.draft_forwards - 1  # after the draft's prompt pass
                rows.append({"e": e, "m": m, "method": method, "k": k, "total": out.total_s,
                             "draft": out.draft_s, "verify": out.verify_s,
                             "calls": out.target_calls, "alpha": out.alpha(k),
                             "verify_pass": (out.verify_s - out.prefill_s) / (out.target_calls - 1),
                             "draft_pass": (out.draft_s - getattr(out, "draft_prefill_s", 0.0))
                             / passes if passes > 0 else float("nan")})
            else:
                model = target if method == "target" else draft
                out = engine.autoregressive(model, prompts[p], 64, s, gen(seed))
                rows.append({"e": e, "m": m, "method": method, "k": 0, "total": out.total_s,
                             "step": (out.total_s - out.prefill_s) / 63,
                             "fwd": (out.verify_s - out.prefill_s) / 63})
    return rows


def report(rows, engines, ks) -> None:
    med = statistics.median
    for m in MODES:
        print(f"\n== {m}")
        for e in engines:
            def sel(method, k=0, e=e, m=m):
                want = (e, m, method, k)
                return [r for r in rows if (r["e"], r["m"], r["method"], r["k"]) == want]
            step, fwd = ({w: med([r[key] for r in sel(w)]) for w in ("target", "draft")}
                         for key in ("step", "fwd"))
            c, base = step["draft"] / step["target"], med([r["total"] for r in sel("target")])
            print(f"{e}: target step {step['target'] * 1e3:.3f} ms, draft step "
                  f"{step['draft'] * 1e3:.3f} ms, c = {c:.3f}")
            for k in ks:
                rs = sel("spec", k)
                alpha, total = med([r["alpha"] for r in rs]), med([r["total"] for r in rs])
                per_call = {key: med([r[key] / r["calls"] for r in rs])
                            for key in ("total", "draft", "verify")}
                host = per_call["total"] - per_call["draft"] - per_call["verify"]
                measured, predicted = base / total, expected_speedup(alpha, k, c)
                extra_draft = per_call["draft"] - k * fwd["draft"]
                extra_verify = per_call["verify"] - fwd["target"]
                extra_host = (host - k * (step["draft"] - fwd["draft"])
                              - (step["target"] - fwd["target"]))
                verify = med([r["verify_pass"] for r in rs]) / fwd["target"]
                in_loop = med([r["draft_pass"] for r in rs]) / fwd["draft"]
                # Leviathan's iteration with the two passes at their measured prices, no more host
                costed = expected_tokens_per_call(alpha, k) * step["target"] / (
                    k * (step["draft"] + (in_loop - 1) * fwd["draft"]) + step["target"]
                    + (verify - 1) * fwd["target"])
                print(f"  K={k} alpha {alpha:.3f} measured {measured:.3f} predicted "
                      f"{predicted:.3f} ratio {measured / predicted:.3f} | verify {verify:.2f}, "
                      f"draft {in_loop:.2f}, costed {costed:.3f} (ratio {measured / costed:.3f}), "
                      f"host share {host / per_call['total']:.3f} | iteration "
                      f"{per_call['total'] * 1e3:.2f} ms, predicted "
                      f"{step['target'] * (1 + k * c) * 1e3:.2f}; beyond it: draft passes "
                      f"{extra_draft * 1e3:+.2f}, K+1-token verification {extra_verify * 1e3:+.2f}"
                      f", host {extra_host * 1e3:+.2f} (all host time {host * 1e3:.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="4f47135^", help="the older engine's commit")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--models", default="results/models")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = models.load(f"{args.models}/target", "cpu", "float32", role="target")
    draft = models.load(f"{args.models}/draft", "cpu", "float32", role="draft")
    prompts = heldout_prompts(f"{args.models}/target", 4, 32, 20261130)
    engines = {"before": engine_at(args.before), "now": current}
    start = time.time()
    rows = run_grid(engines, target, draft, prompts, args.reps, args.ks)
    print(f"{args.threads} threads, {args.reps} reps, {time.time() - start:.0f} s, "
          f"load {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    report(rows, engines, args.ks)


if __name__ == "__main__":
    main()
