"""Raw files are taken only when complete: each states the rows its spec makes, and the readers
(collect, spec-stats, verify-stats) refuse a short, unstamped or unreadable one, naming the file,
its counts and how to redo the job."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from decodelab import cli
from decodelab.backends import sources
from decodelab.config.settings import Stability
from decodelab.core.errors import DecodelabError

SWEEP = {"budgets": [4, 8], "prompt_lengths": [6], "dtype": "float32", "inner_repeats": 2,
         "warmup": 1, "seed": 11}
SPEC = {"ks": [1, 3], "modes": ["greedy"], "temperature": 1.0, "top_k": 0, "top_p": 1.0,
        "prompts": 2, "prompt_len": 8, "budget": 8, "hf_assisted": True, "seed": 3}
PAIR = {"target": "target", "draft": "draft", "target_device": "cpu", "draft_device": "cpu",
        "dtype": "float32"}  # as the rule passes it (Pair.job_spec)
PARALLELISM = {"ks": [1, 2], "context": 8, "inner": 2, "dtype": "float32", "seed": 0}
VERIFY = {"k": 2, "alpha": 0.01, "seeds": 2, "seed": 0,
          "exact": {"random_pairs": 1, "vocab_sizes": [2], "concentrations": [1.0],
                    "real_positions": 1, "block_vocab": 2, "block_ks": [1]},
          "monte_carlo": {"draws": 200, "vocab": 4, "block_draws": 100},
          "real": {"tokens": 8, "budget": 4, "top": 2, "prompts": 1, "power_tokens": 8,
                   "greedy_prompts": 1}}  # a job's whole spec; the monte-carlo level reads its own
STATS = {"confidence": 0.9, "bootstrap_resamples": 50, "seed": 0}


@pytest.fixture(scope="module")
def raw(tmp_path_factory, tiny_pair) -> dict[str, Path]:
    """One real raw file of each kind, written by the CLI verbs the rules call."""
    root = tmp_path_factory.mktemp("raw")
    model = root / "gpt2-tiny"
    sources.prepare({"source": "init", "preset": "gpt2-tiny", "seed": 1}, model)
    out = {"sweep": root / "cpu/sweep/gpt2-tiny/rep0.parquet",
           "speculative": root / "speculative/cpu-cpu/rep0.parquet",
           "parallelism": root / "cpu/parallelism/target/rep0.parquet",
           "monte_carlo": root / "verification/monte_carlo.json"}
    calls = [
        ["sweep", "--model-dir", str(model), "--model", "gpt2-tiny", "--backend", "cpu",
         "--experiment", "sweep", "--repeat", "0", "--threads", "1", "--spec", json.dumps(SWEEP)],
        ["speculative", "--target-dir", tiny_pair[0], "--draft-dir", tiny_pair[1], "--pair",
         "cpu-cpu", "--pair-spec", json.dumps(PAIR), "--spec", json.dumps(SPEC), "--repeat", "0",
         "--threads", "1"],
        ["parallelism", "--model-dir", tiny_pair[0], "--model", "target", "--backend", "cpu",
         "--spec", json.dumps(PARALLELISM), "--repeat", "0", "--threads", "1"],
        ["verify", "--level", "monte-carlo", "--spec", json.dumps(VERIFY)],
    ]
    for call, path in zip(calls, out.values(), strict=True):
        assert cli.main([*call, "--out", str(path)]) == 0
    return out


def copy(src: Path, dest: Path) -> Path:
    dest.parent.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(src, dest))


def cut_rows(path: Path, keep: int) -> None:
    """Keep the first rows and the schema (stamp included): a valid, shorter parquet file."""
    table = pq.read_table(path)
    pq.write_table(table.slice(0, keep), path)


def collect(tmp_path: Path, *runs: Path) -> int:
    return cli.main(["collect", "--host", "h", "--out", str(tmp_path / "runs.parquet"),
                     "--environment", str(tmp_path / "environment.csv"), *map(str, runs)])


def spec_stats(tmp_path: Path, runs: Path, parallelism: Path) -> int:
    verdicts = tmp_path / "verdicts_speculative.csv"  # as the verdicts rule writes it
    cli.main(["verdicts", "--study", "speculative", "--spec", json.dumps(Stability().job_spec()),
              "--out", str(verdicts), str(runs)])
    return cli.main(["spec-stats", "--spec", json.dumps(STATS), "--out", str(tmp_path / "stats"),
                     "--runs", str(runs), "--parallelism", str(parallelism),
                     "--verdicts", str(verdicts)])


def error(capsys) -> str:
    return capsys.readouterr().err


def test_collect_refuses_a_sweep_file_cut_to_fewer_rows(raw, tmp_path, capsys):
    short = copy(raw["sweep"], tmp_path / "cpu/sweep/gpt2-tiny/rep0.parquet")
    cut_rows(short, 3)
    assert collect(tmp_path, short) == 2
    err = error(capsys)
    assert f"{short}: holds 3 rows but should hold 4" in err
    assert "2 budgets x 1 prompt length x 1 dtype x 1 cache setting x 2 inner repeats" in err
    assert f"delete {short}" in err and "snakemake --forcerun sweep" in err
    assert not (tmp_path / "runs.parquet").exists()


def test_collect_refuses_a_sweep_file_replaced_by_an_unstamped_one(raw, tmp_path, capsys):
    short = tmp_path / "cpu/sweep/gpt2-tiny/rep0.parquet"
    short.parent.mkdir(parents=True)
    pd.read_parquet(raw["sweep"]).head(3).to_parquet(short, index=False)
    assert collect(tmp_path, short) == 2
    err = error(capsys)
    assert f"{short}: no decodelab.expected_rows stamp" in err
    assert "snakemake --forcerun sweep" in err


def test_a_complete_sweep_file_is_stamped_and_collected(raw, tmp_path):
    meta = pq.read_schema(raw["sweep"]).metadata
    assert meta[b"decodelab.expected_rows"] == b"4"
    assert b"2 budgets" in meta[b"decodelab.spec"]
    assert collect(tmp_path, raw["sweep"]) == 0  # the negative control
    assert len(pd.read_parquet(tmp_path / "runs.parquet")) == 4


def test_a_truncated_sweep_file_names_itself_and_the_redo(raw, tmp_path, capsys):
    broken = copy(raw["sweep"], tmp_path / "cpu/sweep/gpt2-tiny/rep0.parquet")
    broken.write_bytes(broken.read_bytes()[:500])
    assert collect(tmp_path, broken) == 2
    err = error(capsys)
    assert f"{broken}: not a readable parquet file" in err
    assert f"delete {broken} and run snakemake again" in err
    assert "snakemake --forcerun sweep" in err


@pytest.mark.parametrize("kind", ["speculative", "parallelism"])
def test_spec_stats_refuses_a_short_speculative_or_parallelism_file(raw, tmp_path, capsys, kind):
    files = {k: copy(raw[k], tmp_path / k / "rep0.parquet") for k in ("speculative", "parallelism")}
    full = len(pq.read_table(files[kind]))
    cut_rows(files[kind], full - 1)
    assert spec_stats(tmp_path, files["speculative"], files["parallelism"]) == 2
    err = error(capsys)
    assert f"{files[kind]}: holds {full - 1} rows but should hold {full}" in err
    assert f"snakemake --forcerun {kind}" in err
    assert not (tmp_path / "stats").exists()


def test_spec_stats_takes_complete_files_and_their_stamps_say_what_they_hold(raw, tmp_path):
    spec = pq.read_schema(raw["speculative"]).metadata
    assert spec[b"decodelab.expected_rows"] == b"14"  # 2 K x 2 prompts, 3 baselines, HF
    assert (b"4 speculative, 2 autoregressive, 2 autoregressive_stepped, 2 draft_autoregressive, "
            b"4 hf_assisted") in spec[b"decodelab.spec"]
    par = pq.read_schema(raw["parallelism"]).metadata
    assert par[b"decodelab.expected_rows"] == b"6"  # 1, 2 and 3 tokens x 2 inner repeats
    assert spec_stats(tmp_path, raw["speculative"], raw["parallelism"]) == 0
    assert (tmp_path / "stats/speculative_parallelism.csv").exists()


def test_a_truncated_speculative_file_names_itself_and_the_redo(raw, tmp_path, capsys):
    broken = copy(raw["speculative"], tmp_path / "speculative/cpu-cpu/rep0.parquet")
    broken.write_bytes(b"")
    assert spec_stats(tmp_path, broken, raw["parallelism"]) == 2
    err = error(capsys)
    assert f"{broken}: not a readable parquet file" in err
    assert "snakemake --forcerun speculative" in err


def verify_stats(tmp_path: Path, report: Path) -> int:
    return cli.main(["verify-stats", "--out", str(tmp_path / "stats"), str(report)])


def test_verify_stats_refuses_a_short_or_truncated_report(raw, tmp_path, capsys):
    report = copy(raw["monte_carlo"], tmp_path / "verification/monte_carlo.json")
    rows = json.loads(report.read_text())
    assert rows["decodelab.expected_rows"]["pvalues"] == len(rows["pvalues"]) == 12
    assert verify_stats(tmp_path, report) == 0  # the negative control
    report.write_text(json.dumps(rows | {"pvalues": rows["pvalues"][:5]}))
    assert verify_stats(tmp_path / "short", report) == 2
    err = error(capsys)
    assert f"{report}: holds 5 'pvalues' rows but should hold 12" in err
    assert "snakemake --forcerun verify_monte_carlo" in err
    report.write_text(report.read_text()[:40])
    assert verify_stats(tmp_path / "cut", report) == 2
    err = error(capsys)
    assert f"{report}: not a readable JSON report" in err
    assert f"delete {report} and run snakemake again" in err


def test_unstamped_raw_files_are_read_only_in_a_committed_reference(raw, tmp_path):
    """Reference runs (results/reference/<name>/raw/, read by their rebuild.sh) predate the
    stamp; anywhere else an unstamped file is refused."""
    from decodelab.core.io import read_raw

    rows = pd.read_parquet(raw["sweep"])
    ref = tmp_path / "results/reference/old/raw/cpu/sweep/m/rep0.parquet"
    ref.parent.mkdir(parents=True)
    rows.to_parquet(ref, index=False)
    assert len(read_raw(ref, "sweep")) == 4
    mine = tmp_path / "results/h/cpu/sweep/m/rep0.parquet"
    mine.parent.mkdir(parents=True)
    rows.to_parquet(mine, index=False)
    with pytest.raises(DecodelabError, match="no decodelab.expected_rows stamp"):
        read_raw(mine, "sweep")


def test_a_job_that_measured_too_few_rows_writes_nothing(raw, tmp_path):
    from decodelab.core.io import write_raw

    out = tmp_path / "rep0.parquet"
    with pytest.raises(DecodelabError, match="measured 3 rows but should have measured 4"):
        write_raw(pd.read_parquet(raw["sweep"]).head(3), out, 4, "sweep: 2 budgets")
    assert list(tmp_path.iterdir()) == []


def test_a_raw_write_that_dies_half_way_leaves_no_file(raw, tmp_path, monkeypatch):
    from decodelab.core import io

    def dies(table, path):
        Path(path).write_bytes(b"PAR1 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(io.pq, "write_table", dies)
    with pytest.raises(KeyboardInterrupt):
        io.write_raw(pd.read_parquet(raw["sweep"]), tmp_path / "rep0.parquet", 4, "sweep")
    assert list(tmp_path.iterdir()) == []
