r"""Equivalence verification of the speculative sampler: exact (level 1), Monte Carlo (level 2)
and two samples of real models (level 3), every check against the right and two wrong samplers.

    generated/tab_verification.tex  every level, check and sampler with its statistic, p-value,
                                    verdict and expected verdict
    generated/tab_power.tex         rejections over seeds per check and sampler (power, and the
                                    right sampler's false rejections)

The stage is optional: without verification_levels.csv \VerificationReady is false and the
macros that come from its tables read '--'.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from scipy.stats import binomtest

from decodelab.core import tables
from decodelab.core.tables import LONG_PAIR
from decodelab.report import seed
from decodelab.report.read import SAMPLER_ORDER, ordered_samplers, spec_pairs
from decodelab.report.section import Section, stage
from decodelab.report.tex import (
    NONE,
    camel,
    finite,
    human_list,
    integer,
    percent,
    plain,
    pval,
    sci,
    sig,
    tabular,
    tex_escape,
    tt,
)

WRONG_SAMPLERS = ("accept_all", "resample_from_p")  # the negative controls
EXACT_TOL = 1e-9          # level 1 passes when the max error is at most this (equivalence.TOL)
LIBERAL_LEVEL = 0.05      # a test is called liberal when the right sampler's false rejections
                          # over seeds exceed alpha at this level (one-sided binomial test)
CHECKS = (                # macro fragment, level, what a check's name must contain
    ("ExactRandom", 1, "dirichlet"), ("ExactEdge", 1, "edge"), ("ExactReal", 1, "real"),
    ("ExactBlock", 1, "block"), ("McBlock", 2, "block"), ("McSingle", 2, ""),
    ("Chi", 3, "chi"), ("LogRatio", 3, "log"), ("Greedy", 3, "greedy"),
)
# What the text quotes of each check (the tables show the rest): every rule's p-value and the
# correct rule's other fields; power as rejections over seeds for levels 2 and 3.
QUOTED = {"McSingle": ("P",), "McBlock": ("P",),
          "Chi": ("Stat", "Dof", "P", "PAsym", "Perm", "N"), "LogRatio": ("Stat", "P")}
POWER_QUOTED = ("McBlock", "McSingle", "Chi", "LogRatio")
NEAR_TIE_LOGIT = 1e-2     # a greedy divergence whose top-1 minus top-2 logit margin is below
                          # this is called a near-tie (batched vs one-token float rounding)


def check_fragment(level, check: str) -> str | None:
    """The macro fragment of a check ('block K=3' at level 1 -> ExactBlock), None if unknown."""
    text = str(check).lower()
    for name, lvl, key in CHECKS:
        if finite(level) and int(level) == lvl and key in text:
            return name
    return None



def verification_settings(settings: dict) -> dict:
    return settings.get("verification") or {}


def no_rows() -> dict[str, pd.DataFrame]:
    """The stage's tables without rows: what its macros are built on when it did not run."""
    columns = ["level", "check", "pair", "sampler", "fragment"]
    return {t.key: pd.DataFrame(columns=columns) for t in tables.group("verification")}


def read_verification(stats_dir: Path) -> dict[str, pd.DataFrame] | None:
    """The verification tables, each check with its macro fragment, or None when the stage did
    not run (no verification_levels.csv)."""
    if not tables.path(stats_dir, "verification_levels").exists():
        return None
    t = tables.read_group(stats_dir, "verification")
    for name, df in t.items():
        if len(df) and {"level", "check"} <= set(df.columns):
            df["fragment"] = [check_fragment(lv, c) for lv, c in zip(df["level"], df["check"],
                                                                     strict=True)]
        elif name in ("levels", "power", "pvalues"):
            t[name] = no_rows()[name]
    return t


def first_verification_pair(settings: dict, t: dict[str, pd.DataFrame]) -> str | None:
    """The pair the text quotes: the first the configuration lists that has level-3 rows."""
    levels = t["levels"]
    ran = [p for p in spec_pairs(levels[levels["pair"] != ""]) if p] if len(levels) else []
    listed = [p for p in verification_settings(settings).get("pairs") or [] if p in ran]
    return (listed or ran or [None])[0]


def on_pair(df: pd.DataFrame, fragment: str, pair: str | None) -> pd.DataFrame:
    """Rows of a check: level-3 checks on `pair`, levels 1 and 2 (no pair) as they are."""
    if not len(df) or "fragment" not in df:
        return df.iloc[0:0] if len(df.columns) else pd.DataFrame()
    rows = df[df["fragment"] == fragment]
    level = next(lv for name, lv, _ in CHECKS if name == fragment)
    return rows[rows["pair"] == (pair or "")] if level == 3 or is_long(pair) else rows


