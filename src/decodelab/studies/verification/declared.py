"""The verification study's declarations.

What the registry (`decodelab.studies`) reads of this study: its tables, where it stands in the
paper, its paper sections and the figures the paper reads."""

from __future__ import annotations

from decodelab.core.tables import Table

ORDER = 60
SECTIONS = ("paper",)
FIGURES = ("verification_tokens", "verification_pvalues")


VERIFICATION_TEXT = ("pair", "check", "sampler")
def verification(key: str, numeric: tuple[str, ...], flags: tuple[str, ...] = ()) -> Table:
    return Table(f"verification_{key}", "verification", "verification_stats", "Verification",
                 numeric=numeric, flags=flags, text=VERIFICATION_TEXT, optional=True)


TABLES = (
    verification("levels", ("level", "statistic", "dof", "p_value", "n"),
                 flags=("rejected", "expected_rejected")),
    verification("power", ("level", "n", "seeds", "alpha", "rejections", "rate")),
    verification("pvalues", ("level", "p_value", "seed")),
    verification("tokens", ("rank", "autoregressive", "speculative", "n_autoregressive",
                            "n_speculative")),
    verification("greedy", ("prompts", "fraction_equal", "divergences", "min_margin")),
)
