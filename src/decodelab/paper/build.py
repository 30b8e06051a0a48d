"""The paper's build: every section's generated TeX, then latexmk.

The paper sources under `paper/` never contain a result; they `\\input` generated/macros.tex
(a \\newcommand per quoted number or string, a \\newif per flag, from every section) and the
tab_*.tex tables that the sections write.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from decodelab import studies
from decodelab.core.errors import DecodelabError
from decodelab.core.io import atomic
from decodelab.paper import artifact
from decodelab.report import environment, noise, settings
from decodelab.report.section import Section
from decodelab.report.tex import macros_tex

# The sections no single study owns; each study's paper modules come from the registry.
CORE_SECTIONS = (settings, environment, noise, artifact)
STUDY_TEX = "generated/studies.tex"  # \input by paper.tex: every study's own section.tex


def all_sections() -> list:
    return [*CORE_SECTIONS, *studies.sections()]


def merged(sections: list[Section]) -> Section:
    """One section of all: a macro, flag or file that two sections define is a bug."""
    out = Section({}, {}, {})
    for section in sections:
        for mine, theirs in ((out.macros, section.macros), (out.flags, section.flags),
                             (out.files, section.files)):
            if twice := sorted(set(mine) & set(theirs)):
                raise ValueError(f"defined by two sections of the paper: {twice}")
            mine.update(theirs)
    return out


def write_generated(stats_dir: Path, settings: dict, out_dir: Path) -> list[Path]:
    """macros.tex and tab_*.tex under `out_dir`, from the stats tables and the settings."""
    paper = merged([section.parts(Path(stats_dir), settings) for section in all_sections()])
    files = {"macros.tex": macros_tex(paper.macros, paper.flags), **paper.files,
             Path(STUDY_TEX).name: study_inputs()}
    return [atomic(Path(out_dir) / name, lambda p, text=text: p.write_text(text))
            for name, text in files.items()]


# kpathsea's settings for this run: TeX reads and writes only below the build directory (no
# absolute paths, no '..', no dot files) and runs no shell command, whatever the TeX says.
CONFINED = {"openin_any": "p", "openout_any": "p", "shell_escape": "f"}


def study_inputs() -> str:
    """The \\input of every study's own section.tex, in the paper's order."""
    return "".join(f"\\input{{sections/{tex.parent.name}.tex}}\n"
                   for tex in studies.files("section.tex"))


def latexmk(build_dir: Path, main: str = "paper.tex") -> Path:
    if shutil.which("latexmk") is None:
        raise DecodelabError("latexmk is not on PATH; install TeX Live (latexmk, pdflatex)")
    cmd = ["latexmk", "-pdf", "-interaction=nonstopmode", "-halt-on-error",
           "-pdflatex=pdflatex -no-shell-escape %O %S", main]
    done = subprocess.run(cmd, cwd=build_dir, capture_output=True, text=True,
                          env={**os.environ, **CONFINED})
    if done.returncode != 0:
        log = Path(build_dir) / Path(main).with_suffix(".log")
        raise DecodelabError(f"latexmk failed (exit {done.returncode}); see {log}\n"
                             f"{done.stdout[-3000:]}")
    return Path(build_dir) / Path(main).with_suffix(".pdf")


def build(sources: Path, stats_dir: Path, figures_dir: Path, settings: dict,
          build_dir: Path, out: Path) -> Path:
    """Copy the sources, generate TeX, copy the figures, compile, and place the PDF at `out`."""
    build_dir = Path(build_dir)
    shutil.rmtree(build_dir, ignore_errors=True)
    shutil.copytree(sources, build_dir)
    for tex in studies.files("section.tex"):
        shutil.copy2(tex, build_dir / "sections" / f"{tex.parent.name}.tex")
    write_generated(stats_dir, settings, build_dir / "generated")
    (build_dir / "figures").mkdir(exist_ok=True)
    for pdf in sorted(Path(figures_dir).glob("*.pdf")):
        shutil.copy2(pdf, build_dir / "figures" / pdf.name)
    pdf = latexmk(build_dir)
    return atomic(out, lambda p: shutil.copyfile(pdf, p))
