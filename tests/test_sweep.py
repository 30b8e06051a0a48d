import pytest
from transformers import AutoConfig

from decodelab.backends.devices import config_hash
from decodelab.config.settings import SweepJob
from decodelab.core.errors import DecodelabError
from decodelab.studies.sweep import run as sweep

SPEC = {"budgets": [4, 8], "prompt_lengths": [6], "dtype": "float32", "inner_repeats": 2,
        "warmup": 1, "seed": 11}


def job(**changes) -> SweepJob:
    return SweepJob.from_spec(SPEC | changes)


def test_the_typed_job_hashes_as_the_json_it_was_read_from():
    for spec in (SPEC, SPEC | {"sdp_backends": ["math"], "engine": "eager"}):
        assert config_hash(SweepJob.from_spec(spec).job_spec()) == config_hash(spec)


def test_grid_covers_every_configuration_once_per_inner_repeat():
    grid = sweep.make_grid([8, 16], [4, 32], [True, False], 3)
    assert len(grid) == 2 * 2 * 2 * 3
    assert len({tuple(sorted(c.items())) for c in grid}) == len(grid)


def test_shuffle_is_seeded_and_a_permutation():
    grid = sweep.make_grid(range(2, 40), [8], [True], 1)
    assert sweep.shuffled(grid, 5) == sweep.shuffled(grid, 5)
    assert sweep.shuffled(grid, 5) != sweep.shuffled(grid, 6)
    assert sorted(sweep.shuffled(grid, 5), key=lambda c: c["budget"]) == grid


def test_prompts_are_identical_across_calls_and_devices():
    a = sweep.make_prompt(100, 16, seed=3, device="cpu")
    assert a.equal(sweep.make_prompt(100, 16, seed=3, device="cpu"))
    assert not a.equal(sweep.make_prompt(100, 16, seed=4, device="cpu"))


def test_position_overrun_is_a_clear_error(model_dir):
    config = AutoConfig.from_pretrained(model_dir)
    with pytest.raises(DecodelabError, match="position table has 1024 rows"):
        sweep.check_positions(config, [1000], [32], "gpt2-tiny")
    sweep.check_positions(config, [992], [32], "gpt2-tiny")


def test_ablation_rows_carry_timings_memory_and_provenance(model_dir):
    df = sweep.run(str(model_dir), "gpt2-tiny", "cpu", job(), repeat=1, experiment="ablation",
                   progress=False)
    assert len(df) == 2 * 2 * 2  # budgets x cache on/off x inner repeats
    assert set(df["use_cache"]) == {True, False}
    assert sorted(df["order"]) == list(range(len(df)))
    assert (df["total_s"] > 0).all()
    assert (df["total_s"] - df["prefill_s"] - df["decode_s"]).abs().max() < 1e-9
    assert (df["tokens_generated"] == df["budget"]).all()
    for col in ("step_s", "step_launch_s", "step_launch_cpu_s"):
        assert (df[col].map(len) == df["budget"] - 1).all(), col
    assert (df["rss_bytes"] > 0).all()
    assert (df["step_sm_clock_mhz"].map(len) == 0).all()  # no GPU clock off CUDA
    assert df["sm_clock_median_mhz"].isna().all()
    for col in ("hostname", "device_name", "torch", "transformers", "git_commit", "config_hash",
                "timestamp", "seed", "shuffle_seed", "family", "parameters", "source",
                "device_index"):
        assert df[col].notna().all(), col
    assert df["family"].iloc[0] == "gpt2" and df["source"].iloc[0] == "init"


def test_sweep_measures_cache_on_only(model_dir):
    df = sweep.run(str(model_dir), "gpt2-tiny", "cpu", job(), repeat=0, experiment="sweep",
                   progress=False)
    assert df["use_cache"].all() and len(df) == 4


def test_several_dtypes_are_measured_in_one_process_each_with_its_own_order(model_dir):
    spec = job(dtype=["float32", "bfloat16"], inner_repeats=1)
    df = sweep.run(str(model_dir), "gpt2-tiny", "cpu", spec, repeat=0, experiment="sweep",
                   progress=False)
    assert sorted(df["dtype"].unique()) == ["bfloat16", "float32"]
    assert (df.groupby("dtype").size() == 2).all()
    assert df.groupby("dtype")["shuffle_seed"].first().nunique() == 2


def test_a_sweep_applies_its_attention_backends_before_measuring(model_dir, monkeypatch):
    applied = []
    monkeypatch.setattr(sweep, "set_sdp_backends", applied.append)
    for extra in ({}, {"sdp_backends": ["math"]}):
        sweep.run(str(model_dir), "gpt2-tiny", "cpu", job(budgets=[4], **extra), repeat=0,
                  experiment="sweep", progress=False)
    assert applied == [None, ("math",)]
