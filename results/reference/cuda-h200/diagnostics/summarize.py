"""The step-up diagnosis in numbers: per experiment, the cache-on runs the onset rule tested and
flagged, their onsets, and how much the step, the host's launch wall time and its launch CPU time
rose (medians); and, from cProfile, the functions whose own time per step differs most between a
run that steps up and one that does not. Run from the repo root; writes summary.csv and
profile.csv beside this file."""
import json
import pstats
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, "src")
from decodelab.studies.sweep import onsets  # noqa: E402

HERE = Path(__file__).parent
ONSETS = yaml.safe_load(Path("config/gpu.yaml").read_text())["regimes"]["onsets"]
SETTINGS = (ONSETS["factor"], ONSETS["baseline"], ONSETS["run"])


def sweep_rows(name: str) -> dict:
    runs = pd.concat([pd.read_parquet(p) for p in sorted((HERE / name).glob("*.parquet"))])
    found = onsets.find_onsets(runs.assign(experiment="sweep"), *SETTINGS)
    hit = found[found["onset"] >= 0]
    return {"experiment": name, "models": " ".join(sorted(runs["model"].unique())),
            "tested": len(found), "flagged": len(hit),
            "flagged_models": " ".join(sorted(hit["model"].unique())),
            "onsets": " ".join(str(o) for o in sorted(hit["onset"].unique())),
            "step_up": hit["step_up"].median(), "launch_up": hit["launch_up"].median(),
            "launch_cpu_up": hit["launch_cpu_up"].median(),
            "sm_clock_min_mhz": runs["sm_clock_min_mhz"].min(), **host_activity(runs, found)}


def host_activity(runs: pd.DataFrame, found: pd.DataFrame) -> dict:
    """`instrument` only: Python garbage collections after the onset in flagged runs, and the
    caching allocator's device allocations, frees and syncs in any run."""
    if "gc_t" not in runs:
        return {}
    keys = ["model", "dtype", "budget", "inner"]
    both = runs[runs["use_cache"]].merge(found[found["onset"] >= 0], on=keys)
    after = [int((np.asarray(r["gc_t"]) > r["prefill_s"] + np.sum(r["step_s"][:r["onset"]])).sum())
             for _, r in both.iterrows()]
    return {"gc_after_onset_max": max(after),
            **{f"device_{k}_max": int(runs[f"alloc_num_{c}"].max())
               for k, c in (("allocs", "device_alloc"), ("frees", "device_free"),
                            ("syncs", "sync_all_streams"))}}


def isolated_rows() -> list[dict]:
    raw = json.loads((HERE / "isolated" / "diag.json").read_text())["raw"]
    rows = []
    for cond in dict.fromkeys(r["cond"] for r in raw):
        runs = [r for r in raw if r["cond"] == cond]
        at = [onsets.onset(r["wall"], *SETTINGS) for r in runs]
        ups = [onsets.ratio_after(r["wall"], a, SETTINGS[1])
               for r, a in zip(runs, at, strict=True) if a >= 0]
        rows.append({"experiment": f"isolated/{cond}", "tested": len(runs),
                     "flagged": sum(a >= 0 for a in at),
                     "onsets": " ".join(str(a) for a in sorted(set(at)) if a >= 0),
                     "step_up": np.median(ups) if ups else np.nan})
    return rows


def per_step(name: str, steps: int) -> pd.DataFrame:
    """cProfile's own time and calls per decode step, by function."""
    stats = pstats.Stats(str(HERE / "profile" / f"{name}.prof")).stats
    return pd.DataFrame([{"function": f"{Path(file).name}:{line}:{func}", "calls": v[1] / steps,
                          "own_ms": 1e3 * v[2] / steps}
                         for (file, line, func), v in stats.items()]).set_index("function")


def profile_rows(top: int = 5) -> pd.DataFrame:
    """gpt2 float16, rep 0: budget 256 steps up from step 63, budget 128 does not."""
    up, flat = per_step("gpt2-torch.float16-02-b256", 255), per_step("gpt2-torch.float16-04-b128",
                                                                     127)
    both = up.add_suffix("_stepping_up").join(flat.add_suffix("_flat"), how="outer").fillna(0)
    both["own_ms_added"] = both["own_ms_stepping_up"] - both["own_ms_flat"]
    return both.sort_values("own_ms_added", ascending=False).head(top).reset_index()


if __name__ == "__main__":
    table = pd.DataFrame([*(sweep_rows(n) for n in ("launch", "noprobe", "onceprobe",
                                                     "instrument", "nocudnn", "profile")),
                          *isolated_rows()])
    table.to_csv(HERE / "summary.csv", index=False, float_format="%.3g")
    print(table.to_string(index=False))
    profile = profile_rows()
    profile.to_csv(HERE / "profile.csv", index=False, float_format="%.3g")
    print(profile.to_string(index=False))
