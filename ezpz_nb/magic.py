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
import shlex
import types
from typing import Any

from ezpz_nb.launcher.cells import register_source, run_cell
from ezpz_nb.launcher.cluster import Cluster, live_clusters
from ezpz_nb.launcher.errors import LaunchValueError, RankError
from ezpz_nb.launcher.kernel import ranks_cell_file, running_cell, shell
from ezpz_nb.launcher.session import SESSION, Session
from ezpz_nb.launcher.startup import pack_naming_culprit


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


def get_cluster(
    world_size: int | None,
    timeout: float | None,
    restart: bool = False,
    session: Session = SESSION,
) -> Cluster:
    """The latest running cluster with this world size, or a new one.

    A timeout given here applies to that cluster's later runs too.
    """
    if not restart:
        for c in reversed(live_clusters(session)):
            if world_size is None or c.world_size == world_size:
                if timeout is not None:
                    c.timeout = timeout
                return c
    if session.ranks.cluster is not None:
        session.ranks.cluster.close()
    own = Cluster(world_size or 2, 60.0 if timeout is None else timeout, session=session)
    session.ranks.cluster = own
    return own


def ranks(line: str, cell: str, session: Session = SESSION) -> None:
    """Run the cell on every rank; show each rank's last-expression value."""
    try:
        opts = _parser().parse_args(shlex.split(line))
    except SystemExit:
        raise LaunchValueError(
            f"%%ranks: cannot parse {line!r}; usage: %%ranks [-n N] [-t SECONDS] [--restart]"
        ) from None
    job, data = cell_job(cell, _user_ns(), running_cell(), session.ranks.next_serial())
    cluster = get_cluster(opts.world_size, opts.timeout, opts.restart, session)
    try:
        results = cluster.run_job(job)
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
#: The modules every cell finds on the ranks unless a cell set those names: imported by
#: name on the rank (``ez`` too: its names load on first use there, as here).
_MODULES = {"torch": "torch", "dist": "torch.distributed", "ez": "ezpz_nb"}
_RANK_NAMES = {*_MODULES, "rank", "world_size"}


def _user_ns() -> dict[str, Any]:
    ipython = shell()
    return dict(ipython.user_ns) if ipython is not None else {}


def notebook_names(source: str, user_ns: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Split the notebook names a cell reads into what travels and what does not.

    Functions, classes, modules and partials of the notebook are sent with the cell;
    data is not (each rank has its own, set by earlier ``%%ranks`` cells), so its
    names are only returned to explain a ``NameError``. Nothing is pickled here.
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
    return shipped, data


def cell_job(
    cell: str, user_ns: dict[str, Any], count: int | None, serial: int
) -> tuple[bytes, set[str]]:
    """A cell's job for ``Cluster.run_job``, pickled once, and the notebook data it reads.

    Args:
        cell: The cell's code (below the ``%%ranks`` line).
        user_ns: The notebook's names.
        count: The cell's execution count in the kernel (None: not in a kernel).
        serial: The cell's number among this session's ``%%ranks`` cells.

    Raises:
        LaunchTypeError: a function or class the cell names cannot be sent to the ranks.
    """
    filename = ranks_cell_file(serial, count)
    # In a kernel the %%ranks line is the cell's line 1: one line above the code keeps
    # the rank's line numbers those of the cell as IPython shows it.
    source = cell if count is None else "\n" + cell
    register_source(filename, source)  # the notebook's own linecache, for its reports
    shipped, data = notebook_names(cell, user_ns)
    return _pack(source, filename, shipped), data


def _pack(source: str, filename: str, shipped: dict[str, Any]) -> bytes:
    return pack_naming_culprit(
        (run_cell, (source, filename, shipped, _MODULES), {}),
        list(shipped.items()),
        lambda name, _, exc: (
            f"%%ranks: the cell uses {name!r} from the notebook, which cannot be sent "
            f"to the ranks ({type(exc).__name__}: {exc}). Define it in a %%ranks cell "
            "instead, or make what it refers to picklable."
        ),
    )


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
