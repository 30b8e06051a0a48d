import numpy as np
import pandas as pd

from decodelab.analysis import stability, stats
from decodelab.config.settings import Confidence, Stability
from decodelab.studies.sweep import tables as sweep_tables

CI = Confidence(0.95, 1000, 0)


def runs(off_scale: float, n_proc: int = 5, seed: int = 0) -> pd.DataFrame:
    """Raw-run rows: cache-on latency ~10 ms, cache-off `off_scale` times that."""
    rng = np.random.default_rng(seed)
    rows = []
    for repeat in range(n_proc):
        for use_cache, scale in ((True, 1.0), (False, off_scale)):
            for inner in range(2):
                total = 0.010 * scale * rng.lognormal(0, 0.05)
                rows.append({"experiment": "ablation", "backend": "cpu", "model": "m",
                             "family": "gpt2", "dtype": "float32", "prompt_len": 8,
                             "use_cache": use_cache, "budget": 16, "repeat": repeat,
                             "inner": inner, "prefill_s": total / 4, "decode_s": 3 * total / 4,
                             "total_s": total, "decode_per_token_s": 3 * total / 60})
    return pd.DataFrame(rows)


def judged(runs: pd.DataFrame) -> pd.DataFrame:
    return stability.verdicts(runs, stats.SWEEP, Stability())


def test_per_process_reduces_inner_repeats_to_one_row():
    assert len(stats.per_process(runs(2.0))) == 5 * 2


def test_latency_ci_brackets_the_median():
    r = runs(2.0)
    table = sweep_tables.latency_table(r, CI, judged(r))
    assert set(table["metric"]) == set(stats.METRICS)
    assert (table["ci_low"] <= table["median"]).all()
    assert (table["median"] <= table["ci_high"]).all()
    assert (table["n"] == 5).all()


def test_kv_speedup_recovers_a_planted_ratio():
    r = runs(3.0)
    table = sweep_tables.kv_speedup_table(r, CI, judged(r))
    total = table[table["metric"] == "total_s"].iloc[0]
    assert 2.7 < total["speedup"] < 3.3
    assert total["ci_low"] <= total["speedup"] <= total["ci_high"]


def test_kv_speedup_ci_covers_one_when_the_cache_does_nothing():
    r = runs(1.0, n_proc=8)
    table = sweep_tables.kv_speedup_table(r, CI, judged(r))
    total = table[table["metric"] == "total_s"].iloc[0]
    assert total["ci_low"] <= 1.0 <= total["ci_high"]


def test_a_single_process_gives_a_zero_width_interval():
    r = runs(2.0, n_proc=1)
    table = sweep_tables.latency_table(r, CI, judged(r))
    assert (table["ci_low"] == table["ci_high"]).all()


def per_resample_ci(statistic, samples, ci: Confidence) -> tuple[float, float]:
    """The bootstrap as scipy gives it with one statistic call per resample."""
    res = stats.st.bootstrap(samples, statistic, n_resamples=ci.bootstrap_resamples,
                             confidence_level=ci.confidence, method="percentile",
                             vectorized=False, paired=False, rng=np.random.default_rng(ci.seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def test_the_vectorized_bootstrap_gives_the_per_resample_interval_exactly():
    rng = np.random.default_rng(3)
    for trial in range(18):
        off, on = (np.exp(rng.normal(0, 0.3, n)) for n in rng.integers(2, 12, 2))
        if trial % 3 == 0:  # ties between resampled values
            off, on = np.round(off, 1), np.round(on, 1)
        for statistic, samples in ((stats.median_ratio, (off, on)), (np.median, (off,))):
            assert statistic in stats.VECTORIZED
            assert stats.bootstrap_ci(statistic, samples, CI) == \
                per_resample_ci(statistic, samples, CI), (trial, statistic)
    # the comparison can fail: another statistic on the same resamples gives another interval
    off, on = np.exp(rng.normal(0, 0.3, 7)), np.exp(rng.normal(0, 0.3, 7))
    assert stats.bootstrap_ci(stats.median_ratio, (off, on), CI) != \
        per_resample_ci(lambda a, b: np.mean(a) / np.mean(b), (off, on), CI)