def is_long(pair: str | None) -> bool:
    """The long-context pair, whose every level's rows carry its name."""
    return str(pair or "").startswith(LONG_PAIR)


def verification_settings_macros(settings: dict) -> dict[str, str]:
    v = verification_settings(settings)
    ex, mc, real = v.get("exact") or {}, v.get("monte_carlo") or {}, v.get("real") or {}
    ints = lambda xs: ", ".join(str(int(x)) for x in xs or []) or NONE  # noqa: E731
    return {
        "VerK": str(v.get("k", NONE)), "VerAlpha": plain(v.get("alpha")),
        "VerExactRandomPairs": integer(ex.get("random_pairs")),
        "VerExactVocabs": human_list([f"{int(x):,}" for x in ex.get("vocab_sizes") or []],
                                     empty=NONE),
        "VerExactConcentrations": human_list([plain(x) for x in ex.get("concentrations") or []],
                                             empty=NONE),
        "VerExactRealPositions": integer(ex.get("real_positions")),
        "VerBlockVocab": str(ex.get("block_vocab", NONE)),
        "VerBlockKs": ints(ex.get("block_ks")),
        "VerMcDraws": integer(mc.get("draws")), "VerMcVocab": str(mc.get("vocab", NONE)),
        "VerMcBlockDraws": integer(mc.get("block_draws")),
        "VerRealTokens": integer(real.get("tokens")), "VerRealBudget": str(real.get("budget",
                                                                                    NONE)),
        "VerRealTop": str(real.get("top", NONE)),
        "VerRealPrompts": str(real.get("prompts", NONE)),
        "VerExactTol": sci(EXACT_TOL, 1), "VerLiberalLevel": plain(LIBERAL_LEVEL),
    }


def cell(row, column: str, fmt) -> str:
    """fmt(row[column]), or the placeholder where the row lacks it or it is not finite."""
    return fmt(row[column]) if column in row and finite(row[column]) else NONE


def check_macros(t: dict[str, pd.DataFrame], pair: str | None) -> dict[str, str]:
    """Ver<Check><Field><Sampler> for the fields the text quotes (QUOTED, levels 2 and 3):
    every rule's p-value, the correct rule's other fields, from the row of `pair`."""
    macros = {}
    samplers = SAMPLER_ORDER + tuple(s for s in ordered_samplers(t["levels"])
                                     if s not in SAMPLER_ORDER)
    for fragment, fields in QUOTED.items():
        rows = on_pair(t["levels"], fragment, pair)
        for sampler in samplers:
            g = rows[rows["sampler"] == sampler] if len(rows) else rows
            row = g.iloc[0] if len(g) else {}
            values = {"Stat": cell(row, "statistic", lambda x: sig(x).replace(",", "{,}")),
                      "Dof": cell(row, "dof", integer), "P": cell(row, "p_value", pval),
                      "PAsym": cell(row, "p_asymptotic", pval),
                      "Perm": cell(row, "permutations", integer),
                      "N": cell(row, "n", integer)}  # {,}: a statistic is also in math mode
            for field in fields:
                if field == "P" or sampler == "correct":
                    macros[f"Ver{fragment}{field}{camel(sampler)}"] = values[field]
    return macros


def power_macros(t: dict[str, pd.DataFrame], pair: str | None) -> dict[str, str]:
    """VerPower<Check><Sampler> (rate) and VerRejections<Check><Sampler> ('r of s')."""
    macros = {}
    power = t["power"]
    for fragment in POWER_QUOTED:
        rows = on_pair(power, fragment, pair)
        for sampler in SAMPLER_ORDER:
            g = rows[rows["sampler"] == sampler] if len(rows) else rows
            row = g.iloc[0] if len(g) else None
            name = camel(sampler)
            if fragment in ("Chi", "LogRatio"):
                macros[f"VerPower{fragment}{name}"] = (percent(row["rate"]) if row is not None
                                                       else NONE)
            macros[f"VerRejections{fragment}{name}"] = (
                f"{int(row['rejections'])} of {int(row['seeds'])}" if row is not None else NONE)
    real = pd.concat([on_pair(power, f, pair) for f in ("Chi", "LogRatio")]) if len(power) \
        else power
    macros.update({
        "VerPowerSeeds": integer(real["seeds"].max()) if len(real) else NONE,
        "VerPowerAlpha": plain(real["alpha"].iloc[0]) if len(real) else NONE,
        "VerPowerN": integer(real["n"].max()) if len(real) else NONE,
    })
    return macros


