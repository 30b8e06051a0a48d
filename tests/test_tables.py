"""The registry of statistics tables (decodelab.core.tables, with each study's declared in its
folder): what it declares is what the DAG writes, the host contract requires and the readers
type; a table added there reaches all three."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from dag import ROOT, copy_workflow, snakemake, write_config

from decodelab.core import hosts, tables
from decodelab.core.errors import DecodelabError
from decodelab.studies.speculative.declared import speculative

HOST = "testhost"
TOY = speculative("toy", ("k",))  # a new table of the speculative study


def with_table(monkeypatch, table: tables.Table) -> None:
    declared = tables.all_tables()
    monkeypatch.setattr(tables, "all_tables", lambda: (*declared, table))


# -----------------------------------------------------------------------------
# the declarations

def test_names_are_unique_and_carry_their_group_prefix():
    names = tables.names()
    assert len(names) == len(set(names))
    for t in tables.all_tables():
        assert t.name.startswith(tables.PREFIXES.get(t.group, "")), t.name
        assert tables.table(t.name) is t and tables.path("s", t.name) == Path(f"s/{t.name}.csv")
    keys = [(t.group, t.key) for t in tables.all_tables()]
    assert len(keys) == len(set(keys))


def test_an_undeclared_table_is_an_error_naming_it():
    with pytest.raises(DecodelabError, match="no statistics table 'latencies'"):
        tables.path("stats", "latencies")


def test_groups_and_the_host_contract():
    assert [t.key for t in tables.group("speculative")] == [
        "acceptance", "speedup", "theory", "hf", "parallelism", "floor"]
    assert len(tables.names("regime_depth")) == 10
    assert sorted(tables.required()) == ["environment", "kv_speedup", "latency", "regimes",
                                         "skipped"]
    assert tables.local_tables() == [n for n in tables.names() if n != "hosts"]
    # what a reader types, the contract requires where it requires any
    for t in tables.all_tables():
        if t.required is not None:  # but the verdicts, which results from before them lack
            assert set(t.flags) - set(tables.STABLE) <= set(t.required), t.name
            assert not set(tables.STABLE + tables.REASON) & set(t.required), t.name


def test_report_categories():
    assert tables.report_category("speculative_hf") == "Speculative"
    assert tables.report_category("verification_levels") == "Verification"
    assert tables.report_category("regime_onsets") == "Decode regimes"
    assert tables.report_category("kv_speedup") == "KV cache"
    assert tables.report_category("hosts") == "Hosts and reference"


def test_ordered_backends():
    assert tables.ordered_backends(["mps", "tpu", "cpu", "cpu", "npu"]) == [
        "cpu", "mps", "npu", "tpu"]
    assert tables.ordered_backends([]) == []


def test_the_dag_imports_the_registry_without_pandas_or_torch():
    code = ("import sys, decodelab.core.tables; "
            "print(sorted({'pandas', 'torch', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# -----------------------------------------------------------------------------
# reading and writing

def test_optional_tables_absent_read_as_no_rows_others_raise(tmp_path):
    spec = tables.read_group(tmp_path, "speculative")
    assert list(spec) == [t.key for t in tables.group("speculative")]
    assert all(df.empty for df in spec.values())
    (tmp_path / "verification_greedy.csv").write_text("")  # empty: no rows either
    assert tables.read(tmp_path, "verification_greedy").empty
    with pytest.raises(FileNotFoundError):
        tables.read(tmp_path, "latency")


def test_regime_depth_is_all_or_none(tmp_path):
    for name in tables.names("regime_depth")[:-1]:
        (tmp_path / f"{name}.csv").write_text("backend,use_cache\ncpu,True\n")
    assert tables.read_group(tmp_path, "regime_depth") is None
    some = tables.read_group(tmp_path, "regime_depth", ["summary", "phases"])
    assert list(some) == ["summary", "phases"] and some["phases"]["use_cache"].dtype == bool


def test_declared_columns_are_typed(tmp_path):
    (tmp_path / "verification_levels.csv").write_text(
        "level,check,pair,sampler,p_value,rejected,token\n1,exact,,correct,,False,7\n")
    levels = tables.read(tmp_path, "verification_levels")
    assert levels["pair"].tolist() == [""] and levels["rejected"].tolist() == [False]
    assert levels["p_value"].isna().all()  # an empty number is NaN
    assert levels["token"].tolist() == [7]  # not declared: as pandas reads it
    for name in ("verification_levels", "latency"):  # optional or not, numbers must parse
        (tmp_path / f"{name}.csv").write_text("budget,median,p_value,use_cache\n8,x,x,true\n")
        with pytest.raises(DecodelabError, match=r"row 1, column (median|p_value): 'x' is not"):
            tables.read(tmp_path, name)


def test_write_group_refuses_tables_other_than_the_declared_ones(tmp_path):
    frames = {t.key: pd.DataFrame({"k": [1]}) for t in tables.group("speculative")}
    tables.write_group(tmp_path, "speculative", frames)
    assert sorted(p.stem for p in tmp_path.iterdir()) == sorted(tables.names("speculative"))
    with pytest.raises(DecodelabError, match="declared"):
        tables.write_group(tmp_path, "speculative", {**frames, "extra": pd.DataFrame()})


# -----------------------------------------------------------------------------
# a table added to the registry, and nothing else

def test_a_new_table_reaches_a_reader(monkeypatch, tmp_path):
    with_table(monkeypatch, TOY)
    (tmp_path / "speculative_toy.csv").write_text("pair,k\ncpu-cpu,3\n")
    spec = tables.read_group(tmp_path, "speculative")
    assert spec["toy"]["k"].tolist() == [3]
    with pytest.raises(DecodelabError, match="toy"):  # the verb must now compute it
        tables.write_group(tmp_path, "speculative",
                           {t.key: pd.DataFrame() for t in tables.group("speculative")[:-1]})


def host_tree(root: Path, skip: str = "") -> Path:
    """results/<host>/ with every required table, header-only, but `skip`."""
    (root / "stats").mkdir(parents=True)
    for name, columns in tables.required().items():
        if name != skip:
            (root / "stats" / f"{name}.csv").write_text(",".join(columns) + "\n")
    return root


def test_a_new_required_table_reaches_the_host_contract(monkeypatch, tmp_path):
    toy = tables.Table("toy", "toy", "toy_rule", "Other", required=("backend", "toy_value"))
    with_table(monkeypatch, toy)
    src = host_tree(tmp_path / "lacking", skip="toy")
    with pytest.raises(DecodelabError, match=r"missing stats/toy\.csv"):
        hosts.import_host(src, "box", tmp_path / "results")
    (src / "stats/toy.csv").write_text("backend\ncpu\n")
    with pytest.raises(DecodelabError, match="lacks the column.s. toy_value"):
        hosts.import_host(src, "box", tmp_path / "results")
    (src / "stats/toy.csv").write_text("backend,toy_value\ncpu,1\n")
    assert hosts.import_host(src, "box", tmp_path / "results").is_dir()


def planned(workdir: Path, config: Path) -> list[tuple[str, list[str], list[str]]]:
    """(rule, inputs, outputs) of every job a dry run plans."""
    out = snakemake(workdir, "-n", "--configfile", str(config)).stdout
    jobs = []
    for block in re.split(r"^(?:local)?rule ", out, flags=re.M)[1:]:
        files = dict(re.findall(r"^    (input|output): (.*)$", block, re.M))
        jobs.append((block.split(":", 1)[0], files.get("input", "").split(", "),
                     files.get("output", "").split(", ")))
    return jobs


def test_the_dag_writes_the_declared_tables_and_a_new_one(tmp_path, monkeypatch):
    """One dry run of a workflow copy whose speculative study alone declared another table."""
    (tmp_path / "wf").mkdir()
    workdir = copy_workflow(tmp_path / "wf")
    package = shutil.copytree(ROOT / "src/decodelab", tmp_path / "src/decodelab",
                              ignore=shutil.ignore_patterns("__pycache__"))
    registry = package / "studies" / "speculative" / "declared.py"
    anchor = '    speculative("parallelism", ("context", "k", "ratio", *CI, "n")),\n'
    assert registry.read_text().count(anchor) == 1
    toy_line = '    speculative("toy", ("k",)),\n'
    registry.write_text(registry.read_text().replace(anchor, anchor + toy_line))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "src"))
    jobs = planned(workdir, write_config(workdir, host=HOST))

    def written_in(folder: str) -> dict[str, str]:
        return {Path(f).stem: rule for rule, _, outputs in jobs for f in outputs
                if Path(f).parent == Path(folder)}

    expected = {t.name: t.rule for t in (*tables.all_tables(), TOY)}
    assert written_in(f"results/{HOST}/stats") == {n: r for n, r in expected.items()
                                                   if n != "hosts"}
    assert written_in("results/combined/stats") == dict.fromkeys(expected, "merge_hosts")
    readers = {rule for rule, inputs, _ in jobs
               if {f"results/{HOST}/stats/speculative_toy.csv",
                   "results/combined/stats/speculative_toy.csv"} & set(inputs)}
    assert readers == {"speculative_figures", "merge_hosts", "paper"}
