r"""The quantized backend (llama.cpp): each GGUF type's verify cost beside PyTorch's, whether
verification is serial or batch-parallel there, and the speculative pairs with a llama.cpp role.

    generated/tab_quantized.tex  per quantized pair and mode: best K, speedup, greedy agreement,
                                 divergences (earliest position, smallest logit margin)
    generated/tab_quantized_peer.tex  per pair of config quantized.peer, mode and K: llama.cpp's
                                 own speculative speedup and acceptance beside decodelab's

The stage is optional: without rows in quantized_verify_cost.csv or quantized_speculative.csv
\QuantizedReady is false and the macros read '--'. The committed CUDA reference of the study
(results/reference/<name>/quantized, read by `reference.compare` into reference_comparison.csv)
is quoted from that table whether or not this build ran the study, with its own flag
\QuantRefReady. The seed's claim of serial verification on a
quantized Metal backend stays "not run" until a Mac's rows (device metal) are merged in.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from decodelab.core import tables
from decodelab.report import reference as rf
from decodelab.report import seed
from decodelab.report.section import Section, placeholders, stage
from decodelab.report.settings import confidence
from decodelab.report.tex import NONE, ci, human_list, percent, sig, tabular, tex_escape, tt

REPORTED_K = (4, 8, 16)
# What each token past the first costs in one-token passes ((ratio - 1) / K), the median over K:
# at most BATCH_PARALLEL is batch-parallel, at least SERIAL is serial, between is partly serial.
BATCH_PARALLEL, SERIAL = 0.25, 0.75


def regime(extra_per_token: float) -> str:
    if extra_per_token <= BATCH_PARALLEL:
        return "batch-parallel"
    return "serial" if extra_per_token >= SERIAL else "partly serial"


def unstable_rows(rows: pd.DataFrame) -> pd.Series:
    """Rows judged unstable; none where the rows carry no verdict."""
    if "stable" not in rows:
        return pd.Series(False, index=rows.index)
    return ~rows["stable"].astype(bool)


def verify_summary(verify: pd.DataFrame) -> str:
    """Per backend and model: the ratio at K = 4, 8, 16 (those measured), an unstable one
    marked so."""
    parts = []
    for (backend, model), g in verify.groupby(["backend", "model"], sort=True):
        at = g[g["k"].isin(REPORTED_K)].sort_values("k")
        values = ", ".join(f"{sig(r.ratio)}{' (unstable)' if unstable else ''} at $K={int(r.k)}$"
                           for r, unstable in zip(at.itertuples(), unstable_rows(at),
                                                  strict=True))
        parts.append(f"{tt(backend)} ({tt(model)}): {values or NONE}")
    return human_list(parts, empty=NONE)


def serial_sentence(verify: pd.DataFrame) -> str:
    """Whether verification is serial here, per backend, from the median extra cost per token."""
    by = verify.groupby("backend")["extra_per_token"].median().sort_index()
    groups: dict[str, list[str]] = {}
    for backend, extra in by.items():
        groups.setdefault(regime(extra), []).append(f"{tt(backend)} ({sig(extra, 2)})")
    said = [f"{kind} on {human_list(names)}" for kind, names in sorted(groups.items())]
    return (f"verification is {human_list(said)}, in one-token passes per extra token, the "
            f"median over $K$ (about 0: batch-parallel; about 1: serial)")


def greedy_sentence(spec: pd.DataFrame) -> str:
    greedy = spec[spec["mode"] == "greedy"].dropna(subset=["agree"])
    if not len(greedy):
        return NONE
    diverged = int(greedy["diverged"].fillna(0).sum())
    text = (f"{percent(greedy['agree'].min())} of greedy sequences (the worst pair and $K$) "
            f"equal the target's own greedy decoding; {diverged} diverged")
    if diverged:
        text += (f", the earliest at position {int(greedy['first_divergence'].min())}, the "
                 f"smallest top-2 logit margin there {sig(greedy['min_margin'].min())}")
    return text


def pairs_table(spec: pd.DataFrame, level: str) -> str:
    rows = []
    for (pair, mode), g in spec.groupby(["pair", "mode"], sort=True) if len(spec) else ():
        best = g.loc[g["speedup"].idxmax()]
        roles = [f"{b} {q}".strip() for b, q in ((best["draft_backend"], best["draft_quant"]),
                                                 (best["target_backend"], best["target_quant"]))]
        greedy = mode == "greedy" and pd.notna(best["agree"])
        rows.append([tt(pair), *roles, mode, str(int(best["k"])), sig(best["speedup"]),
                     ci(best["ci_low"], best["ci_high"]),
                     percent(g["agree"].min()) if greedy else NONE,
                     str(int(g["diverged"].fillna(0).sum())) if greedy else NONE,
                     sig(g["min_margin"].min()) if greedy and g["diverged"].sum() else NONE])
    header = [f"Pair & draft & target & Mode & best $K$ & speedup & {level} CI & "
              r"greedy equal & diverged & min margin \\"]
    return tabular("@{}llllrrcrrr@{}", header, rows, "no quantized pair in this build")


def peer_table(peer: pd.DataFrame, level: str) -> str:
    rows = [[tt(r.pair), r.mode, str(int(r.k)), sig(r.peer_speedup), ci(r.ci_low, r.ci_high),
             percent(r.peer_acceptance), sig(r.peer_tokens_per_s), sig(r.decodelab_speedup),
             percent(r.decodelab_proposal_acceptance)]
            for r in (peer.sort_values(["pair", "mode", "k"]).itertuples() if len(peer) else ())]
    header = [r"& & & \multicolumn{4}{c}{llama.cpp's own} & \multicolumn{2}{c}{decodelab} \\",
              f"Pair & Mode & $K$ & speedup & {level} CI & accepted & tokens/s & speedup & "
              r"accepted \\"]
    return tabular("@{}llrrcrrrr@{}", header, rows, "llama.cpp's own speculative did not run")


def peer_sentence(peer: pd.DataFrame) -> str:
    """llama.cpp's best speedup on its own and decodelab's at that pair, mode and K."""
    if not len(peer):
        return NONE
    best = peer.loc[peer["peer_speedup"].idxmax()]
    return (f"llama.cpp's own speculative decoding reaches {sig(best['peer_speedup'])} over its "
            f"own autoregressive decoding ({tt(best['pair'])}, {best['mode']}, "
            f"$K={int(best['k'])}$, {percent(best['peer_acceptance'])} of drafted tokens "
            f"accepted), where decodelab's loop on the same GGUF files reaches "
            f"{sig(best['decodelab_speedup'])}")


def built(verify: pd.DataFrame, spec: pd.DataFrame, peer: pd.DataFrame, settings: dict
          ) -> Section:
    metal = len(verify) and verify["device"].eq("metal").any()
    macros = {
        "QuantVerifySummary": verify_summary(verify) if len(verify) else NONE,
        "QuantVerifyStable": (f"{int(verify['stable'].sum())} of {len(verify)}" if len(verify)
                              else NONE),
        "QuantSerialSentence": serial_sentence(verify) if len(verify) else NONE,
        "QuantGreedySentence": greedy_sentence(spec) if len(spec) else NONE,
        "QuantBestSpeedup": (sig(spec["speedup"].max()) if len(spec) else NONE),
        "QuantMetal": ("run" if metal else "not run"),
        "QuantPeerSentence": peer_sentence(peer),
    }
    level = confidence(settings)
    return Section(macros, {"QuantPeerRan": bool(len(peer))}, {
        "tab_quantized.tex": pairs_table(spec, level),
        "tab_quantized_peer.tex": peer_table(peer, level)})


# --- the committed CUDA reference of the study, from reference_comparison.csv ---------------

def reference_rows(comparison: pd.DataFrame, table: str, reference: str | None = None
                   ) -> pd.DataFrame:
    """A quantized reference's rows of one `rf.QUANTIZED` table, in the table's own columns:
    `reference`'s, else the first reference's that has any (`rf.measured`)."""
    keys, columns = rf.QUANTIZED[table]
    return rf.measured(comparison, {q: c for c, q in columns.items()}, keys, reference)


def pytorch_rows(comparison: pd.DataFrame, reference: str) -> pd.DataFrame:
    """PyTorch's verify cost measured beside llama.cpp's in the same reference (the comparison
    carries no verdict for it)."""
    return rf.measured(comparison, {"parallelism": "ratio"},
                       ["backend", "model", "prompt_len", "k"], reference)


def speedup_sentence(spec: pd.DataFrame) -> str:
    """Per pair and mode, the best K's speedup with its interval."""
    parts = []
    for (pair, mode), g in spec.groupby(["pair", "mode"], sort=True):
        best = g.loc[g["speedup"].idxmax()]
        parts.append(f"{tt(pair)} {mode} {sig(best['speedup'])} "
                     f"{ci(best['ci_low'], best['ci_high'])} at $K={int(best['k'])}$")
    return human_list(parts, empty=NONE)


