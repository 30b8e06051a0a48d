"""Where do the H200 step-ups come from? Per decode step: wall time (sync + perf_counter, as the
harness), GPU time (CUDA events around the forward), this thread's CPU time, and the cgroup's
throttle counters per run. Conditions vary the probe, gc, prompt length and family."""
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache

sys.path.insert(0, "src")
from decodelab.backends.devices import sm_clock_probe  # noqa: E402
from decodelab.backends.models import preset_config  # noqa: E402
from decodelab.engines.decode import decode, forward_logits  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp"))
dev = torch.device(os.environ.get("DIAG_DEVICE", "cuda"))
CUDA = dev.type == "cuda"
deadline = time.time() + float(sys.argv[1] if len(sys.argv) > 1 else 240)


def cgroup_stat():
    for p in ("/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpu/cpu.stat"):
        if os.path.exists(p):
            return dict(line.split() for line in open(p).read().splitlines())
    return {}


def model_for(preset, dtype=torch.float16):
    torch.manual_seed(1)
    m = AutoModelForCausalLM.from_config(preset_config(preset), dtype=dtype)
    return m.to(dev).eval()


@torch.inference_mode()
def instrumented(model, prompt, budget, use_gc=True):
    """decode() with the cache on, plus GPU event time and thread CPU time per step."""
    if not use_gc:
        gc.disable()
    cache = DynamicCache(config=model.config)
    token = forward_logits(model, prompt, cache).argmax(-1, keepdim=True)
    if CUDA:
        torch.cuda.synchronize()
    wall, gpu, cpu = [], [], []
    for _ in range(budget - 1):
        t0, c0 = time.perf_counter(), time.thread_time()
        if CUDA:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        token = forward_logits(model, token, cache).argmax(-1, keepdim=True)
        if CUDA:
            e1.record()
        c1 = time.thread_time()
        if CUDA:
            torch.cuda.synchronize()
        wall.append(time.perf_counter() - t0)
        cpu.append(c1 - c0)  # CPU time to launch the step, before the wait
        gpu.append(e0.elapsed_time(e1) / 1e3 if CUDA else wall[-1])
    gc.enable()
    return wall, gpu, cpu


def onset(s, factor=2.5, base=8, run=8):
    s = np.asarray(s)
    slow = s > factor * np.median(s[:base])
    for i in range(base, len(s) - run + 1):
        if slow[i:i + run].all():
            while i > 0 and slow[i - 1]:
                i -= 1
            return i
    return -1


def summary(name, wall, gpu=None, cpu=None, extra=None):
    at = onset(wall)
    row = {"cond": name, "onset": at, "n": len(wall),
           "wall_ms_before": 1e3 * float(np.median(wall[:at if at > 0 else None])),
           "wall_ms_after": 1e3 * float(np.median(wall[at:])) if at >= 0 else None}
    for key, s in (("gpu", gpu), ("cpu", cpu)):
        if s is not None:
            row[f"{key}_ms_before"] = 1e3 * float(np.median(s[:at if at > 0 else None]))
            row[f"{key}_ms_after"] = 1e3 * float(np.median(s[at:])) if at >= 0 else None
    row.update(extra or {})
    print(json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}),
          flush=True)
    return row


rows, raw = [], []
gen = torch.Generator().manual_seed(0)
conditions = [  # (name, preset, prompt_len, budget, how)
    ("harness+probe", "gpt2", 32, 256, "probe"),
    ("harness", "gpt2", 32, 256, "plain"),
    ("instrumented", "gpt2", 32, 256, "inst"),
    ("instrumented-nogc", "gpt2", 32, 256, "nogc"),
    ("instrumented-prompt20", "gpt2", 20, 256, "inst"),
    ("instrumented-opt", "opt-125m", 32, 256, "inst"),
    ("instrumented-bloom", "bloom-560m", 32, 256, "inst"),
]
models = {}
for rnd in range(6):
    for name, preset, plen, budget, how in conditions:
        if time.time() > deadline:
            break
        model = models.get(preset) or models.setdefault(preset, model_for(preset))
        prompt = torch.randint(0, 50000, (1, plen), generator=gen).to(dev)
        if rnd == 0 and name.startswith("harness+"):
            for _ in range(2):  # warm-up, as the sweep does
                decode(model, prompt, 16)
        before = cgroup_stat()
        if how in ("probe", "plain"):
            probe = sm_clock_probe(dev) if how == "probe" else None
            out = decode(model, prompt, budget, probe=probe)
            wall, gpu, cpu = out.step_s, None, None
        else:
            wall, gpu, cpu = instrumented(model, prompt, budget, use_gc=how != "nogc")
        after = cgroup_stat()
        thr = {k: int(after.get(k, 0)) - int(before.get(k, 0))
               for k in ("nr_throttled", "throttled_usec", "throttled_time")}
        rows.append(summary(name, wall, gpu, cpu, {"round": rnd, **thr}))
        raw.append({"cond": name, "round": rnd, "wall": wall, "gpu": gpu, "cpu": cpu})
print("cgroup", cgroup_stat(), "loadavg", os.getloadavg(), "cpus", os.cpu_count())
json.dump({"rows": rows, "raw": raw}, open(OUT / "diag.json", "w"))
