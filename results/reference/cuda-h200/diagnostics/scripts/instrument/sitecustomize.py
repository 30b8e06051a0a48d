"""Per sweep run: Python's garbage collections (time-stamped, by generation) and the CUDA caching
allocator's counters, to see what the host does in the steps after a step-up. No clock probe."""
import gc
import time

import torch

import decodelab.backends.devices as d
import decodelab.studies.sweep.run as s

d.sm_clock_probe = lambda device: None
s.sm_clock_probe = d.sm_clock_probe
events = []


def on_gc(phase, info):
    events.append((time.perf_counter(), phase, info.get("generation", -1),
                   info.get("collected", 0)))


gc.callbacks.append(on_gc)
COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams",
            "allocation.all.allocated", "segment.all.allocated")
measure = s.measure


def instrumented(model, prompt, cfg, device, probe=None):
    events.clear()
    before = torch.cuda.memory_stats()
    start = time.perf_counter()
    row = measure(model, prompt, cfg, device, None)
    after = torch.cuda.memory_stats()
    for k in COUNTERS:
        row["alloc_" + k.replace(".", "_")] = float(after.get(k, 0) - before.get(k, 0))
    row["gc_t"] = [t - start for t, phase, _, _ in events if phase == "start"]
    row["gc_gen"] = [g for _, phase, g, _ in events if phase == "start"]
    stops = [t for t, phase, _, _ in events if phase == "stop"]
    row["gc_s"] = [b - a for a, b in zip(row["gc_t"], [t - start for t in stops], strict=False)]
    return row


s.measure = instrumented
