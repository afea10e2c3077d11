"""Each notebook's first code cell imports what the README's examples use.

A learner pastes the README's ``hello`` (``torch.tensor``, ``dist.all_reduce``,
``ez.launch``) into any notebook; without ``import torch`` there, every rank fails
with ``NameError``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import jupytext
import pytest

CELLS = Path(__file__).resolve().parents[1] / "notebooks" / "_cells"
# The README's first example: import torch, torch.distributed as dist; import ezpz_nb as ez.
NEEDED = {("torch", "torch"), ("torch.distributed", "dist"), ("ezpz_nb", "ez")}
# 05 is the workshop: its exercises run through ezpz_nb.workshop, not ez.launch. 14 runs
# nothing on ranks from the notebook: it writes a torchrun worker file and starts torchrun.
SOURCES = [p for p in sorted(CELLS.glob("*.py")) if not p.name.startswith(("05_", "14_"))]


def first_imports(path: Path) -> set[tuple[str, str]]:
    """``(module, bound name)`` of the plain imports in the first code cell that imports."""
    nb = jupytext.read(path, fmt="py:percent")
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        lines = [ln for ln in cell.source.splitlines() if not ln.startswith(("%", "!"))]
        tree = ast.parse("\n".join(lines))
        found = {
            (a.name, a.asname or a.name)
            for node in tree.body
            if isinstance(node, ast.Import)
            for a in node.names
        }
        if found and not any(isinstance(n, ast.If) for n in tree.body):  # not 00's install cell
            return found
    return set()


@pytest.mark.parametrize("path", SOURCES, ids=[p.stem for p in SOURCES])
def test_first_cell_imports_what_the_readme_uses(path: Path) -> None:
    """Guards: 02 importing ``torch.distributed as dist`` but not ``torch`` (NameError on every rank)."""
    missing = NEEDED - first_imports(path)
    assert not missing, f"{path.name}: the first code cell should also import {sorted(missing)}"
