"""The HTML report (`make report`) in a real browser: Debian's Chromium, driven by Playwright, opens
the report of the default run (the e2e run, shared), walks its menu and views every figure."""

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dag import ROOT

from decodelab.core import tables

CHROMIUM = Path("/usr/bin/chromium")
# A closed network: nothing in Chromium may try to reach out (updates, sync, QUIC probes).
CLOSED_NETWORK = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"]
SCREENSHOT = ROOT / "results/report.png"  # for the README; generated, never committed
SHOWN_FIGURE = ("Decode regimes", "combined", "results/combined/figures/latency.png")
MENU = ["Workflow", "Statistics", "About"]  # Snakemake's own items, before the categories


def why_no_browser() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is not installed (`make browser` installs Debian's with apt as root)"
    if importlib.util.find_spec("playwright") is None:  # found, not imported: 0.3 s a worker
        return "playwright is not installed (pinned in requirements.lock: `make setup`)"
    return None


WHY_NO_BROWSER = why_no_browser()
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(WHY_NO_BROWSER is not None, reason=WHY_NO_BROWSER or "")]


# --- What the workflow says the report holds ------------------------------------------------

def rules_text() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "workflow/rules").glob("*.smk")))


def figure_categories() -> dict[str, str]:
    """Path pattern -> category of every file the rules mark with report(), tables aside."""
    marked = re.findall(r'report\(\s*"([^"]+)",[^)]*?category="([^"]+)"', rules_text(), re.S)
    assert marked, "no report() call with a literal path and category in workflow/rules/"
    return dict(marked)


def expected_categories() -> set[str]:
    """The figures' categories and the merged tables' (the merge_hosts rule reads them from
    decodelab.core.tables)."""
    return set(figure_categories().values()) | {t.category for t in tables.all_tables()}


def pattern_regex(pattern: str) -> re.Pattern:
    return re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(pattern)) + "$")


# --- The report as the browser shows it -------------------------------------------------------

@dataclass
class Visit:
    categories: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # shown paths
    errors: list[str] = field(default_factory=list)  # console errors and uncaught exceptions
    outside: list[str] = field(default_factory=list)  # requests that left the file
    unrendered: list[str] = field(default_factory=list)  # figures whose image did not draw
    screenshot: Path | None = None
    screenshot_drawn: bool = False  # whether the figure in the screenshot drew


def menu_labels(page) -> list[str]:
    return page.locator("nav ul > li > a > span").all_inner_texts()


def open_category(page, category: str) -> None:
    page.locator("nav ol > li > a").first.click()  # home
    click_menu_item(page, category)
    page.locator("nav ol").get_by_text(category, exact=True).wait_for()


def click_menu_item(page, label: str) -> None:
    page.locator("nav ul > li > a").filter(
        has=page.locator(f"span:text-is({label!r})")).first.click()


def shown_paths(page) -> list[str]:
    page.locator("nav table tbody tr").first.wait_for()
    return page.locator("nav table tbody tr td:first-child").all_inner_texts()


# The content pane's image (the navbar has the logo) when it shows the file at path p.
SHOWN_IMAGE = """p => Array.from(document.querySelectorAll("img"))
    .find(img => !img.closest("nav") && img.src === results[p].data_uri)"""


def figure_draws(page, row: int, path: str) -> bool:
    """Press the row's eye button: the content pane must show that file's image, decoded."""
    page.locator("nav table tbody tr").nth(row).locator("td:last-child a").first.click()
    image = page.wait_for_function(SHOWN_IMAGE, arg=path)
    return image.evaluate("img => img.decode().then(() => img.naturalWidth > 0, () => false)")


def walk_category(page, category: str, visit: Visit) -> None:
    """Every subcategory's listed files; each figure among them viewed."""
    open_category(page, category)
    one = page.locator("nav table").count() > 0  # one subcategory: shown at once, unnamed
    visit.categories[category] = {}
    for subcategory in [""] if one else menu_labels(page):
        if subcategory:
            open_category(page, category)
            click_menu_item(page, subcategory)
        paths = shown_paths(page)
        visit.categories[category][subcategory] = paths
        visit.unrendered += [path for row, path in enumerate(paths)
                             if path.endswith(".png") and not figure_draws(page, row, path)]


def show_figure(page, category: str, subcategory: str, path: str, out: Path) -> bool:
    """A screenshot of the report showing one figure beside its category's list; whether the
    figure drew."""
    open_category(page, category)
    click_menu_item(page, subcategory)
    paths = shown_paths(page)
    drawn = figure_draws(page, paths.index(path), path)
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out))
    return drawn


def in_the_file(url: str) -> bool:
    return url.startswith(("file:", "data:"))


def visit_report(report: Path, profile: Path, screenshot: Path) -> Visit:
    """Open the report offline, walk every category and view every figure, recording errors."""
    from playwright.sync_api import TimeoutError, sync_playwright

    visit = Visit()
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=CLOSED_NETWORK,
            viewport={"width": 1400, "height": 900})
        context.route(lambda url: not in_the_file(url), lambda route: route.abort())
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and visit.errors.append(m.text))
        page.on("pageerror", lambda e: visit.errors.append(f"uncaught: {e}"))
        page.on("request", lambda r: in_the_file(r.url) or visit.outside.append(r.url))
        page.goto(report.as_uri(), wait_until="load")
        try:
            page.locator("nav ul > li > a > span", has_text="Workflow").wait_for(timeout=60_000)
        except TimeoutError as e:
            raise AssertionError(f"{report}: the report's menu never appeared; errors: "
                                 f"{visit.errors}") from e
        for category in [label for label in menu_labels(page) if label not in MENU]:
            walk_category(page, category, visit)
        visit.screenshot_drawn = show_figure(page, *SHOWN_FIGURE, screenshot)
        visit.screenshot = screenshot
        context.close()
    return visit


@pytest.fixture(scope="module")
def visit(default_dag, default_report, tmp_path_factory) -> Visit:
    return visit_report(default_dag / "results/report.html",
                        tmp_path_factory.mktemp("chromium-profile"), SCREENSHOT)


def test_the_report_opens_with_no_error_and_asks_the_network_nothing(visit):
    assert visit.errors == []
    assert visit.outside == []


def test_every_category_the_workflow_names_is_in_the_menu(visit):
    assert set(visit.categories) == expected_categories()
    for category, subcategories in visit.categories.items():
        assert subcategories and all(subcategories.values()), category


def test_every_figure_is_under_its_category_and_draws(visit):
    for pattern, category in figure_categories().items():
        shown = [p for paths in visit.categories.get(category, {}).values() for p in paths]
        assert any(pattern_regex(pattern).match(p) for p in shown), (pattern, category)
    figures = [p for c in visit.categories.values() for ps in c.values() for p in ps
               if p.endswith(".png")]
    assert figures and visit.unrendered == []


def test_every_merged_table_is_under_its_category(visit, default_dag):
    merged = sorted((default_dag / "results/combined/stats").glob("*.csv"))
    assert merged
    for table in merged:
        category = visit.categories.get(tables.report_category(table.stem), {})
        shown = [p for paths in category.values() for p in paths]
        assert f"results/combined/stats/{table.name}" in shown, table.name


def test_a_screenshot_of_a_figure_is_written_for_the_readme(visit):
    assert visit.screenshot == SCREENSHOT and visit.screenshot_drawn, SHOWN_FIGURE
    assert SCREENSHOT.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