def reference_section(comparison: pd.DataFrame) -> Section:
    """QuantRef*: what the first CUDA reference of the study measured, from the comparison."""
    comparison = comparison.reindex(columns=rf.COLUMNS)
    on_cuda = comparison["backend"].fillna("").astype(str).str.endswith("-cuda")
    verify = reference_rows(comparison[on_cuda], "quantized_verify_cost")
    ran = bool(len(verify))
    name = verify["reference"].iloc[0] if ran else ""
    spec = reference_rows(comparison, "quantized_speculative", name)
    verify = verify.assign(stable=verify["stable"].astype(float) > 0,
                           extra_per_token=(verify["ratio"] - 1) / verify["k"])
    torch = pytorch_rows(comparison, name)
    macros = {
        "QuantRefName": tt(name) if ran else NONE,
        "QuantRefDevice": tex_escape(verify["reference_device"].iloc[0]) if ran else NONE,
        "QuantRefVerifySummary": verify_summary(verify) if ran else NONE,
        "QuantRefTorchSummary": verify_summary(torch) if len(torch) else NONE,
        "QuantRefSerialSentence": serial_sentence(verify) if ran else NONE,
        "QuantRefSpeedupSentence": speedup_sentence(spec) if len(spec) else NONE,
        "QuantRefGreedySentence": greedy_sentence(spec) if len(spec) else NONE,
    }
    return stage("QuantRefReady", ran, Section(macros, {}))


def parts(stats_dir: Path, settings: dict) -> Section:
    t = tables.read_group(stats_dir, "quantized")
    verify, spec, peer = t["verify_cost"], t["speculative"], t["peer"]
    ran = bool(len(verify) or len(spec))
    section = built(verify, spec, peer, settings)
    shown = section if ran else placeholders(section)
    ref = reference_section(tables.read(stats_dir, "reference_comparison"))
    return stage("QuantizedReady", ran, Section({**shown.macros, **ref.macros,
                                                 **seed.quantized_claims()},
                                                {**shown.flags, **ref.flags}, shown.files))
