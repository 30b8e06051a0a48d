"""Names that become path components: models, pairs, hosts, backends.

One conservative pattern, used by the config schema (`workflow/schemas/config.schema.yaml`
repeats it as a JSON-schema `pattern`; a test keeps the two equal) and by every verb that takes
a name from the user. It rules out `.`, `..`, hidden names, option-like names (`-x`), separators
and overlong names, so a name can never reach outside the directory it is joined to nor be read
as a command-line flag.
"""

from __future__ import annotations

import re

from .errors import DecodelabError

NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$"
NAME_RULE = ("letters, digits, '.', '_' and '-', not starting with '.' or '-', at most 64 "
             f"characters (pattern {NAME_PATTERN})")
_NAME = re.compile(NAME_PATTERN)


def is_valid_name(name: object) -> bool:
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_name(name: object, what: str) -> str:
    """`name` if it is a safe path component, else an error naming `what` and the rule."""
    if not is_valid_name(name):
        raise DecodelabError(f"{what} {name!r} is not a usable name: {NAME_RULE}")
    return name
