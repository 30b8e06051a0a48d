"""scripts/compare_builds.py: two results trees, same tables and same PDF text, or not."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "scripts/compare_builds.py"
SPEC = importlib.util.spec_from_file_location("compare_builds", SCRIPT)
compare_builds = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare_builds)
needs_pdftotext = pytest.mark.skipif(shutil.which("pdftotext") is None,
                                     reason="pdftotext not on PATH (poppler-utils)")


def write_pdf(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with PdfPages(path) as pdf:
        fig = plt.figure(figsize=(4, 2))
        fig.text(0.1, 0.5, text)
        pdf.savefig(fig)
        plt.close(fig)


def results_tree(root: Path, words: str = "median decode 12.5 ms") -> Path:
    for host in ("vm", "combined"):
        stats = root / host / "stats"
        stats.mkdir(parents=True)
        pd.DataFrame({"backend": ["cpu", "mps"], "median_s": [0.0125, 0.0031],
                      "note": ["", "spikes"]}).to_csv(stats / "latency.csv", index=False)
        pd.DataFrame({"budget": [8, 16], "speedup": [1.5, 2.25]}).to_csv(
            stats / "kv_speedup.csv", index=False)
    write_pdf(root / "paper/paper.pdf", words)
    return root


def compare(a: Path, b: Path, capsys) -> tuple[int, str]:
    code = compare_builds.main([str(a), str(b)])
    return code, capsys.readouterr().out


@needs_pdftotext
def test_identical_trees_pass(tmp_path, capsys):
    a = results_tree(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    code, out = compare(a, b, capsys)
    assert code == 0, out
    assert "4 tables equal, 0 differ or are missing; PDF text equal" in out


@needs_pdftotext
def test_a_changed_cell_fails_naming_the_row_and_column(tmp_path, capsys):
    a, b = results_tree(tmp_path / "a"), results_tree(tmp_path / "b")
    table = b / "vm/stats/latency.csv"
    changed = pd.read_csv(table)
    changed.loc[1, "median_s"] = 0.0032
    changed.to_csv(table, index=False)
    code, out = compare(a, b, capsys)
    assert code == 1
    assert "vm/stats/latency.csv: differs" in out
    assert "line 3: median_s: A='0.0031' B='0.0032'" in out
    assert "combined/stats/latency.csv" not in out  # the equal twin is not reported


@needs_pdftotext
def test_a_number_written_differently_is_a_difference(tmp_path, capsys):
    a, b = results_tree(tmp_path / "a"), results_tree(tmp_path / "b")
    table = b / "vm/stats/kv_speedup.csv"
    table.write_text(table.read_text().replace("1.5", "1.50"))  # equal as floats, not as text
    code, out = compare(a, b, capsys)
    assert code == 1 and "speedup: A='1.5' B='1.50'" in out


@needs_pdftotext
def test_a_missing_table_fails(tmp_path, capsys):
    a, b = results_tree(tmp_path / "a"), results_tree(tmp_path / "b")
    (a / "combined/stats/kv_speedup.csv").unlink()
    code, out = compare(a, b, capsys)
    assert code == 1 and "combined/stats/kv_speedup.csv: only in B" in out
    assert "3 tables equal, 1 differ or are missing" in out


@needs_pdftotext
def test_a_changed_pdf_word_fails_with_a_diff(tmp_path, capsys):
    a = results_tree(tmp_path / "a")
    b = results_tree(tmp_path / "b", words="median decode 12.6 ms")
    code, out = compare(a, b, capsys)
    assert code == 1
    assert "-median decode 12.5 ms" in out and "+median decode 12.6 ms" in out
    assert "4 tables equal" in out


@needs_pdftotext
def test_a_missing_pdf_fails(tmp_path, capsys):
    a, b = results_tree(tmp_path / "a"), results_tree(tmp_path / "b")
    (b / "paper/paper.pdf").unlink()
    code, out = compare(a, b, capsys)
    assert code == 1 and "paper/paper.pdf: missing in B" in out


@needs_pdftotext
def test_the_command_line_exits_1_on_a_difference(tmp_path):
    a = results_tree(tmp_path / "a")
    b = results_tree(tmp_path / "b", words="median decode 99 ms")
    same = subprocess.run([sys.executable, str(SCRIPT), str(a), str(a)], capture_output=True)
    differ = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b)], capture_output=True)
    assert (same.returncode, differ.returncode) == (0, 1)
