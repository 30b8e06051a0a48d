"""Every sweep run under cProfile: its stats file next to the run's rows, to compare what the
host thread does in runs that step up with runs that do not. No clock probe."""
import cProfile
import os
from pathlib import Path

import decodelab.backends.devices as d
import decodelab.studies.sweep.run as s

d.sm_clock_probe = lambda device: None
s.sm_clock_probe = d.sm_clock_probe
OUT = Path(os.environ.get("PROFILE_DIR", "/tmp/profiles"))
measure = s.measure
count = {"n": 0}


def profiled(model, prompt, cfg, device, probe=None):
    OUT.mkdir(parents=True, exist_ok=True)
    prof = cProfile.Profile()
    row = prof.runcall(measure, model, prompt, cfg, device, None)
    name = f"{model.config.model_type}-{model.dtype}-{count['n']:02d}-b{cfg['budget']}"
    prof.dump_stats(OUT / f"{name}.prof")
    row["profile"] = name
    count["n"] += 1
    return row


s.measure = profiled
