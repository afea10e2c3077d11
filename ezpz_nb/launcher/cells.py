"""What a ``%%ranks`` cell does on a rank: run its source in the rank's namespace.

The rank side of the magic (:mod:`ezpz_nb.magic` is the notebook side): a rank
imports this module, never the magic, so running a cell loads nothing of the notebook
side. Frames of a cell carry a file name made by :func:`ezpz_nb.launcher.kernel.ranks_cell_file`,
and the cell's source is registered in ``linecache`` under it (here on the rank, and in
the notebook by the magic), so tracebacks and hang reports show the cell's lines.
"""

from __future__ import annotations

import ast
import importlib
import linecache
from collections.abc import Mapping
from typing import Any

from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.runtime import current

__all__ = ["register_source", "run_cell"]


def register_source(filename: str, source: str) -> None:
    """Make ``source`` the lines ``linecache`` shows for frames of ``filename``."""
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def run_cell(
    source: str,
    filename: str,
    shipped: Mapping[str, Any] | None = None,
    modules: Mapping[str, str] | None = None,
) -> Any:
    """Execute a cell's source in this rank's persistent namespace (runs on a rank).

    Args:
        source: The cell's code, as the rank compiles it (line numbers as in the cell).
        filename: The name its frames show (registered in linecache).
        shipped: Notebook functions, classes and modules the cell names; they
            replace older values of those names on the rank.
        modules: ``{name: module}``: modules a cell finds under those names unless an
            earlier cell set them, imported here by name (the magic's ``torch``,
            ``dist`` and ``ez``).

    Returns:
        The value of the cell's last line when it is an expression, else None.
    """
    import torch.distributed as dist

    runtime = current()
    if runtime is None:
        raise EzpzError("run_cell runs on a launcher rank (through %%ranks)")
    ns = runtime.namespace
    for name, module in (modules or {}).items():
        if name not in ns:
            ns[name] = importlib.import_module(module)
    ns.update(shipped or {})
    ns.update(rank=dist.get_rank(), world_size=dist.get_world_size())
    register_source(filename, source)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    exec(compile(tree, filename, "exec"), ns)
    return eval(compile(last, filename, "eval"), ns) if last is not None else None
