"""The ``%%ranks`` cell magic: run a cell's code on every rank of a live cluster.

Each rank keeps one namespace for all ``%%ranks`` cells, so names set in one cell
are there in the next, like a second notebook running on every rank. It starts
with ``torch``, ``dist`` (torch.distributed), ``ez`` (ezpz_nb), ``rank`` and
``world_size``. The notebook's functions, classes and modules that a cell names
travel with it (by value, as for ``ez.launch``); the notebook's data does not:
a rank has its own values, set by earlier ``%%ranks`` cells.
"""

from __future__ import annotations

import argparse
import ast
import functools
import itertools
import linecache
import shlex
import sys
import types
from typing import Any

from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.cluster import Cluster, live_clusters
from ezpz_nb.launcher.errors import LaunchValueError, RankError
from ezpz_nb.launcher.kernel import RANKS_CELLS, running_cell, shell
from ezpz_nb.launcher.runtime import current
from ezpz_nb.launcher.session import SESSION
from ezpz_nb.launcher.startup import pack_naming_culprit

_COUNTER = itertools.count(1)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%ranks", add_help=False)
    p.add_argument(
        "-n",
        "--world-size",
        type=int,
        default=None,
        help="number of ranks (default: the running cluster's, else 2)",
    )
    p.add_argument(
        "-t",
        "--timeout",
        type=float,
        default=None,
        help="seconds before HangError (default: the cluster's own, 60 for a new one)",
    )
    p.add_argument("--restart", action="store_true", help="start fresh ranks")
    return p


def _register_source(filename: str, source: str) -> None:
    # Tracebacks and hang reports show cell lines through linecache.
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def run_cell(source: str, filename: str, shipped: dict[str, Any] | None = None) -> Any:
    """Execute a cell's source in this rank's persistent namespace (runs on a rank).

    Args:
        source: The cell's code.
        filename: The name its frames show (registered in linecache).
        shipped: Notebook functions, classes and modules the cell names; they
            replace older values of those names on the rank.

    Returns:
        The value of the cell's last line when it is an expression, else None.
    """
    import torch
    import torch.distributed as dist

    runtime = current()
    if runtime is None:
        raise EzpzError("run_cell runs on a launcher rank (through %%ranks)")
    ns = runtime.namespace
    ns.setdefault("torch", torch)
    ns.setdefault("dist", dist)
    # The package is loaded already (importing this module loaded it first): taken
    # from sys.modules, so that this module needs nothing above it.
    ns.setdefault("ez", sys.modules[__name__.rpartition(".")[0]])
    ns.update(shipped or {})
    ns.update(rank=dist.get_rank(), world_size=dist.get_world_size())
    _register_source(filename, source)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body[-1].value)
        tree.body.pop()
    exec(compile(tree, filename, "exec"), ns)
    return eval(compile(last, filename, "eval"), ns) if last is not None else None


def get_cluster(world_size: int | None, timeout: float | None, restart: bool = False) -> Cluster:
    """The latest running cluster with this world size, or a new one.

    A timeout given here applies to that cluster's later runs too.
    """
    if not restart:
        for c in reversed(live_clusters()):
            if world_size is None or c.world_size == world_size:
                if timeout is not None:
                    c.timeout = timeout
                return c
    if SESSION.magic_cluster is not None:
        SESSION.magic_cluster.close()
    own = Cluster(world_size or 2, 60.0 if timeout is None else timeout)
    SESSION.magic_cluster = own
    return own


def ranks(line: str, cell: str) -> None:
    """Run the cell on every rank; show each rank's last-expression value."""
    try:
        opts = _parser().parse_args(shlex.split(line))
    except SystemExit:
        raise LaunchValueError(
            f"%%ranks: cannot parse {line!r}; usage: %%ranks [-n N] [-t SECONDS] [--restart]"
        ) from None
    shipped, data = notebook_names(cell, _user_ns())
    cluster = get_cluster(opts.world_size, opts.timeout, opts.restart)
    filename = f"<ranks-cell-{next(_COUNTER)}>"
    _register_source(filename, cell)
    count = running_cell()
    if count is not None:
        # Frames of this cell are named as IPython names the cell: In[count], one line
        # lower for the %%ranks line above the code.
        RANKS_CELLS[filename] = (count, 1)
    try:
        results = cluster.run(run_cell, cell, filename, shipped)
    except RankError as exc:
        hint = _data_hint(exc, data)
        if not hint:
            raise
        raise RankError(
            exc.failures, exc.events, note="\n".join(filter(None, [exc.note, hint]))
        ) from None
    for r, value in enumerate(results):
        if value is not None:
            print(f"[rank {r}] Out: {value!r}")
    return None


_TRAVELS = (types.FunctionType, type, types.ModuleType, functools.partial)
_RANK_NAMES = {"torch", "dist", "ez", "rank", "world_size"}


def _user_ns() -> dict[str, Any]:
    ipython = shell()
    return dict(ipython.user_ns) if ipython is not None else {}


def notebook_names(source: str, user_ns: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Split the notebook names a cell reads into what travels and what does not.

    Functions, classes, modules and partials of the notebook are sent with the cell;
    data is not (each rank has its own, set by earlier ``%%ranks`` cells), so its
    names are only returned to explain a ``NameError``.

    Raises:
        TypeError: a function or class the cell names cannot be sent to the ranks.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}, set()  # the ranks report it, with the cell's line
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    shipped, data = {}, set()
    for name in sorted(read - _RANK_NAMES):
        if name.startswith("_") or name not in user_ns:
            continue
        value = user_ns[name]
        if isinstance(value, _TRAVELS):
            shipped[name] = value
        else:
            data.add(name)
    pack_naming_culprit(
        shipped,
        list(shipped.items()),
        lambda name, _, exc: (
            f"%%ranks: the cell uses {name!r} from the notebook, which cannot be sent "
            f"to the ranks ({type(exc).__name__}: {exc}). Define it in a %%ranks cell "
            "instead, or make what it refers to picklable."
        ),
    )
    return shipped, data


def _data_hint(exc: RankError, data: set[str]) -> str:
    missing = sorted(
        name
        for name in data
        for f in exc.failures.values()
        if f"name '{name}' is not defined" in f.message
    )
    if not missing:
        return ""
    names = ", ".join(dict.fromkeys(missing))
    return (
        f"{names}: set in the notebook, but %%ranks cells run in each rank's own namespace, "
        "where only the notebook's functions, classes and modules arrive. Set the value in "
        "a %%ranks cell, or compute it inside a function of the notebook."
    )


def register(ipython: Any) -> None:
    """Register ``%%ranks`` with an IPython shell."""
    ipython.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
