"""Snakemake workflow conventions: snakefmt-formatted, `snakemake --lint` clean, every profile
described in config/README.md. Each check is first shown to fail on a file that breaks it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from dag import PROFILES, ROOT, copy_workflow, snakemake

SNAKEFMT = str(Path(sys.executable).with_name("snakefmt"))
SNAKEFILES = ["Snakefile", *sorted(f"workflow/rules/{p.name}"
                                   for p in (ROOT / "workflow/rules").glob("*.smk"))]
UNFORMATTED = 'rule a:\n    output: "x"\n    shell: "touch x"\n'  # one-line directives
UNLINTED = 'rule a:\n    output:\n        "x",\n    shell:\n        "touch x"\n'  # no log, no env


def snakefmt_check(*files: str) -> subprocess.CompletedProcess:
    """`snakefmt --check` with the project's settings ([tool.snakefmt] in pyproject.toml)."""
    return subprocess.run([SNAKEFMT, "--check", *files], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_snakefmt_check_catches_an_unformatted_rule(tmp_path):
    bad = tmp_path / "bad.smk"
    bad.write_text(UNFORMATTED)
    assert snakefmt_check(str(bad)).returncode == 1


def test_snakefile_and_rules_are_snakefmt_clean():
    out = snakefmt_check(*SNAKEFILES)
    assert out.returncode == 0, (f"{out.stderr.strip()}\nformat them with: snakefmt "
                                 "Snakefile workflow/rules")


def test_snakemake_lint_catches_a_rule_without_log_or_environment(tmp_path):
    (tmp_path / "Snakefile").write_text(UNLINTED)
    assert snakemake(tmp_path, "--lint", check=False).returncode == 1


def test_the_workflow_is_snakemake_lint_clean(tmp_path):
    out = snakemake(copy_workflow(tmp_path), "--lint", check=False)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


def described_profiles() -> set[str]:
    """The profile files that config/README.md has a section for (`## config/paper.yaml`)."""
    text = (ROOT / "config/README.md").read_text()
    return set(re.findall(r"^## `?([\w./-]+\.yaml)`?", text, re.M))


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
def test_every_profile_is_described_in_config_readme(profile):
    assert str(profile.relative_to(ROOT)) in described_profiles()


def test_config_readme_describes_no_profile_that_is_gone():
    assert described_profiles() <= {str(p.relative_to(ROOT)) for p in PROFILES}


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def markdown_anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as `-`."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    """The relative links of a Markdown page (outside fenced code) whose file or heading is
    absent."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in markdown_anchors(
                file.read_text(encoding="utf-8")):
            broken.append(target)
    return broken


def test_the_link_check_catches_a_missing_file_and_heading(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n[b](b.md) [here](#a-page) [gone](#nowhere)\n"
                                   "[web](https://example.org) [c](c.md)\n")
    (tmp_path / "b.md").write_text("# B\n")
    assert broken_links(tmp_path / "a.md") == ["#nowhere", "c.md"]


@pytest.mark.parametrize("page", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_in_readme_and_docs_resolves(page):
    assert broken_links(page) == []
