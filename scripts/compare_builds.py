"""Two results trees built from the same raw runs: same statistics tables, same PDF text?

    python scripts/compare_builds.py /work/baseline/results results

Compares every `*/stats/*.csv` found in either tree (the same set of files, each pair equal as
text; for a pair that differs, the first differing rows and columns) and the text of
`paper/paper.pdf` (`pdftotext -layout`, a unified diff). Exit 0 when identical, 1 on any
difference, 2 when pdftotext is missing.
"""

import argparse
import difflib
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

PDF = Path("paper/paper.pdf")
SHOWN = 5  # differing rows (and diff hunks' context) printed per file


def stats_tables(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.glob("*/stats/*.csv")}


def read_cells(path: Path) -> pd.DataFrame:
    """Every cell as the text written in the file: no type inference, no NaN."""
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def first_differing_line(a: str, b: str) -> str:
    lines = zip(a.splitlines(), b.splitlines(), strict=False)
    for number, (x, y) in enumerate(lines, 1):
        if x != y:
            return f"  line {number}:\n    A: {x}\n    B: {y}"
    return f"  A has {len(a.splitlines())} lines, B {len(b.splitlines())}"


def cell_differences(a: pd.DataFrame, b: pd.DataFrame) -> list[str]:
    """Column and row-count differences, then the first rows whose cells differ."""
    out = []
    if list(a.columns) != list(b.columns):
        only_a = [c for c in a.columns if c not in b.columns]
        only_b = [c for c in b.columns if c not in a.columns]
        out.append(f"  columns only in A: {only_a}, only in B: {only_b}" if only_a or only_b
                   else f"  column order: A {list(a.columns)}, B {list(b.columns)}")
    if len(a) != len(b):
        out.append(f"  rows: A {len(a)}, B {len(b)}")
    shared = [c for c in a.columns if c in b.columns]
    n = min(len(a), len(b))
    left = a[shared].iloc[:n].reset_index(drop=True)
    right = b[shared].iloc[:n].reset_index(drop=True)
    differs = left.ne(right)
    for row in differs.index[differs.any(axis=1)][:SHOWN]:
        cells = [f"{c}: A={left.at[row, c]!r} B={right.at[row, c]!r}"
                 for c in shared if differs.at[row, c]]
        out.append(f"  line {row + 2}: " + "; ".join(cells))  # line 1 is the header
    return out


def compare_table(a: Path, b: Path) -> list[str]:
    text_a, text_b = a.read_text(), b.read_text()
    if text_a == text_b:
        return []
    return cell_differences(read_cells(a), read_cells(b)) or [first_differing_line(text_a, text_b)]


def compare_tables(a: Path, b: Path) -> tuple[list[str], int]:
    """(what differs, number of tables equal)."""
    in_a, in_b = stats_tables(a), stats_tables(b)
    messages = [f"{p}: only in A" for p in sorted(in_a - in_b)]
    messages += [f"{p}: only in B" for p in sorted(in_b - in_a)]
    equal = 0
    for p in sorted(in_a & in_b):
        found = compare_table(a / p, b / p)
        if found:
            messages += [f"{p}: differs", *found]
        else:
            equal += 1
    return messages, equal


def pdf_text(pdf: Path) -> str:
    done = subprocess.run(["pdftotext", "-layout", str(pdf), "-"], capture_output=True,
                          text=True, check=True)
    return done.stdout


def compare_pdfs(a: Path, b: Path) -> list[str]:
    missing = [f"{PDF}: missing in {name}" for name, root in (("A", a), ("B", b))
               if not (root / PDF).is_file()]
    if missing:
        return missing
    diff = difflib.unified_diff(pdf_text(a / PDF).splitlines(), pdf_text(b / PDF).splitlines(),
                                f"A/{PDF}", f"B/{PDF}", n=SHOWN, lineterm="")
    return list(diff)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="a results/ tree (the before)")
    parser.add_argument("b", type=Path, help="another results/ tree (the after)")
    args = parser.parse_args(argv)
    if shutil.which("pdftotext") is None:
        print("pdftotext not found: install poppler-utils", file=sys.stderr)
        return 2
    tables, equal = compare_tables(args.a, args.b)
    text = compare_pdfs(args.a, args.b)
    for line in tables + text:
        print(line)
    unequal = sum(not m.startswith(" ") for m in tables)
    print(f"{equal} tables equal, {unequal} differ or are missing; "
          f"PDF text {'differs' if text else 'equal'}")
    return 1 if tables or text else 0


if __name__ == "__main__":
    sys.exit(main())
