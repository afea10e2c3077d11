"""Notebooks in a real browser: JupyterLab + headless Chromium, driven by playwright.

Runs every cell of 02, 06 and 08 in JupyterLab (started by ``ezpz-nb lab``) with
"Run All Cells", in a window the size of a laptop screen with the file browser
open, and checks what a learner sees: no traceback anywhere, every figure shown
at (nearly) its own width, so its 9 px text is not shrunk
(tests/test_figure_legibility.py checks the text at that width), and in 06 the
explorer live, in the setup its "Things to try" start from, redrawing when a
slider moves. Screenshots are kept in test-artifacts/.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _browser_lab import Lab, jupyterlab

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
# A laptop screen; JupyterLab opens with its file browser beside the notebook.
VIEWPORT = {"width": 1280, "height": 900}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium at /usr/bin/chromium "
        "(apt-get install -y chromium chromium-driver)",
    ),
]


# True once every code cell shows an execution count (none pending "[*]", none blank).
# Queries look only inside the notebook on show (PANEL), not in tabs left from a workspace.
PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"
ALL_CELLS_RUN = f"""() => {{
    const p = [...document.querySelectorAll('{PANEL} .jp-CodeCell .jp-InputPrompt')]
        .map(e => e.textContent.trim());
    return p.length > 0 && p.every(t => /^\\[\\d+\\]:$/.test(t));
}}"""

# Every figure in an output: its natural width and the width it is shown at.
IMAGES = f"""() => [...document.querySelectorAll('{PANEL} .jp-OutputArea-output img')]
    .map(img => ({{
        natural: img.naturalWidth, shown: img.getBoundingClientRect().width,
        cell: [...document.querySelectorAll('{PANEL} .jp-CodeCell')]
            .indexOf(img.closest('.jp-CodeCell')),
    }}))"""


@pytest.fixture(scope="module")
def browser_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, Any]]:
    """One ``ezpz-nb lab`` and one headless Chromium for the module's notebooks."""
    sync_api = pytest.importorskip("playwright.sync_api")
    ARTIFACTS.mkdir(exist_ok=True)
    with jupyterlab(tmp_path_factory.mktemp("lab")) as lab, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            yield lab, browser
        finally:
            browser.close()


def run_all(lab: Lab, browser: Any, notebook: str, timeout_s: float) -> Any:
    """Open ``notebook``, Run All Cells, wait until every cell ran; the page, checked.

    Checked for every notebook: no cell shows a traceback (none of these notebooks
    has a cell tagged ``raises-exception``), and every figure is shown at 90% or
    more of its natural width.
    """
    tags = [c.get("metadata", {}).get("tags", []) for c in _cells(lab, notebook)]
    assert not any("raises-exception" in t for t in tags), "expected errors: check them per cell"
    page = browser.new_page(viewport=VIEWPORT)
    try:
        # A workspace of its own: no tab of an earlier notebook is restored beside it.
        page.goto(lab.url(f"lab/workspaces/{Path(notebook).stem}/tree/{notebook}"))
        page.wait_for_selector(".jp-NotebookPanel .jp-CodeCell", timeout=60_000)
        _wait_kernel_idle(lab, notebook, timeout=60)
        page.get_by_role("menuitem", name="Run", exact=True).click()
        page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
        page.wait_for_function(ALL_CELLS_RUN, timeout=timeout_s * 1000)
        errors = page.locator(
            f"{PANEL} .jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"
            ":has-text('Traceback')"
        )
        assert errors.count() == 0, errors.first.inner_text()[-2000:]
        page.wait_for_function(
            f"() => [...document.querySelectorAll('{PANEL} .jp-OutputArea-output img')]"
            ".every(i => i.complete && i.naturalWidth > 0)",
            timeout=30_000,
        )
        images = page.evaluate(IMAGES)
        assert images, f"{notebook} showed no figure"
        shrunk = [i for i in images if i["shown"] < 0.9 * i["natural"]]
        assert not shrunk, f"figures shown below 90% of their width: {shrunk}"
        page.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}.png"), full_page=False)
        return page
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}-failure.png"))
        page.close()
        raise


def _wait_kernel_idle(lab: Lab, notebook: str, timeout: float) -> None:
    """Wait until ``notebook``'s own kernel has started and is idle."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for s in lab.api("sessions") or []:
            if (
                s.get("path", "").endswith(notebook)
                and (s.get("kernel") or {}).get("execution_state") == "idle"
            ):
                return
        time.sleep(0.3)
    raise TimeoutError(f"{notebook}: no idle kernel within {timeout:.0f} s")


def _stop_kernels(lab: Lab) -> None:
    """Shut every kernel down (and with it its ranks) before the next notebook runs."""
    for k in lab.api("kernels") or []:
        lab.api(f"kernels/{k['id']}", method="DELETE")


def _cells(lab: Lab, notebook: str) -> list[dict[str, Any]]:
    """The notebook's cells as the server stores them."""
    model = lab.api(f"contents/{notebook}")
    content = model["content"]
    return content["cells"] if isinstance(content, dict) else json.loads(content)["cells"]


@pytest.mark.parametrize(
    ("notebook", "timeout_s"), [("02_dp_sharding.ipynb", 120), ("08_capstone.ipynb", 180)]
)
def test_notebook_runs_clean_with_figures_at_full_size(browser_lab, notebook, timeout_s):
    """Guards: 08's heatmaps shown at 48% and 71% of their width (digits illegible), and a
    traceback in a notebook cell that Run All reaches."""
    lab, browser = browser_lab
    try:
        run_all(lab, browser, notebook, timeout_s).close()
    finally:
        _stop_kernels(lab)


def test_explorer_after_run_all_is_live_in_its_described_setup(browser_lab):
    """Guards: Run All leaving 06's explorer in the broken setup a later cell shows (dp_group
    and broadcast off), or closed, while "Things to try" starts from the sound one; and an
    explorer that does not redraw when a slider moves."""
    lab, browser = browser_lab
    page = run_all(lab, browser, "06_explorer.ipynb", 120)
    try:
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
        boxes = explorer.locator("input[type='checkbox']")
        assert boxes.count() == 5
        names = [
            t.strip("\u200b\n ") for t in explorer.locator(".widget-checkbox").all_inner_texts()
        ]
        checked = {name: boxes.nth(i).is_checked() for i, name in enumerate(names)}
        assert checked == {
            "drop_last": False,
            "shuffle": True,
            "set_epoch": True,
            "broadcast within TP": True,
            "pass dp_group": True,
        }, checked
        assert explorer.locator("input:disabled").count() == 0, "the explorer was closed"
        status = explorer.locator(".widget-html").first
        first_status = status.inner_text()
        assert first_status.startswith("run "), first_status
        said = explorer.locator(".jp-OutputArea-output").first.inner_text()
        assert "dp_duplicate" in said and "tp_mismatch" not in said, said
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
        images = page.evaluate(IMAGES)
        assert all(i["shown"] >= 0.9 * i["natural"] for i in images), images
        explorer.screenshot(path=str(ARTIFACTS / "explorer.png"))
        page.screenshot(path=str(ARTIFACTS / "explorer-page.png"), full_page=False)
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "explorer-failure.png"))
        raise
    finally:
        page.close()
        _stop_kernels(lab)
