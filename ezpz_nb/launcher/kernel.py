"""Whether this process is an IPython shell or a Jupyter kernel, asked in one place.

Nothing here imports IPython: a script that never imported it is not in a kernel,
and importing it just to ask would cost a plain script a quarter of a second.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["in_jupyter_kernel", "ipython_cell_name", "running_cell", "shell"]


def shell() -> Any | None:
    """The running IPython shell, or None (a script, a rank, torchrun)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def in_jupyter_kernel() -> bool:
    """True inside a Jupyter kernel (not a plain IPython shell or script)."""
    if "ipykernel" not in sys.modules:
        return False
    return getattr(shell(), "kernel", None) is not None


#: Cells run by ``%%ranks``, by the file name their frames carry: (execution count,
#: lines above the code in the cell). Filled by the magic; read when naming frames.
RANKS_CELLS: dict[str, tuple[int, int]] = {}


def running_cell() -> int | None:
    """The execution count of the cell running now (the one that called us), or None.

    Read off the call stack (the cell's own frame), because when IPython counts a
    cell up has changed between versions.
    """
    frame = sys._getframe(1)
    while frame is not None:
        named = ipython_cell_name(frame.f_code.co_filename)
        if named is not None:
            return named[0]
        frame = frame.f_back  # type: ignore[assignment]
    return None


def ipython_cell_name(filename: str) -> tuple[int, int] | None:
    """``(execution count, line offset)`` of the cell a frame's file name belongs to.

    IPython compiles each cell into a file of its own and remembers which execution
    count compiled it; ``%%ranks`` cells are remembered by the magic. None when the
    file is not a cell of this kernel (or not in a kernel at all).
    """
    if filename in RANKS_CELLS:
        return RANKS_CELLS[filename]
    names = getattr(getattr(shell(), "compile", None), "_filename_map", None)
    count = names.get(filename) if isinstance(names, dict) else None
    return (count, 0) if isinstance(count, int) else None
