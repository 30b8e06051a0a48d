"""Text from tables is never code in the paper: a cell that TeX would read as code is refused
where tables are read (and imported), every other string is escaped wherever a section prints
it, and pdflatex itself reads nothing outside the build and runs no shell command."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from fixtures import ROOT, settings_dict

from decodelab.core import tables
from decodelab.core.errors import DecodelabError
from decodelab.core.text import check_cells, text_problem
from decodelab.paper.build import latexmk, write_generated

STATS = ROOT / "results" / "reference" / "default-cpu" / "stats"
# Every TeX special that the text rule lets through: printed raw, each breaks the layout
LEGAL = "Q&%$#_{}~Q"


def string_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns
            if not pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]


def tables_with_text() -> list[str]:
    return [p.stem for p in sorted(STATS.glob("*.csv"))
            if string_columns(pd.read_csv(p)) and p.stem in tables.names()]


def with_cells(tmp_path: Path, name: str, value: str, columns: list[str] | None = None) -> Path:
    """A copy of the default reference's stats with `value` appended to the string cells of
    `name` (in `columns`, or all its string columns)."""
    stats = Path(shutil.copytree(STATS, tmp_path / "stats"))
    df = pd.read_csv(stats / f"{name}.csv")
    for col in columns or string_columns(df):
        df[col] = df[col].astype(str) + value
    df.to_csv(stats / f"{name}.csv", index=False)
    return stats


@pytest.mark.parametrize("value, problem", [
    (r"x\input{/etc/passwd}", "backslash"),
    ("^^5cinput{/etc/passwd}", "caret"),
    ("NVIDIA\x07", "control character U+0007"),
    ("a\nb", "control character U+000A"),
    ("\u00a0", "control character U+00A0"),
    ("GPU \u7b97\u529b", "fonts lack"),
    ("\u202eRTL", "U+202E"),
])
def test_text_that_tex_reads_as_code_or_cannot_typeset_is_named(value, problem):
    assert problem in text_problem(value)


@pytest.mark.parametrize("value", ["AMD EPYC 7B13", "cv 89% > 25% (lower 90% bound)",
                                   "{'bytes': 1}", "Linux-6.1_x86_64 #1 SMP", "Zürich Ångström",
                                   "~:0:<built-in method>"])
def test_ordinary_text_passes(value):
    assert text_problem(value) is None


def test_every_committed_reference_table_holds_only_typesettable_text():
    for path in sorted((ROOT / "results" / "reference").rglob("*.csv")):
        check_cells(pd.read_csv(path), str(path))


@pytest.mark.parametrize("name", ["environment", "speculative_floor", "long_acceptance"])
def test_a_cell_that_is_tex_code_stops_the_paper_naming_file_row_and_column(tmp_path, name):
    stats = with_cells(tmp_path, name, r"\input{/etc/hostname}")
    column = string_columns(pd.read_csv(STATS / f"{name}.csv"))[0]
    with pytest.raises(DecodelabError, match=rf"{name}\.csv row 1, column {column}: a backslash"):
        write_generated(stats, settings_dict(("cpu",)), tmp_path / "gen")


@pytest.mark.parametrize("name", tables_with_text())
def test_every_string_a_section_prints_is_escaped(tmp_path, name):
    """TeX specials in every string column of a table never reach the generated TeX raw."""
    stats = with_cells(tmp_path, name, LEGAL)
    written = write_generated(stats, settings_dict(("cpu",)), tmp_path / "gen")
    raw = [p.name for p in written if LEGAL in p.read_text()]
    assert not raw, f"{name}: a string printed unescaped in {raw}"


def test_pdflatex_reads_nothing_outside_the_build_and_runs_no_shell(tmp_path):
    outside = tmp_path / "secret.tex"
    outside.write_text("SECRETCONTENT\n")
    build = tmp_path / "build"
    build.mkdir()
    (build / "paper.tex").write_text(
        "\\documentclass{article}\\begin{document}\n"
        f"\\immediate\\write18{{touch {tmp_path}/pwned}}\n"
        f"\\input{{{outside}}}\n"
        "\\end{document}\n")
    with pytest.raises(DecodelabError, match="latexmk failed"):
        latexmk(build)
    assert "Not reading from" in (build / "paper.log").read_text(errors="replace") or \
        "not found" in (build / "paper.log").read_text(errors="replace")
    assert not (tmp_path / "pwned").exists()
    assert not (build / "paper.pdf").exists()


@pytest.mark.parametrize("name, column", [("environment", "cpu_count"),
                                          ("speculative_speedup", "k"),
                                          ("verification_power", "rejections"),
                                          ("regime_summary", "configs"),
                                          ("benchmarks", "total_s")])
def test_a_declared_number_that_is_not_one_stops_the_paper_naming_row_and_column(
        tmp_path, name, column):
    stats = with_cells(tmp_path, name, "x", [column])
    with pytest.raises(DecodelabError, match=rf"{name}\.csv row 1, column {column}: .* not a "
                                             "number"):
        write_generated(stats, settings_dict(("cpu",)), tmp_path / "gen")
