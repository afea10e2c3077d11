"""Under nbmake, every notebook's printed output must fit 100 columns.

JupyterLab's output area at a laptop's width holds about 107 columns of text and breaks a
longer line wherever the edge falls, inside a word or a number ("2." / "01e-01" reads as
2). So what the notebooks print is kept to :data:`COLUMNS`, wrapped between words; this
hook reads the notebook nbmake just ran and fails it on any longer line of text output
(streams and ``text/plain`` results; errors are nbmake's own failure, figures have no
columns). tests/test_notebooks_clean.py runs :func:`wide_lines` on a notebook that breaks
it, so the check cannot pass whatever the notebooks print.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

#: The widest printed line a notebook may show.
COLUMNS = 100

#: The slowest notebooks under nbmake, slowest first (measured on a 2-core machine: 19's
#: solutions take a third of the whole pass). Each notebook is one test, and xdist hands
#: them out in collection order: sorted by name, the slowest began last and ran alone while
#: the other worker idled (35% of the pass). The rest keep their order after these.
SLOW_FIRST = (
    "19_loader_memory_solutions.ipynb",
    "17_mixing_solutions.ipynb",
    "11_real_text_solutions.ipynb",
    "12_throughput_solutions.ipynb",
    "15_data_in_the_checkpoint_solutions.ipynb",
    "04_step_alignment.ipynb",
)
#: torch's words, not ours to wrap, as 14's torchrun agents print them: C++ log lines
#: (glog's "W1204 17:49:53.04 TCPStore.cpp:115]"), C++ stack frames, and a worker's output
#: as torchrun --tee relays it ("[default0]:[rank0]: ..."); tests/test_browser.py skips the same.
NOT_OURS = re.compile(r"^(\[[^\]]*\]:? ?)*(\[?[WEIF]\d{4} |frame #\d+: |\[default\d+\]:)")


def wide_lines(nb: Any, columns: int = COLUMNS) -> list[str]:
    """``cell N: <line>`` for each line of printed output longer than ``columns``.

    Printed output is stdout and results shown as plain text; stderr holds libraries'
    warnings and logs (not ours to wrap), and a result with a richer view (a figure, a
    widget, HTML) shows that view, not its text.
    """
    found = []
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for n, cell in enumerate(code):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if out["output_type"] == "stream" and out.get("name") == "stdout":
                text = out["text"]
            elif out["output_type"] in ("execute_result", "display_data") and set(data) == {
                "text/plain"
            }:
                text = data["text/plain"]
            else:
                continue
            text = "".join(text) if isinstance(text, list) else text
            found += [
                f"code cell {n}: {line[:140]!r} ({len(line)} columns)"
                for line in text.splitlines()
                if len(line) > columns and not NOT_OURS.match(line)
            ]
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the slowest notebooks first (:data:`SLOW_FIRST`), so none runs alone at the end."""

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)

    items.sort(key=rank)  # stable: the others keep their order


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not getattr(item, "nbmake", False):
        return (yield)
    from nbmake.nb_run import NotebookRun

    runs: list[Any] = []
    execute = NotebookRun.execute

    def keep(self: NotebookRun) -> Any:
        result = execute(self)
        runs.append(result)
        return result

    NotebookRun.execute = keep  # type: ignore[method-assign]
    try:
        outcome = yield
    finally:
        NotebookRun.execute = execute  # type: ignore[method-assign]
    wide = [line for run in runs for line in wide_lines(run.nb)]
    if wide:
        raise AssertionError(
            f"{item.name}: printed lines wider than {COLUMNS} columns (the output area breaks "
            "them mid-word): wrap them between words, e.g. with ezpz_nb.wrapping.wrap_message:\n"
            + "\n".join(wide)
        )
    return outcome
