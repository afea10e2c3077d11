"""Whether this process is an IPython shell or a Jupyter kernel, asked in one place, and
which notebook cell a frame's file name is.

Both sides import it: a rank's failures and stacks name cells with it too (there no
shell answers, so only a ``%%ranks`` cell's own file name says its cell). Nothing here imports IPython: a script that never imported it is not in a kernel,
and importing it just to ask would cost a plain script a quarter of a second.
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["in_jupyter_kernel", "ipython_cell_name", "ranks_cell_file", "running_cell", "shell"]


def shell() -> Any | None:
    """The running IPython shell, or None (a script, a rank, torchrun)."""
    ipython = sys.modules.get("IPython")
    return ipython.get_ipython() if ipython is not None else None


def in_jupyter_kernel() -> bool:
    """True inside a Jupyter kernel (not a plain IPython shell or script)."""
    if "ipykernel" not in sys.modules:
        return False
    return getattr(shell(), "kernel", None) is not None


#: The file name of a ``%%ranks`` cell's frames: its serial number (unique in this
#: kernel) and, in a kernel, the execution count IPython gave the cell. The name carries
#: the count, so the notebook names the frames without keeping a table of cells.
_RANKS_CELL = re.compile(r"<ranks-cell-\d+(?: In\[(\d+)\])?>")


def ranks_cell_file(serial: int, count: int | None) -> str:
    """The file name for frames of the ``serial``-th ``%%ranks`` cell, run as In[``count``]."""
    return f"<ranks-cell-{serial}>" if count is None else f"<ranks-cell-{serial} In[{count}]>"


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
    count compiled it; a ``%%ranks`` cell's file name says it (:func:`ranks_cell_file`).
    None when the file is not a cell of this kernel (or not in a kernel at all).
    """
    ranks_cell = _RANKS_CELL.fullmatch(filename)
    if ranks_cell is not None:
        return (int(ranks_cell[1]), 0) if ranks_cell[1] else None
    names = getattr(getattr(shell(), "compile", None), "_filename_map", None)
    count = names.get(filename) if isinstance(names, dict) else None
    return (count, 0) if isinstance(count, int) else None
