"""Where it ran: the backends that ran or did not and why, versions, devices.

    generated/tab_environment.tex  host, CPU, versions, commit, device per backend
    generated/tab_skipped.tex      every backend: ran / skipped / not requested
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.core import tables
from decodelab.report.section import Section
from decodelab.report.tex import NONE, camel, human_list, keyvalue, label, sig, tabular, tex_escape


def backends_run(env: pd.DataFrame) -> list[str]:
    return tables.ordered_backends(env["backend"]) if len(env) else []


def short_commit(commit) -> str:
    text = str(commit)
    return text[:12] + ("-dirty" if text.endswith("dirty") and len(text) > 12 else "")


def one_value(env: pd.DataFrame, col: str, fmt=str) -> str:
    """A column's value when all backends agree, else 'cpu: a; mps: b'."""
    if not len(env):
        return NONE
    values = {b: fmt(v) for b, v in zip(env["backend"], env[col], strict=True)}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return "; ".join(f"{label(b)}: {v}" for b, v in values.items())


def gib(nbytes) -> str:
    return f"{sig(float(nbytes) / 2**30)} GiB"


def environment_macros(env: pd.DataFrame, skipped: pd.DataFrame,
                       settings: dict) -> tuple[dict[str, str], dict[str, bool]]:
    ran = backends_run(env)
    requested = list(settings.get("backends", []))
    skip = skipped[~skipped["backend"].isin(ran)] if len(skipped) else skipped
    reasons = dict(zip(skip["backend"], skip["reason"], strict=True)) if len(skip) else {}
    macros = {
        "NumBackendsRun": str(len(ran)),
        "BackendsRun": human_list([label(b) for b in ran]),
        "TorchVersion": tex_escape(one_value(env, "torch")),
        "TransformersVersion": tex_escape(one_value(env, "transformers")),
        "PythonVersion": tex_escape(one_value(env, "python")),
        "GitCommit": (f"\\texttt{{{tex_escape(one_value(env, 'git_commit', short_commit))}}}"
                      if len(env) else "unknown"),
    }
    flags = {}
    for backend in tables.BACKEND_ORDER:
        name = camel(backend)
        row = env[env["backend"] == backend] if len(env) else env
        flags[f"{name}Ran"] = len(row) > 0
        macros[f"{name}DeviceName"] = tex_escape(row["device_name"].iloc[0]) if len(row) else NONE
        if backend in ran:
            why = "it ran"
        elif backend in reasons:
            why = tex_escape(str(reasons[backend]).rstrip("."))
        elif backend in requested:
            why = "requested but no result reached the statistics"
        else:
            why = "not requested in this configuration"
        macros[f"{name}SkipReason"] = why
    return macros, flags


def environment_table(env: pd.DataFrame) -> str:
    if not len(env):
        return keyvalue([("Backends run", r"\emph{none}")])
    rows = [
        ("Host", tex_escape(one_value(env, "host"), breakable=True)),
        ("CPU", tex_escape(one_value(env, "cpu_model"))),
        ("CPU cores / RAM", f"{one_value(env, 'cpu_count')} / {one_value(env, 'ram_bytes', gib)}"),
        ("OS", tex_escape(one_value(env, "os"), breakable=True)),
        ("Python", tex_escape(one_value(env, "python"), breakable=True)),
        ("PyTorch", tex_escape(one_value(env, "torch"), breakable=True)),
        ("Transformers", tex_escape(one_value(env, "transformers"), breakable=True)),
        ("Git commit", f"\\texttt{{{tex_escape(one_value(env, 'git_commit', short_commit))}}}"),
        None,
    ]
    rows += [(f"Device ({label(b)})", tex_escape(d, breakable=True))
             for b, d in zip(env["backend"], env["device_name"], strict=True)]
    return keyvalue(rows)


def skipped_table(env: pd.DataFrame, skipped: pd.DataFrame, latency: pd.DataFrame,
                  settings: dict) -> str:
    ran = backends_run(env)
    requested = list(settings.get("backends", []))
    reasons = dict(zip(skipped["backend"], skipped["reason"], strict=True)) if len(skipped) else {}
    devices = dict(zip(env["backend"], env["device_name"], strict=True)) if len(env) else {}
    grid = ["experiment", "model", "dtype", "prompt_len", "use_cache", "budget"]
    everything = tables.ordered_backends([*tables.BACKEND_ORDER, *requested, *ran])
    rows = []
    for backend in everything:
        measured = latency[latency["backend"] == backend][grid].drop_duplicates()
        if backend in ran:
            status, detail = "ran", tex_escape(devices[backend], breakable=True)
        elif backend in reasons:
            status, detail = "skipped", tex_escape(reasons[backend], breakable=True)
        elif backend in requested:
            status, detail = "missing", "requested, but no result reached the statistics"
        else:
            status, detail = "not requested", "not named in this configuration"
        rows.append([label(backend), "yes" if backend in requested else "no", status,
                     detail, str(len(measured))])
    header = [r"Backend & Requested & Status & Device, or why it did not run & Configs \\"]
    return tabular("@{}lll>{\\raggedright\\arraybackslash}Xr@{}", header, rows, "",
                   tabularx=True)


def parts(stats_dir: Path, settings: dict) -> Section:
    env, skipped = tables.read(stats_dir, "environment"), tables.read(stats_dir, "skipped")
    macros, flags = environment_macros(env, skipped, settings)
    return Section(macros, flags, {
        "tab_environment.tex": environment_table(env),
        "tab_skipped.tex": skipped_table(env, skipped, tables.read(stats_dir, "latency"),
                                         settings)})
