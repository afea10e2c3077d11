"""The ``%%ranks`` cell magic: run a cell's code on every rank of a live cluster.

Each rank keeps one namespace for all ``%%ranks`` cells, so names set in one cell
are there in the next, like a second notebook running on every rank. It starts
with ``torch``, ``dist`` (torch.distributed), ``ez`` (ezpz_nb), ``rank`` and
``world_size``.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import linecache
import shlex
from typing import Any

from ezpz_nb.launch import Cluster, live_clusters

_COUNTER = itertools.count(1)
_OWN: Cluster | None = None  # the cluster the magic started, if any


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%ranks", add_help=False)
    p.add_argument("-n", "--world-size", type=int, default=None,
                   help="number of ranks (default: the running cluster's, else 2)")
    p.add_argument("-t", "--timeout", type=float, default=None,
                   help="seconds before HangError (default: the cluster's own, 60 for a new one)")
    p.add_argument("--restart", action="store_true", help="start fresh ranks")
    return p


def _register_source(filename: str, source: str) -> None:
    # Tracebacks and hang reports show cell lines through linecache.
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)


def run_cell(source: str, filename: str) -> Any:
    """Execute a cell's source in this rank's persistent namespace (runs on a rank).

    Returns:
        The value of the cell's last line when it is an expression, else None.
    """
    import torch
    import torch.distributed as dist

    import ezpz_nb
    from ezpz_nb._rank import NAMESPACE as ns

    ns.setdefault("torch", torch)
    ns.setdefault("dist", dist)
    ns.setdefault("ez", ezpz_nb)
    ns.update(rank=dist.get_rank(), world_size=dist.get_world_size())
    _register_source(filename, source)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), ns)
    return eval(compile(last, filename, "eval"), ns) if last is not None else None


def get_cluster(world_size: int | None, timeout: float | None, restart: bool = False) -> Cluster:
    """The latest running cluster with this world size, or a new one.

    A timeout given here applies to that cluster's later runs too.
    """
    global _OWN
    if not restart:
        for c in reversed(live_clusters()):
            if world_size is None or c.world_size == world_size:
                if timeout is not None:
                    c.timeout = timeout
                return c
    if _OWN is not None:
        _OWN.close()
    _OWN = Cluster(world_size or 2, 60.0 if timeout is None else timeout)
    return _OWN


def ranks(line: str, cell: str) -> None:
    """Run the cell on every rank; show each rank's last-expression value."""
    try:
        opts = _parser().parse_args(shlex.split(line))
    except SystemExit:
        raise ValueError(f"%%ranks: cannot parse {line!r}; usage: %%ranks [-n N] [-t SECONDS] "
                         "[--restart]") from None
    cluster = get_cluster(opts.world_size, opts.timeout, opts.restart)
    filename = f"<ranks-cell-{next(_COUNTER)}>"
    _register_source(filename, cell)
    results = cluster.run(run_cell, cell, filename)
    for r, value in enumerate(results):
        if value is not None:
            print(f"[rank {r}] Out: {value!r}")
    return None


def register(ipython: Any) -> None:
    """Register ``%%ranks`` with an IPython shell."""
    ipython.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
