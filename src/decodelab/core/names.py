"""Names that become path components: models, pairs, hosts, backends.

One conservative pattern, used by the config schema (`workflow/schemas/config.schema.yaml`
repeats it as a JSON-schema `pattern`; a test keeps the two equal) and by every verb that takes
a name from the user. It rules out `.`, `..`, hidden names, option-like names (`-x`), separators
and overlong names, so a name can never reach outside the directory it is joined to nor be read
as a command-line flag.
"""

from __future__ import annotations

import re

from decodelab.core.errors import DecodelabError

# \A and \Z, not ^ and $: JSON-schema validators match a `pattern` with Python's re.search, where
# `$` also matches before a final newline ("x\n" would pass). NAME_REGEX is the unanchored rule
# (Snakemake's wildcard constraints).
NAME_REGEX = r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}"
NAME_PATTERN = rf"\A{NAME_REGEX}\Z"
NAME_RULE = ("letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 64 "
             f"characters (pattern {NAME_PATTERN})")
_NAME = re.compile(NAME_PATTERN)


def is_valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_name(name: object, what: str) -> str:
    """`name` if it is a safe path component, else an error naming `what` and the rule."""
    if not is_valid_name(name):
        shown = repr(name[:64] + "..." if isinstance(name, str) and len(name) > 64 else name)
        raise DecodelabError(f"{what} {shown} is not a usable name: {NAME_RULE}")
    return name
