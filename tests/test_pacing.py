"""The workshop's stated times: every notebook states one, and the 3-hour cut adds up.

Pure text checks over the notebook sources and ``INSTRUCTOR.md``; no ranks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SOURCES = sorted((NOTEBOOKS / "_cells").glob("[0-9][0-9]_*.py"))


def _first_markdown_cell(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index("# %% [markdown]")
    end = text.find("\n# %%", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_every_notebook_states_its_time_in_its_first_cell(source):
    """Guards the README's promise that each notebook's first cell states its time (07-10
    once did not), so an instructor can plan from the notebooks alone."""
    assert re.search(r"\*\*Time:\*\* [^\n]*\d+ minutes", _first_markdown_cell(source)), source.name


def _schedule(heading: str) -> list[tuple[int, str, int | None]]:
    """Rows ``(start minute, what, minutes)`` of the first table after ``heading``."""
    text = (NOTEBOOKS / "INSTRUCTOR.md").read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    rows = []
    for line in section.splitlines():
        m = re.match(r"\| (\d+):(\d\d) \| (.*?) \| *(\d*) *\|$", line)
        if m:
            rows.append((60 * int(m[1]) + int(m[2]), m[3], int(m[4]) if m[4] else None))
        elif rows:
            break
    return rows


def test_the_three_hour_cut_adds_up_to_three_hours_with_a_break():
    """Guards a schedule that does not fit: each row starts where the last one ended, the
    last row ends at 3:00, a break is in it, and every core notebook it keeps has a slot."""
    rows = _schedule("### The 3-hour cut")
    assert rows, "INSTRUCTOR.md has no 3-hour cut table"
    for (start, what, minutes), (next_start, _, _) in zip(rows, rows[1:], strict=False):
        assert minutes is not None and start + minutes == next_start, what
    assert rows[-1][0] == 180 and rows[-1][2] is None
    names = " ".join(what for _, what, _ in rows)
    assert "break" in names
    for nb in ("01", "02", "03", "04"):
        assert f"{nb} ·" in names, nb


def _readme_times() -> dict[str, list[int]]:
    """``{notebook: the minutes in its README row}`` (``35-45 min`` gives ``[35, 45]``)."""
    text = (NOTEBOOKS.parent / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\d\d_\w+)` \| ([^|]*) \|", text, re.M)
    return {name: [int(n) for n in re.findall(r"\d+", time)] for name, time in rows}


def test_the_readme_states_the_times_the_notebooks_state():
    """Guards two sites of one number drifting apart (the README said 25 minutes where the
    notebook said 35 to 45): each README row's minutes open its notebook's Time line, and
    every notebook has a row."""
    readme = _readme_times()
    assert {p.stem for p in SOURCES} == set(readme), "a notebook without a README row"
    for source in SOURCES:
        line = re.search(r"\*\*Time:\*\* ([^\n]*)", _first_markdown_cell(source))
        assert line is not None, source.name
        stated = [int(n) for n in re.findall(r"\d+", line[1])]
        assert stated[: len(readme[source.stem])] == readme[source.stem], source.name