def standard_flags(t: dict[str, pd.DataFrame], pair: str | None, fragment: str
               ) -> dict[str, bool]:
    """<Test>RejectsWrong / KeepsCorrect (the full-size run), FullPower (every wrong sampler
    rejected at every seed), Liberal (the right one rejected more often than alpha allows),
    MeetsStandard (all of it: wrong rejected every time, right kept, not liberal)."""
    rows = on_pair(t["levels"], fragment, pair)
    wrong = rows[rows["sampler"].isin(WRONG_SAMPLERS)] if len(rows) else rows
    right = rows[rows["sampler"] == "correct"] if len(rows) else rows
    rejects = bool(len(wrong)) and bool(wrong["rejected"].all())
    keeps = bool(len(right)) and not bool(right["rejected"].any())
    power = on_pair(t["power"], fragment, pair)
    p_wrong = power[power["sampler"].isin(WRONG_SAMPLERS)] if len(power) else power
    p_right = power[power["sampler"] == "correct"] if len(power) else power
    full = bool(len(p_wrong)) and bool((p_wrong["rejections"] >= p_wrong["seeds"]).all())
    liberal = False
    if len(p_right):
        r = p_right.iloc[0]
        test = binomtest(int(r["rejections"]), int(r["seeds"]), float(r["alpha"]),
                               alternative="greater")
        liberal = bool(test.pvalue < LIBERAL_LEVEL)
    meets = rejects and keeps and not liberal and (full or not len(p_wrong))
    name = fragment
    return {f"{name}RejectsWrong": rejects, f"{name}KeepsCorrect": keeps,
            f"{name}FullPower": full, f"{name}Liberal": liberal, f"{name}MeetsStandard": meets}


def greedy_macros(greedy: pd.DataFrame, pair: str | None) -> tuple[dict[str, str], dict]:
    rows = greedy[greedy["pair"] == (pair or "")] if len(greedy) and "pair" in greedy else \
        pd.DataFrame()
    row = rows.iloc[0] if len(rows) else None
    fractions = greedy["fraction_equal"].dropna() if "fraction_equal" in greedy else pd.Series()
    margins = greedy["min_margin"].dropna() if "min_margin" in greedy else pd.Series()
    div = int(row["divergences"]) if row is not None and finite(row["divergences"]) else 0
    macros = {
        "VerGreedyPrompts": integer(row["prompts"]) if row is not None else NONE,
        "VerGreedyFraction": percent(row["fraction_equal"]) if row is not None else NONE,
        "VerGreedyDivergences": str(div) if row is not None else NONE,
        "VerGreedyMinMargin": sig(row["min_margin"]) if row is not None
        and finite(row["min_margin"]) else NONE,
        "VerGreedyNumPairs": str(len(greedy)) if len(greedy) else "0",
        "VerGreedyFractionMin": percent(fractions.min()) if len(fractions) else NONE,
    }
    macros["VerNearTie"] = plain(NEAR_TIE_LOGIT)
    flags = {"VerGreedyRan": row is not None,
             "VerGreedyNearTie": bool(len(margins)) and bool(margins.min() < NEAR_TIE_LOGIT),
             "VerGreedyAllEqual": bool(len(fractions)) and bool((fractions >= 1).all()),
             "VerGreedyMultiPair": len(fractions) > 1}
    return macros, flags


def level_flags(levels: pd.DataFrame) -> dict[str, bool]:
    """VerLevelTwoAsExpected (every level-2 verdict equals the expected one), VerLevelThreeRan."""
    def rows(level: int) -> pd.DataFrame:
        return levels[levels["level"] == level] if len(levels) else levels

    two = rows(2)
    return {"VerLevelTwoAsExpected": bool(len(two)) and bool(
                (two["rejected"] == two["expected_rejected"]).all()),
            "VerLevelThreeRan": len(rows(3)) > 0}


def split_long(t: dict[str, pd.DataFrame]) -> tuple[dict[str, pd.DataFrame], dict]:
    """(the configured pairs' and the toy checks' rows, the long-context pair's rows): the
    standard macros are about the former, `long_macros` about the latter."""
    standard, long = {}, {}
    for name, df in t.items():
        is_long = df["pair"].astype(str).str.startswith(LONG_PAIR) if "pair" in df else \
            pd.Series(False, index=df.index)
        standard[name], long[name] = df[~is_long], df[is_long]
    return standard, long


