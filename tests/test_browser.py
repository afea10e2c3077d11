"""The explorer notebook in a real browser: JupyterLab + headless Chromium, driven by playwright.

Runs every cell of 06_explorer.ipynb in JupyterLab (started by ``ezpz-nb lab``), drags the
explorer's "dataset length" slider one step with the keyboard, and checks that
the widget and the redrawn plot render; the Progress displays must have drawn
their bars. A screenshot is kept in test-artifacts/.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _browser_lab import jupyterlab

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]
# Copied into the lab folder by `ezpz-nb lab` from wherever ezpz_nb is installed.
NOTEBOOK = "06_explorer.ipynb"
ARTIFACTS = REPO / "test-artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium "
        "(apt-get install -y chromium chromium-driver)",
    ),
]


# True once every code cell shows an execution count (none pending "[*]", none blank).
ALL_CELLS_RUN = """() => {
    const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
        .map(e => e.textContent.trim());
    return p.length > 0 && p.every(t => /^\\[\\d+\\]:$/.test(t));
}"""


def test_explorer_notebook_runs_and_redraws_in_chromium(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyterlab(tmp_path) as lab, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(lab.url(f"lab/tree/{NOTEBOOK}"))
            page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=60_000)
            lab.wait_kernel_idle(timeout=60)
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            page.wait_for_function(ALL_CELLS_RUN, timeout=90_000)
            errors = page.locator(
                ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
                ":has-text('Traceback')"
            )
            assert errors.count() == 0, errors.first.inner_text()

            # Both Progress displays drew one bar per rank (widget mode: a frontend is
            # there); the hand-sharded run's two short ranks are flagged.
            progress = page.locator(".ezpz-progress")
            assert progress.count() == 2
            assert progress.first.locator(".widget-hprogress").count() == 4
            assert progress.first.get_by_text("100/100").count() == 4
            assert progress.last.locator(".progress-bar-danger").count() == 2

            explorer = page.locator(".ezpz-explorer")
            explorer.scroll_into_view_if_needed()
            assert explorer.is_visible()
            assert explorer.locator(".widget-slider, .widget-hslider").count() >= 4
            assert explorer.locator("input[type='checkbox']").count() == 5
            status = explorer.locator(".widget-html").first
            first_status = status.inner_text()
            assert first_status.startswith("run "), first_status
            plots = explorer.locator(".jp-OutputArea-output img")
            plots.first.wait_for(timeout=30_000)
            assert plots.count() == 2
            before = plots.first.get_attribute("src")

            slider = explorer.locator(".widget-hslider").filter(has_text="dataset length")
            slider.locator(".noUi-handle").focus()
            page.keyboard.press("ArrowRight")
            page.wait_for_function(
                "([el, old]) => el.innerText.startsWith('run ') && el.innerText !== old",
                arg=[status.element_handle(), first_status],
                timeout=60_000,
            )
            assert slider.locator(".widget-readout").inner_text().strip() == "12"
            plots.first.wait_for(timeout=30_000)
            assert plots.count() == 2
            after = plots.first.get_attribute("src")
            assert after and after != before, "the heatmap was not redrawn"
            assert page.evaluate(
                "(img) => img.complete && img.naturalWidth > 100", plots.first.element_handle()
            )
            explorer.screenshot(path=str(ARTIFACTS / "explorer.png"))
            page.screenshot(path=str(ARTIFACTS / "explorer-page.png"), full_page=False)
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / "explorer-failure.png"))
            raise
        finally:
            browser.close()
