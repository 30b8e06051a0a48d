"""Floor variants for gpt2-xl and gpt2 (fp16, init weights), side by side with `compiled` in one
process: attention on SDPA's math backend, Conv1D weights in the Linear layout, and
coordinate-descent tuning. Run from the repository root (floor2.sh). Since the run: reformatted
for the linter, and its Conv1D swap and backend switch moved into the project (the same code):
`as_linears` into decodelab.engines.cuda.fused, `math_attention` into scripts/gpu_pair.py.
Usage: floor2.py OUT VARIANTS PRESETS SECONDS"""

import copy
import sys
import time

import pandas as pd
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, "scripts")
import gpu_pair as gp  # noqa: E402

from decodelab.backends import sources  # noqa: E402
from decodelab.engines.cuda import graphs
from decodelab.engines.cuda.fused import as_linears  # noqa: E402
from decodelab.engines.decode import decode  # noqa: E402

CDT = {"coordinate_descent_tuning": True}
# compiled_math reused compiled's compilation (same model object: dynamo's guards passed), so it
# ran the memory-efficient kernel like compiled; the other variants compiled afresh.
VARIANTS = {"compiled": (None, {}, False), "compiled_math": (None, {}, True),
            "linear_math": (as_linears, {}, True), "inner": (as_linears, CDT, False),
            "inner_math": (as_linears, CDT, True)}


@torch.inference_mode()
def main(out, names, presets, deadline):
    end = time.monotonic() + deadline
    torch.backends.cuda.enable_cudnn_sdp(False)
    rows, top = [], []
    for preset in presets:
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(sources.preset_config(preset),
                                                     dtype=torch.float16).eval()
        wb = sum(p.numel() * p.element_size() for p in model.parameters())
        measured = gp.copy_bandwidth("cuda")
        prompt = torch.randint(0, model.config.vocab_size, (1, 32), device="cuda")
        for name in names:
            if time.monotonic() > end - (100 if preset == "gpt2-xl" else 40):
                print("SKIP", preset, name, flush=True)
                continue
            swap, opts, math = VARIANTS[name]
            m = swap(copy.deepcopy(model)) if swap else model
            engine = graphs.Engine(m, capture=True, max_len=32 + 256, compile=opts)
            t = time.perf_counter()
            with gp.math_attention(math):
                decode(engine, prompt, 16)
            print(preset, name, "warm-up", round(time.perf_counter() - t, 1), flush=True)
            steps = []
            for _ in range(3):
                o = decode(engine, prompt, 256)
                steps.append(float(pd.Series(o.step_s).median()))
            k = gp.step_kernels(engine, prompt, 16, True)
            long = gp.device_time(engine, prompt, 18, True)
            for kname, (c, s) in sorted(long.items(), key=lambda x: -x[1][1])[:12]:
                top.append({"model": preset, "variant": name, "kernel": kname[:150], "calls": c,
                            "s": s, "kind": gp.kernel_kind(kname)})
            peak = gp.peak_bandwidth("cuda")
            for r, st in enumerate(steps):
                rows.append(k | {"model": preset, "variant": name, "repeat": r, "step_s": st,
                                 "weight_bytes": wb, "copy_bandwidth": measured,
                                 "over_measured_floor": st * measured / wb,
                                 "over_peak_floor": st * peak / wb})
            print(preset, name, f"{min(steps)*1e3:.3f} ms, {min(steps)*measured/wb:.2f}x copy "
                  f"floor, {min(steps)*peak/wb:.2f}x peak; "
                  + ", ".join(f"{kk} {v*1e3:.3f}" for kk, v in k.items()), flush=True)
            pd.DataFrame(rows).to_csv(f"{out}/variants.csv", index=False)
            pd.DataFrame(top).to_csv(f"{out}/top_kernels.csv", index=False)
            del engine, m
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), float(sys.argv[4]))