# What the long section quotes of the standard check and power macros (as LongVer...).
LONG_QUOTED = {"VerChiNCorrect", "VerPowerSeeds", "VerPowerN",
               *(f"Ver{kind}{camel(s)}" for s in SAMPLER_ORDER
                 for kind in ("McSingleP", "ChiP", "LogRatioP", "RejectionsChi",
                              "RejectionsLogRatio"))}


def long_macros(t: dict[str, pd.DataFrame], settings: dict
                ) -> tuple[dict[str, str], dict[str, bool]]:
    """LongVer*: the verification levels on the long-context pair (config 'long.verification'):
    its settings, level 1's largest errors, every rule's p-values at levels 2 and 3 and their
    rejections over seeds, greedy agreement; flags for what it showed."""
    levels = t["levels"]
    pair = str(levels["pair"].iloc[0]) if len(levels) else None
    v = settings.get("long_verification") or {}
    one = levels[levels["level"] == 1] if len(levels) else levels
    right1, wrong1 = (one[one["sampler"] == "correct"],
                      one[one["sampler"].isin(WRONG_SAMPLERS)]) if len(one) else (one, one)
    macros = {
        "LongVerPair": tt(pair) if pair else NONE,
        "LongVerLength": integer(v.get("length")),
        "LongVerPolicy": tt(v["policy"]) if "policy" in v else NONE,
        "LongVerBudget": integer(v.get("kv_budget")), "LongVerK": str(v.get("k", NONE)),
        "LongVerDocuments": str(v.get("documents", NONE)),
        "LongVerExactPairs": integer(right1["n"].max()) if len(right1) else NONE,
        "LongVerExactErrCorrect": sci(right1["statistic"].max()) if len(right1) else NONE,
        "LongVerExactErrWrongMin": sci(wrong1["statistic"].min()) if len(wrong1) else NONE,
        **{f"Long{k}": m for k, m in (check_macros(t, pair) | power_macros(t, pair)).items()
           if k in LONG_QUOTED},
    }
    greedy, _ = greedy_macros(t["greedy"], pair)
    macros["LongVerGreedyFraction"] = greedy["VerGreedyFraction"]
    full = levels[levels["level"] > 1] if len(levels) else levels
    flags = {"LongVerRan": pair is not None,
             "LongVerExactPasses": bool(len(right1)) and not bool(right1["rejected"].any()),
             "LongVerKeepsCorrect": bool(len(full)) and not bool(
                 full[full["sampler"] == "correct"]["rejected"].any())}
    for fragment in ("Chi", "LogRatio"):
        flags[f"LongVer{fragment}RejectsWrong"] = standard_flags(t, pair, fragment)[
            f"{fragment}RejectsWrong"]
    return macros, flags


def verification_macros(t: dict[str, pd.DataFrame] | None, settings: dict
                        ) -> tuple[dict[str, str], dict[str, bool]]:
    """Every verification macro, '--' without the stage, so the paper compiles either way."""
    t, long = split_long(t or no_rows())
    pair = first_verification_pair(settings, t)
    levels = t["levels"]
    l1 = levels[levels["level"] == 1] if len(levels) else levels
    right1 = l1[l1["sampler"] == "correct"] if len(l1) else l1
    wrong1 = l1[l1["sampler"].isin(WRONG_SAMPLERS)] if len(l1) else l1
    pairs_ran = [p for p in spec_pairs(levels) if p]
    macros = {
        **verification_settings_macros(settings), **seed.verification_claims(),
        "VerPair": tt(pair) if pair else NONE,
        "VerNumPairsRun": str(len(pairs_ran)),
        "VerPairsRun": human_list([tt(p) for p in pairs_ran]),
        "VerExactErrCorrect": sci(right1["statistic"].max()) if len(right1) else NONE,
        "VerExactErrWrongMin": sci(wrong1["statistic"].min()) if len(wrong1) else NONE,
        **check_macros(t, pair), **power_macros(t, pair),
    }
    g_macros, g_flags = greedy_macros(t["greedy"], pair)
    macros.update(g_macros)
    flags = {"VerExactPasses": bool(len(right1)) and not bool(right1["rejected"].any()),
             "VerExactRejectsWrong": bool(len(wrong1)) and bool(
                 wrong1[wrong1["expected_rejected"]]["rejected"].all()),
             "VerMultiPair": len(pairs_ran) > 1, **level_flags(levels), **g_flags}
    chi, log_ratio = (standard_flags(t, pair, f) for f in ("Chi", "LogRatio"))
    flags |= {k: chi[k] for k in ("ChiRejectsWrong", "ChiFullPower", "ChiLiberal",
                                  "ChiMeetsStandard")}
    flags["LogRatioMeetsStandard"] = log_ratio["LogRatioMeetsStandard"]
    long_m, long_f = long_macros(long, settings)
    return macros | long_m, flags | long_f


