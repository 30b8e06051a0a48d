"""The config schema's verdict in one line: the key, its value, and what the schema allows.

`jsonschema`'s own message is the failing value and a dump of the whole subschema, which for a
model entry runs to 60 lines and never names the key. `schema_problem` names the key path
(`models.x.revision`), the value, and what is allowed in words (the name rule for names).

Before the schema, `data_problem` walks the whole config once: what no schema keyword refuses
(NaN passes every bound; a control character passes a `pattern` that lets anything else through)
and what would make a walk expensive (values shared through YAML aliases, walked once per use).
"""

from __future__ import annotations

import copy
import json
import math
import unicodedata
from pathlib import Path

import yaml
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from decodelab.core.names import NAME_PATTERN, NAME_RULE

# libyaml's loader where PyYAML has it: in pure Python the schema's parse took 0.1 s of the
# 1.4 s of CPU a `snakemake -n` takes.
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def schema_problem(config: dict, schema_path: str | Path) -> str | None:
    """One line describing the first problem of `config`, and how many others there are."""
    if problem := data_problem(config):
        return problem
    schema = yaml.load(Path(schema_path).read_text(), Loader=SAFE_LOADER)
    errors = sorted(Draft202012Validator(schema).iter_errors(config),
                    key=lambda e: (len(e.absolute_path), key_path(e.absolute_path)))
    if not errors:
        return None
    more = {1: "", 2: " (and 1 more problem)"}.get(len(errors), f" (and {len(errors) - 1} more)")
    return describe(errors[0]) + more


MAX_VALUES = 100_000  # a config holds a few hundred; decodelab.core.yamlsafe bounds its files alike
# Unicode's control, format and line/paragraph separator characters: C0, C1 and DEL among them.
CONTROL = {"Cc", "Cf", "Zl", "Zp"}


def data_problem(config) -> str | None:
    """The first string (key or value) holding a control character, or number that is not
    finite, anywhere in `config`, naming its key path; every use of a shared value counts
    towards MAX_VALUES."""
    stack, seen = [((), config)], 0
    while stack:
        path, value = stack.pop()
        seen += 1
        if seen > MAX_VALUES:
            return (f"config holds more than {MAX_VALUES} values (aliases counted once per use); "
                    "a config holds a few hundred")
        if isinstance(value, dict):
            for key, item in reversed(value.items()):
                if why := control_char(key):
                    return f"config {quoted(path)}: a key holds {why}"
                stack.append(((*path, key), item))
        elif isinstance(value, list | tuple):
            stack.extend(((*path, i), item) for i, item in reversed(list(enumerate(value))))
        elif isinstance(value, str) and (why := control_char(value)):
            return f"config {quoted(path)}: the string holds {why}; strings here are one line"
        elif isinstance(value, float) and not math.isfinite(value):
            return f"config {quoted(path)}: {value} is not allowed; expected a finite number"
    return None


def control_char(text) -> str | None:
    if not isinstance(text, str) or (text.isascii() and text.isprintable()):
        return None
    for i, ch in enumerate(text):
        if unicodedata.category(ch) in CONTROL:
            return f"a control character (U+{ord(ch):04X}, at position {i})"
    return None


def describe(error: ValidationError) -> str:
    path, schema, value = list(error.absolute_path), error.schema, error.instance
    if "propertyNames" in error.absolute_schema_path:
        return f"config {quoted(path)}: {shown(value)} is not a usable name: {NAME_RULE}"
    if error.validator == "additionalProperties":
        known = ", ".join(schema.get("properties", {}))
        unknown = [k for k in value if k not in schema.get("properties", {})]
        return (f"config {quoted([*path, unknown[0]])}: unknown key; allowed here: {known}")
    if error.validator == "required":
        missing = next(k for k in schema["required"] if k not in value)
        wanted = schema.get("properties", {}).get(missing)
        what = f"; expected {allowed(wanted)}" if wanted else ""
        return f"config {quoted([*path, missing])} is missing{what}"
    return f"config {quoted(path)}: {shown(value)} is not allowed; expected {allowed(schema)}"


def key_path(path) -> str:
    """models.x.revision, backends[1]"""
    out = ""
    for part in path:
        if not isinstance(part, int) and len(str(part)) > 40:
            part = str(part)[:37] + "..."
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def quoted(path) -> str:
    return f"'{key_path(path)}'" if path else "(top level)"


def shown(value, width: int = 60) -> str:
    """`value` in at most `width` characters."""
    if isinstance(value, str):
        text = repr(value if len(value) <= width else value[:width])
    else:
        text = json.dumps(value, default=str)
    return text if len(text) <= width else text[:width - 3] + "..."


TYPES = {"string": "a string", "integer": "an integer", "number": "a number",
         "boolean": "true or false", "null": "null", "array": "a list", "object": "a mapping"}


def allowed(schema: dict) -> str:
    """What `schema` accepts, in words."""
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " or ".join(allowed(s) for s in schema[key])
    if "enum" in schema:
        return "one of " + ", ".join("null" if v is None else str(v) for v in schema["enum"])
    if "const" in schema:
        return repr(schema["const"])
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if "pattern" in schema:
        words = ("a name: " + NAME_RULE if schema["pattern"] == NAME_PATTERN
                 else f"{schema.get('description', 'a string')} (pattern {schema['pattern']})")
        return " or ".join([words] + [TYPES[t] for t in types if t != "string"])
    if "array" in types:
        return array_words(schema)
    if "object" in types:
        keys = ", ".join(schema.get("properties", {}))
        words = "a non-empty mapping" if schema.get("minProperties") else "a mapping"
        return words + (f" with keys {keys}" if keys else "")
    return " or ".join(TYPES[t] + bounds(schema) for t in types) or "a valid value"


def array_words(schema: dict) -> str:
    least = schema.get("minItems", 0)
    words = {0: "a list", 1: "a non-empty list"}.get(least, f"a list of at least {least} items")
    if "items" in schema:
        words += f", each {allowed(schema['items'])}"
    if schema.get("uniqueItems"):
        words += ", no repeats"
    return words


def bounds(schema: dict) -> str:
    signs = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<",
             "minLength": "of length >="}
    return " and".join(f" {sign} {schema[key]}" for key, sign in signs.items() if key in schema)


def with_defaults(instance, schema: dict):
    """`instance` with the schema's defaults filled in, all the way down (as Snakemake's
    `validate` fills them)."""
    if not isinstance(instance, dict):
        return instance
    properties, out = schema.get("properties", {}), dict(instance)
    for key, sub in properties.items():
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        if key in out:
            out[key] = with_defaults(out[key], sub)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in out.keys() - properties.keys():
            out[key] = with_defaults(out[key], extra)
    return out
