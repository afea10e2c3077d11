"""What a job's folder says once its ranks are done: the results, or the launcher's errors.

Pure functions over what the ranks wrote (:mod:`ezpz_nb.slurm.rank`), so that a job
on a scheduler fails in the same words as ``ez.launch``: a rank's exception is a
``RankError`` folded by failure, a hang a ``HangError`` with every rank's stack.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import re
from pathlib import Path
from typing import Any

from ezpz_nb.launcher.errors import HangError, RankError, ranks_text
from ezpz_nb.launcher.failures import RankFailure, decode, from_exit, stopped
from ezpz_nb.launcher.stacks import RankStack, parse_faulthandler, stack_from_frames
from ezpz_nb.launcher.wire import Error, Ok, Unpicklable, loads
from ezpz_nb.ledger import Ledger
from ezpz_nb.slurm.rank import RUN_MARKER

__all__ = [
    "dumped",
    "exit_codes",
    "failure_tail",
    "hang_error",
    "only_peers_gone",
    "rank_error",
    "read_ranks",
    "read_replies",
    "sample_hash",
    "stacks",
    "where_note",
]

#: torchrun's report of a failed rank: ``rank : 1 (local_rank: 0)`` then ``exitcode : 3``.
_EXIT = re.compile(r"rank\s*:\s*(\d+) \(local_rank[^\n]*\n\s*exitcode\s*:\s*(-?\d+)")
#: What a rank says when a peer it waited for in a collective went away: under torchrun
#: it notices (ez.launch stops such ranks first), but it is a consequence, not a cause.
_PEER_GONE = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe")


def read_ranks(job_dir: Path) -> dict[int, dict[str, Any]]:
    """``{rank: {"node", "host", "pid", "local_rank"}}`` for the ranks that started."""
    found = {}
    for f in sorted((job_dir / "ranks").glob("rank-*.json")):
        try:
            info = json.loads(f.read_text())
        except ValueError:
            continue  # being written
        found[int(info["rank"])] = info
    return found


def read_replies(job_dir: Path) -> dict[int, Ok | Error | Unpicklable]:
    """Each rank's reply, for the ranks that wrote one."""
    replies = {}
    for f in (job_dir / "replies").glob("rank-*.pkl"):
        rank = int(f.stem.split("-")[1])
        try:
            replies[rank] = loads(f.read_bytes())
        except (OSError, pickle.UnpicklingError, EOFError):
            continue
    return replies


def _peer_gone(f: RankFailure) -> bool:
    return f.kind == "exception" and bool(_PEER_GONE.search(f.message))


def only_peers_gone(replies: dict[int, Ok | Error | Unpicklable]) -> bool:
    """True when every failure a rank reported is a peer gone from its collective.

    Then the cause is elsewhere: Slurm ended a node (time limit, node failure) and the
    ranks left behind only saw it go.
    """
    return all(_peer_gone(decode(r, m)) for r, m in replies.items() if not isinstance(m, Ok))


def where_note(job_id: str, ranks: dict[int, dict[str, Any]], which: list[int]) -> str:
    """``job 7: rank 1 ran on node n1; ranks 2-3 on n2.``: the nodes of ``which``."""
    by_node: dict[str, list[int]] = {}
    for r in which:
        by_node.setdefault(ranks.get(r, {}).get("node", "an unknown node"), []).append(r)
    parts = [f"{ranks_text(rs)} on {node}" for node, rs in by_node.items()]
    return f"Slurm job {job_id}: " + "; ".join(parts) + "."


def rank_error(
    job_id: str,
    world_size: int,
    replies: dict[int, Ok | Error | Unpicklable],
    ranks: dict[int, dict[str, Any]],
    exits: dict[int, int] | None = None,
) -> RankError | None:
    """The ``RankError`` the replies amount to, or None when every rank returned.

    ``exits``: each rank's exit code as torchrun reported it (:func:`exit_codes`).

    A rank without a reply was stopped (Slurm ended it when another failed), as is
    a rank whose only error is that a failed peer left its collective; when no rank
    raised anything else, the ranks without a reply died and are the cause.
    """
    failures = {r: decode(r, m) for r, m in replies.items() if not isinstance(m, Ok)}
    if not failures:
        return None
    causes = {r: f for r, f in failures.items() if not _peer_gone(f)}
    silent = [r for r in range(world_size) if r not in replies]
    if not causes and silent:
        # Every error is a peer gone, so a rank that left without a word is the cause:
        # its process died (os._exit, a crash, the out-of-memory killer).
        codes = exits or {}
        causes = {
            r: from_exit(r, codes[r]) if r in codes else _died(job_id, r)
            for r in silent
            if r in ranks
        }
    if causes:
        failures = {**{r: stopped(r) for r in failures}, **causes}
    # A rank that returned is no failure; one silent and not a cause was stopped.
    failures.update(
        {r: stopped(r) for r in range(world_size) if r not in replies and r not in failures}
    )
    failed = [r for r, f in failures.items() if f.kind != "stopped"]
    return RankError(failures, note=where_note(job_id, ranks, sorted(failed)))


def _died(job_id: str, rank: int) -> RankFailure:
    return RankFailure(
        rank,
        "exit",
        "",
        "ended without replying: its process died (os._exit, a crash, or the "
        f"out-of-memory killer); torchrun's report in slurm-{job_id}.out (the job folder) "
        "gives its exit code",
    )


def exit_codes(job_dir: Path, job_id: str) -> dict[int, int]:
    """``{rank: exit code}`` from torchrun's failure reports in Slurm's output file."""
    return {int(r): int(c) for r, c in _EXIT.findall(_slurm_out(job_dir, job_id))}


def _slurm_out(job_dir: Path, job_id: str) -> str:
    """Slurm's own output file for the job, or "" while it does not exist."""
    try:
        return (job_dir / f"slurm-{job_id}.out").read_text(errors="replace")
    except OSError:
        return ""


def dumped(job_dir: Path, rank: int) -> bool:
    """True once ``rank``'s stack dump (written at its timeout) holds its main thread."""
    try:
        text = (job_dir / "stacks" / f"rank-{rank}.txt").read_text()
    except OSError:
        return False
    return RUN_MARKER in text


def sample_hash(ledger: Ledger) -> str:
    """A digest of the sample-id stream per (epoch, step, rank): equal runs, equal hashes."""
    rows = sorted((r.epoch, r.step, r.rank, tuple(r.sample_ids)) for r in ledger.records)
    return hashlib.sha256(repr(rows).encode()).hexdigest()[:16]


def stacks(job_dir: Path, world_size: int, finished: set[int]) -> dict[int, RankStack]:
    """Where each rank was, from the dumps faulthandler wrote at the job's timeout."""
    out = {}
    for r in range(world_size):
        if r in finished:
            out[r] = RankStack(r, "finished")
            continue
        try:
            text = (job_dir / "stacks" / f"rank-{r}.txt").read_text()
        except OSError:
            text = ""
        frames = parse_faulthandler(text, RUN_MARKER)
        out[r] = stack_from_frames(r, frames) if frames else RankStack(r, "unknown")
    return out


def hang_error(job_dir: Path, world_size: int, timeout: float, finished: set[int]) -> HangError:
    """The ``HangError`` of a job whose ranks outlived its timeout."""
    return HangError(stacks(job_dir, world_size, finished), timeout)


def failure_tail(job_dir: Path, job_id: str, lines: int = 15) -> str:
    """The end of Slurm's own output file for the job (torchrun's and srun's messages)."""
    return "\n".join(_slurm_out(job_dir, job_id).rstrip().splitlines()[-lines:])