def verdict(rejected: bool) -> str:
    return "rejected" if rejected else "kept"


def statistic_cell(row) -> str:
    fragment = row.get("fragment")
    if int(row["level"]) == 1:
        return sci(row["statistic"])
    symbol = "t" if fragment == "LogRatio" else r"\chi^2"
    value = sig(row["statistic"]).replace(",", "{,}")  # a thousands comma in math mode
    return f"${symbol} = {value}$" if finite(row["statistic"]) else NONE


def ordered_checks(df: pd.DataFrame) -> list[tuple[int, str, str]]:
    """(level, pair, check) in the order levels, pairs, then the file's order of checks."""
    if not len(df):
        return []
    keys = list(dict.fromkeys(df[["level", "pair", "check"]].itertuples(index=False, name=None)))
    return sorted(keys, key=lambda k: (k[0], k[1]))


LEVEL_TITLES = {1: "exact, in closed form", 2: "Monte Carlo", 3: "real models, two samples"}


def grouped_rows(df: pd.DataFrame, ncols: int, cells) -> list:
    """Rows of a per-level table: a \\midrule and an italic title row before each level, then
    `cells(row, first)` for every (pair, check, sampler), `first` on a check's first sampler."""
    rows = []
    last_level = None
    for level, pair, check in ordered_checks(df):
        if level != last_level:
            if last_level is not None:
                rows.append(None)
            title = f"Level {int(level)}: {LEVEL_TITLES.get(int(level), '')}".rstrip(": ")
            rows.append([f"\\multicolumn{{{ncols}}}{{@{{}}l}}{{\\emph{{{title}}}}}"])
            last_level = level
        g = df[(df["level"] == level) & (df["pair"] == pair) & (df["check"] == check)]
        for i, sampler in enumerate(ordered_samplers(g)):
            rows.append(cells(g[g["sampler"] == sampler].iloc[0], i == 0))
    return rows


def verification_table(t: dict[str, pd.DataFrame] | None) -> str:
    levels = t["levels"] if t else pd.DataFrame()

    def cells(r, first: bool) -> list[str]:
        seen = verdict(bool(r["rejected"]))
        mismatch = bool(r["rejected"]) != bool(r["expected_rejected"])
        return [tex_escape(r["check"]) if first else "", tt(r["pair"]) if r["pair"] and first
                else "", tt(r["sampler"]), statistic_cell(r),
                integer(r["dof"]) if finite(r["dof"]) else "",
                pval(r["p_value"]) if finite(r["p_value"]) else "", integer(r["n"]),
                f"\\textbf{{{seen}}}" if mismatch else seen,
                verdict(bool(r["expected_rejected"]))]

    header = [r"Check & Pair & Sampler & Statistic & dof & $p$ & $n$ & Verdict & Expected \\"]
    return tabular("@{}llllrrrll@{}", header, grouped_rows(levels, 9, cells),
                   "no verification in this build")


def power_table(t: dict[str, pd.DataFrame] | None) -> str:
    power = t["power"] if t else pd.DataFrame()

    def cells(r, first: bool) -> list[str]:
        return [tex_escape(r["check"]) if first else "", tt(r["pair"]) if r["pair"] and first
                else "", tt(r["sampler"]), integer(r["n"]) if first else "",
                f"{int(r['rejections'])} / {int(r['seeds'])}", percent(r["rate"]),
                "false rejections" if r["sampler"] == "correct" else "power"]

    alpha = plain(power["alpha"].iloc[0]) if len(power) and "alpha" in power else NONE
    header = [f"Check & Pair & Sampler & $n$ per seed & rejected at {alpha} & rate & "
              r"meaning \\"]
    return tabular("@{}llllrrl@{}", header, grouped_rows(power, 7, cells),
                   "no power run in this build")


def parts(stats_dir: Path, settings: dict) -> Section:
    t = read_verification(stats_dir)
    macros, flags = verification_macros(t, settings)
    return stage("VerificationReady", t is not None, Section(macros, flags, {
        "tab_verification.tex": verification_table(t), "tab_power.tex": power_table(t)}))
