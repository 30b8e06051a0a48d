"""results/reference/ holds only what the DAG and the paper read (its README's contract).

Every file is a README.md or a table under a `stats/` folder; no scripts, logs, raw rows,
model files, figures or per-call folders. Every reference (a folder with `stats/`) and every
README names its command, commit, device, date and tables in at most MAX_LINES lines.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parents[1] / "results" / "reference"
MAX_LINES = 60
FIELDS = ("Command", "Commit", "Device", "Date", "Tables")
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
SESSION = re.compile(r"\bs\d{2}[a-z]?\b|\bcall ?\d+\b|\bcall\d+/")


def files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def misplaced(root: Path) -> list[str]:
    """Files the contract does not allow: anything but README.md and stats/*.csv."""
    bad = []
    for path in files(root):
        rel = path.relative_to(root)
        table = path.suffix == ".csv" and path.parent.name == "stats"
        if not (path.name == "README.md" or table):
            bad.append(rel.as_posix())
    return bad


def readme_problems(readme: Path, root: Path = REFERENCE) -> list[str]:
    """A README's problems; the root README states the contract and only has the length rule."""
    lines = readme.read_text(encoding="utf-8").splitlines()
    rel = readme.relative_to(root).as_posix()
    top = readme.parent == root
    problems = []
    if len(lines) > MAX_LINES:
        problems.append(f"{rel}: {len(lines)} lines, more than {MAX_LINES}")
    if top:
        return problems
    head = {}
    for line in lines:
        m = re.match(r"- \*\*(\w+):\*\* (.+)", line)
        if m and m.group(1) in FIELDS:
            head.setdefault(m.group(1), m.group(2).strip())
    problems += [f"{rel}: no '- **{f}:**' line" for f in FIELDS if not head.get(f)]
    if head.get("Commit") and not HEX.search(head["Commit"]):
        problems.append(f"{rel}: its Commit line names no commit hash")
    if head.get("Device") and not re.search(r"\b(cpu|cuda|mps)\b", head["Device"]):
        problems.append(f"{rel}: its Device line names no backend (cpu, cuda, mps)")
    if head.get("Date") and not re.search(r"\b20\d\d-\d\d-\d\d\b", head["Date"]):
        problems.append(f"{rel}: its Date line has no YYYY-MM-DD date")
    labels = sorted({m.group(0) for m in SESSION.finditer("\n".join(lines))})
    if labels:
        problems.append(f"{rel}: session labels {labels}")
    return problems


def contract_problems(root: Path) -> list[str]:
    problems = [f"not allowed in a reference: {rel}" for rel in misplaced(root)]
    for stats in sorted(root.rglob("stats")):
        if stats.is_dir() and not (stats.parent / "README.md").exists():
            problems.append(f"{stats.parent.relative_to(root)}: a reference without README.md")
        if stats.is_dir() and not any(stats.glob("*.csv")):
            problems.append(f"{stats.relative_to(root)}: an empty stats folder")
    for readme in sorted(root.rglob("README.md")):
        problems += readme_problems(readme, root)
    return problems


def test_the_reference_tree_exists():
    assert (REFERENCE / "README.md").exists()
    assert {"default-cpu", "cuda-h200"} <= {p.name for p in REFERENCE.iterdir() if p.is_dir()}


def test_a_reference_holds_only_readmes_and_stats_tables():
    assert misplaced(REFERENCE) == []


@pytest.mark.parametrize("readme", sorted(REFERENCE.rglob("README.md")),
                         ids=lambda p: p.parent.relative_to(REFERENCE).as_posix() or "root")
def test_every_readme_is_one_page_naming_command_commit_device(readme):
    assert readme_problems(readme) == []


def test_every_reference_has_a_readme_and_tables():
    assert contract_problems(REFERENCE) == []


def test_the_contract_refuses_a_script_a_log_and_a_diary(tmp_path):
    ref = tmp_path / "ref"
    (ref / "x" / "stats").mkdir(parents=True)
    (ref / "README.md").write_text("# contract\n")
    (ref / "x" / "stats" / "latency.csv").write_text("a\n1\n")
    (ref / "x" / "run.sh").write_text("echo\n")
    (ref / "x" / "call1").mkdir()
    (ref / "x" / "call1" / "run.log").write_text("log\n")
    (ref / "x" / "raw.parquet").write_bytes(b"PAR1")
    assert misplaced(ref) == ["x/call1/run.log", "x/raw.parquet", "x/run.sh"]
    problems = contract_problems(ref)
    assert "x: a reference without README.md" in problems
