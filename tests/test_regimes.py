import numpy as np
import pandas as pd
import pytest
from scipy import stats

from decodelab.analysis.regimes import OUTPUT_COLUMNS, detect_spikes, local_trend, theil_sen

BUDGETS = np.array([8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512], dtype=float)
LINEAR = 40.0 + 2.5 * BUDGETS  # prefill + per-token cost, ms
CONVEX = 30.0 + 1.0 * BUDGETS + 0.01 * BUDGETS**2  # cache-off decoding: quadratic growth


def make_frame(
    base: np.ndarray,
    seed: int = 0,
    repeats: int = 3,
    noise: float = 0.05,
    spikes: dict[int, float] | None = None,
    spike_repeats: list[int] | None = None,
    budgets: np.ndarray = BUDGETS,
    **group: str,
) -> pd.DataFrame:
    """Tidy frame of `repeats` curves: base * lognormal noise, times spikes[i] at budget index i."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(repeats):
        values = base * rng.lognormal(0.0, noise, len(base)) if noise else base.copy()
        if spike_repeats is None or r in spike_repeats:
            for i, factor in (spikes or {}).items():
                values[i] *= factor
        pairs = zip(budgets, values, strict=True)
        rows += [{**group, "budget": b, "repeat": r, "ms": v} for b, v in pairs]
    return pd.DataFrame(rows)


def flagged(out: pd.DataFrame) -> set[float]:
    return set(out.loc[out["spike"], "budget"])


@pytest.mark.parametrize("seed", range(10))
def test_planted_spikes_are_found_including_curve_end(seed):
    repeats = 3 + seed % 3
    df = make_frame(LINEAR, seed, repeats, noise=0.05, spikes={3: 3.0, 6: 21.0, 11: 3.0})
    out = detect_spikes(df, "ms", by=[])
    assert flagged(out) == {32.0, 96.0, 512.0}
    row = out.set_index("budget").loc[96.0]
    assert 15 < row["ratio_median"] < 30
    assert row["n_repeats"] == repeats and row["frac_above"] == 1.0 and row["p_value"] < 0.05


@pytest.mark.parametrize("index", [2, 3, len(BUDGETS) - 4, len(BUDGETS) - 3])
@pytest.mark.parametrize("factor", [3.0, 21.0])
def test_spike_near_curve_end_leaves_the_end_alone(index, factor):
    # The end budget's trend is an extrapolation from three points; a spike among them tilts the
    # line and, without the refit that leaves such budgets out, made the end a phantom spike
    # (ratio 1.5 to 3.9 here).
    df = make_frame(LINEAR, seed=index, repeats=3, noise=0.02, spikes={index: factor})
    out = detect_spikes(df, "ms", by=[])
    assert flagged(out) == {BUDGETS[index]}
    assert out["ratio_median"].drop(index).max() < 1.2


@pytest.mark.parametrize("name, base", [("linear", LINEAR), ("convex", CONVEX)])
def test_negative_control_smooth_curves_flag_nothing(name, base):
    false_alarms = []
    for seed in range(50):
        df = make_frame(base, seed, repeats=3 + seed % 3, noise=0.10)
        out = detect_spikes(df, "ms", by=[])
        false_alarms += [(seed, b) for b in flagged(out)]
    assert false_alarms == [], f"{name}: spikes flagged on a smooth curve: {false_alarms}"


def test_spike_in_one_repeat_of_five_is_not_flagged():
    df = make_frame(LINEAR, seed=1, repeats=5, spikes={6: 21.0}, spike_repeats=[0])
    for consistency in (1.0, 0.2):  # even a lax consistency needs the median above threshold
        row = detect_spikes(df, "ms", by=[], consistency=consistency).set_index("budget").loc[96.0]
        assert not row["spike"]
        assert row["frac_above"] == pytest.approx(0.2)
        assert row["ratio_median"] < 1.5
    everywhere = make_frame(LINEAR, seed=1, repeats=5, spikes={6: 21.0})
    assert flagged(detect_spikes(everywhere, "ms", by=[])) == {96.0}


def test_consistency_is_required_beyond_the_median():
    df = make_frame(LINEAR, seed=2, repeats=5, spikes={6: 21.0}, spike_repeats=[0, 1, 2, 3])
    strict = detect_spikes(df, "ms", by=[]).set_index("budget").loc[96.0]
    assert strict["ratio_median"] > 15 and strict["p_value"] < 0.05  # all but consistency
    assert strict["frac_above"] == pytest.approx(0.8) and not strict["spike"]
    assert flagged(detect_spikes(df, "ms", by=[], consistency=0.8)) == {96.0}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("name, base", [("linear", LINEAR), ("flat", np.full(len(BUDGETS), 20.0))])
def test_step_change_is_not_a_spike(seed, name, base):
    # A sustained regime shift from budget index 6 (96) on. At the step's first budget the trend
    # is a compromise between the two levels (ratio up to ~3 whatever the height, on this grid);
    # past it the trend follows the new level. So a 2x step flags nothing and a 21x step at most
    # its first budget (noise-free ratio there: ~2.8 on the flat curve, ~1.6 on the linear one).
    for height, allowed in ((2.0, set()), (21.0, {96.0})):
        step = {i: height for i in range(6, len(BUDGETS))}
        out = detect_spikes(make_frame(base, seed, repeats=3, spikes=step), "ms", by=[])
        assert flagged(out) <= allowed, (name, height)


def test_local_trend_on_linear_curve_returns_the_curve():
    np.testing.assert_allclose(local_trend(BUDGETS, LINEAR, window=2), LINEAR, rtol=1e-12)
    perm = np.random.default_rng(0).permutation(len(BUDGETS))  # any input order
    np.testing.assert_allclose(local_trend(BUDGETS[perm], LINEAR[perm], 3), LINEAR[perm])
    np.testing.assert_allclose(local_trend(BUDGETS, LINEAR, window=1), LINEAR)


def test_local_trend_small_curves_and_convex_ends():
    np.testing.assert_array_equal(local_trend(np.array([8.0, 16.0]), np.array([1.0, 3.0]), 2),
                                  [3.0, 1.0])  # single neighbour: its value
    assert np.isnan(local_trend(np.array([8.0]), np.array([1.0]), 2)).all()
    # A Theil-Sen line through (16, 24, 32) extrapolates budget**2 to a negative value at 8; the
    # trend must stay positive or the ratio is meaningless.
    quad = BUDGETS**2
    trend = local_trend(BUDGETS, quad, 2)
    assert (trend > 0).all() and (quad / trend < 1.5).all()
    with pytest.raises(ValueError, match="unique"):
        local_trend(np.array([8.0, 8.0, 16.0]), np.array([1.0, 1.0, 2.0]), 2)


def test_groups_are_kept_apart():
    df = pd.concat([
        make_frame(LINEAR, 0, spikes={6: 21.0}, backend="mps", cache="on"),
        make_frame(LINEAR, 1, backend="mps", cache="off"),
        make_frame(LINEAR, 2, spikes={3: 5.0}, backend="cpu", cache="on"),
        make_frame(LINEAR[:2], 3, budgets=BUDGETS[:2], backend="cpu", cache="off"),
    ])
    out = detect_spikes(df, "ms", by=["backend", "cache"])
    assert list(out.columns) == ["backend", "cache", *OUTPUT_COLUMNS]
    assert len(out) == 3 * len(BUDGETS) + 2
    spikes = {(r.backend, r.cache, r.budget) for r in out.itertuples() if r.spike}
    assert spikes == {("mps", "on", 96.0), ("cpu", "on", 32.0)}

    short = out[(out["backend"] == "cpu") & (out["cache"] == "off")]
    assert short["ratio_median"].isna().all() and not short["spike"].any()
    assert (short["n_repeats"] == 0).all()
    assert (out["metric"] == "ms").all()


def test_repeated_rows_are_median_reduced():
    base = make_frame(LINEAR, noise=0.0, repeats=3)
    reps = [base.assign(ms=base["ms"] * f) for f in (1.0, 1.01, 1.02)]
    outlier = base.assign(ms=base["ms"] * np.where(base["budget"] == 96.0, 50.0, 1.03))
    df = pd.concat([*reps, outlier])  # 4 rows per cell; a mean would make 96 a ~13x spike

    out = detect_spikes(df, "ms", by=[]).set_index("budget")
    assert not out["spike"].any()
    expected = LINEAR * 1.015  # median of (1.0, 1.01, 1.02, x >= 1.03)
    np.testing.assert_allclose(out["value_median"], expected)
    np.testing.assert_allclose(out["ratio_median"], 1.0)


def test_p_value_gates_only_from_three_repeats():
    def frame(factors: list[float]) -> pd.DataFrame:
        parts = [make_frame(LINEAR, noise=0.0, repeats=1, spikes={6: f}).assign(repeat=r)
                 for r, f in enumerate(factors)]
        return pd.concat(parts)

    def row(factors: list[float]) -> pd.Series:
        return detect_spikes(frame(factors), "ms", by=[]).set_index("budget").loc[96.0]

    spread = row([1.6, 1.7, 6.0])  # every repeat >= 1.5, but too scattered to reject <= 1.5
    assert spread["frac_above"] == 1.0 and spread["p_value"] > 0.05 and not spread["spike"]
    tight = row([3.0, 3.1, 2.9])
    assert tight["p_value"] < 0.05 and tight["spike"]
    exact = row([3.0, 3.0, 3.0])  # zero spread: p-value defined, not NaN
    assert exact["p_value"] == 0.0 and exact["spike"]
    two = row([1.6, 6.0])
    assert not np.isnan(two["p_value"]) and two["spike"]  # no p requirement below 3 repeats
    one = row([1.6])
    assert np.isnan(one["p_value"]) and one["spike"] and one["n_repeats"] == 1


def test_bad_input_is_refused():
    df = make_frame(LINEAR)
    with pytest.raises(ValueError, match="missing columns"):
        detect_spikes(df.drop(columns="repeat"), "ms", by=[])
    with pytest.raises(ValueError, match="positive"):
        detect_spikes(df.assign(ms=-df["ms"]), "ms", by=[])


def test_theil_sen_is_scipys_joint_fit_to_the_bit():
    rng = np.random.default_rng(3)
    for _ in range(300):
        n = int(rng.integers(2, 12))
        x = np.sort(rng.choice(2000, n, replace=False)).astype(float)
        y = rng.random(n) * rng.choice([1e-4, 1.0, 1e3])
        expected = stats.theilslopes(y, x, method="joint")
        assert theil_sen(x, y) == (expected.slope, expected.intercept)
    x, y = np.array([1.0, 2.0, 3.0]), np.array([1.0, 5.0, 4.0])
    separate = stats.theilslopes(y, x, method="separate")
    assert theil_sen(x, y)[1] != separate.intercept  # the joint intercept, not the separate one
