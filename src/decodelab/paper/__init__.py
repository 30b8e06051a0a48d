"""Generated TeX for the paper, a module per section, and its LaTeX build (`build`).

Each section module has `parts(stats_dir, settings) -> Section`: the macros and flags it
defines and the tables it writes. A section of an optional stage (speculative, verification,
regime depth) also defines a `...Ready` flag, false when its tables are absent, so the paper
compiles either way.
"""
