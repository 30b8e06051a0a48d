"""What one section of the paper generates, and how an optional stage's section says it ran."""

from __future__ import annotations

from dataclasses import dataclass, field

from decodelab.report.tex import NONE


@dataclass(frozen=True)
class Section:
    """macros (\\newcommand name -> TeX), flags (\\newif name -> value) and generated files
    (file name -> TeX) of one section."""
    macros: dict[str, str]
    flags: dict[str, bool]
    files: dict[str, str] = field(default_factory=dict)


def stage(ready: str, ran: bool, section: Section) -> Section:
    """The section of an optional stage, its flag `ready` first: true when the stage ran."""
    return Section(section.macros, {ready: ran, **section.flags}, section.files)


def placeholders(section: Section) -> Section:
    """The same macros as '--' and flags as false: what the paper shows of a stage that did
    not run, derived from what the section builds when it did (on tables without rows)."""
    return Section(dict.fromkeys(section.macros, NONE), dict.fromkeys(section.flags, False),
                   section.files)
