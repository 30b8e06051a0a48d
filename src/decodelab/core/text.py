"""What a string from a table may hold: text the paper can typeset, and never TeX code.

One rule for every cell that may reach the paper, applied where tables come in (`decodelab
import`) and where they are read (`decodelab.core.tables.read`): printable ASCII and the accented
Latin letters that the paper's fonts (T1, lmodern) carry, but never a backslash or a caret.
Without those two no string can start a TeX control sequence (a caret pair, ^^5c, is a
backslash too), so a cell that a section forgot to escape breaks at most its own layout.

No pandas at import time: the DAG imports `decodelab.core.tables`.
"""

from __future__ import annotations

import re
import unicodedata

from decodelab.core.errors import DecodelabError

NO_T1_GLYPH = "\u0126\u0127\u0138\u013f\u0140\u0149\u0166\u0167\u017f"
LATIN_LETTERS = "".join(c for c in map(chr, range(0xC0, 0x180))
                        if c.isalpha() and c not in NO_T1_GLYPH)
TEX_CONTROL = {"\\": "a backslash", "^": "a caret"}
UNTYPESETTABLE = re.compile(f"[^ -~{LATIN_LETTERS}]|[\\\\^]")
RULE = ("a table's text is printable ASCII and accented Latin letters, without backslashes "
        "or carets")


def describe(char: str) -> str:
    code = f"U+{ord(char):04X}"
    if char in TEX_CONTROL:
        return f"{TEX_CONTROL[char]} ({code}), which TeX reads as code"
    if unicodedata.category(char)[0] in "CZ":
        return f"control character {code}"
    return f"character {code} ({char}) that the paper's fonts lack"


def text_problem(value: str) -> str | None:
    """Why `value` cannot be typeset as plain text, or None when it can."""
    hit = UNTYPESETTABLE.search(value)
    return describe(hit.group()) if hit else None


def untypesettable(df) -> tuple[str, str, str] | None:
    """(where, column, character) of the first cell of `df`, its header first, that breaks the
    rule; rows count from 1 below the header."""
    for i, column in enumerate(map(str, df.columns)):
        if hit := UNTYPESETTABLE.search(column):
            return "header", f"{i + 1}", hit.group()
    first = None
    for column in df.columns:
        if df[column].dtype.kind != "O":  # numbers and booleans print no text
            continue
        cells = df[column].astype(str)  # an object column may mix strings with other values
        bad = cells.str.contains(UNTYPESETTABLE).to_numpy().nonzero()[0]
        if len(bad) and (first is None or bad[0] < first[0]):
            first = bad[0], column
    if first is None:
        return None
    row, column = first
    return f"row {row + 1}", column, UNTYPESETTABLE.search(str(df[column].iloc[row])).group()


def check_cells(df, what: str, fix: str = "") -> None:
    """Every string cell of `df` keeps the rule; else an error naming `what`, the row (from 1
    below the header) and the column, then `fix`."""
    if bad := untypesettable(df):
        where, column, char = bad
        raise DecodelabError(f"{what} {where}, column {column}: {describe(char)}; {RULE}{fix}")
