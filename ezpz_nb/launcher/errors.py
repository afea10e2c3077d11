"""Exceptions raised in the notebook when ranks fail or hang, and how they are worded.

Ranks send plain data (strings, frame tuples) rather than exception objects, so a
failure always reaches the notebook even when the exception itself cannot be
pickled. The notebook fills in source lines from its own ``linecache``: cell code
is only known to the kernel, not to ranks started from a clean forkserver.
"""

from __future__ import annotations

import linecache
import os
import re
import signal
import sysconfig
from dataclasses import dataclass, field
from typing import Any

from ezpz_nb.errors import EzpzError

__all__ = [
    "EzpzError",
    "RankError",
    "HangError",
    "RankFailure",
    "RankStack",
    "RankEvent",
]

# (filename, lineno, function name, source line or "")
Frame = tuple[str, int, str, str]


@dataclass(frozen=True)
class RankEvent:
    """An item a rank published while it ran (see :func:`ezpz_nb.events.publish`).

    Attributes:
        rank: Global rank that published it.
        item: The published object (already unpickled).
        time: ``time.monotonic()`` in the notebook process when it arrived.
    """

    rank: int
    item: Any
    time: float


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank.

    Attributes:
        rank: Global rank.
        kind: ``"exception"``, ``"signal"``, ``"exit"``, ``"unpicklable"`` or ``"stopped"``.
        exc_type: Qualified name of the exception type (``""`` when not an exception).
        message: One-line description.
        traceback: The rank's formatted traceback, with cell source lines filled in.
        signal: Signal number when the rank was killed by one.
    """

    rank: int
    kind: str
    exc_type: str
    message: str
    traceback: str = ""
    signal: int | None = None


class RankError(EzpzError, RuntimeError):
    """One or more ranks failed; the other ranks were stopped or finished.

    Attributes:
        failures: ``{rank: RankFailure}`` for every rank that failed.
        events: Items the ranks published before the failure, in arrival order.
    """

    def __init__(
        self,
        failures: dict[int, RankFailure],
        events: list[RankEvent] | None = None,
        note: str = "",
    ):
        self.failures = dict(sorted(failures.items()))
        self.events = list(events or [])
        self.note = note
        super().__init__(self._render())

    @property
    def ranks(self) -> list[int]:
        """Ranks that failed, in order."""
        return [r for r, f in self.failures.items() if f.kind != "stopped"]

    def _render(self) -> str:
        primary = [f for f in self.failures.values() if f.kind != "stopped"]
        stopped = [f.rank for f in self.failures.values() if f.kind == "stopped"]
        who = ", ".join(str(f.rank) for f in primary) or "?"
        lines = [f"rank {who} failed: " + "; ".join(f"rank {f.rank}: {f.message}" for f in primary)]
        if stopped:
            lines.append(
                f"ranks {stopped} were still running (probably waiting in a collective "
                "for the failed rank) and were stopped."
            )
        if self.note:
            lines.append(self.note)
        for f in primary:
            if f.traceback:
                lines.append(f"\n--- rank {f.rank} traceback ---\n{f.traceback.rstrip()}")
        return "\n".join(lines)


@dataclass(frozen=True)
class RankStack:
    """Where one rank was when a run timed out.

    Attributes:
        rank: Global rank.
        state: ``"blocked"`` (inside a call), ``"finished"`` (returned already) or
            ``"unknown"`` (no stack could be read).
        call: The torch.distributed (or other library) function it was blocked in.
        where: ``"line 9 of the cell"``-style location of the user's own line.
        source: That line's source text.
        frames: The rank's main-thread stack, outermost first.
    """

    rank: int
    state: str
    call: str | None = None
    where: str | None = None
    source: str = ""
    frames: tuple[Frame, ...] = field(default_factory=tuple)

    def describe(self) -> str:
        """One line such as ``rank 0: barrier() at line 9 of the cell``."""
        if self.state == "finished":
            return (
                f"rank {self.rank}: finished its function; the others are waiting "
                "for it in a call it never made"
            )
        if self.state == "unknown" or not self.frames:
            return f"rank {self.rank}: stack unavailable"
        call = f"{self.call}()" if self.call else "running Python code"
        where = f" at {self.where}" if self.where else ""
        src = f"  ->  {self.source}" if self.source else ""
        return f"rank {self.rank}: {call}{where}{src}"


class HangError(EzpzError, TimeoutError):
    """The ranks did not finish within the timeout; every rank was stopped.

    Attributes:
        stacks: ``{rank: RankStack}`` saying where each rank was.
        timeout: The timeout that expired, in seconds.
        events: Items the ranks published before the timeout, in arrival order.
    """

    def __init__(
        self, stacks: dict[int, RankStack], timeout: float, events: list[RankEvent] | None = None
    ):
        self.stacks = dict(sorted(stacks.items()))
        self.timeout = timeout
        self.events = list(events or [])
        lines = [
            f"ranks did not finish within {timeout:g} s; this usually means they called "
            "different collectives or a different number of them. Where each rank was:"
        ]
        lines += ["  " + s.describe() for s in self.stacks.values()]
        lines.append(
            "All ranks were stopped. Make every rank make the same collective calls "
            "in the same order (or raise `timeout=` if the work is just slow)."
        )
        super().__init__("\n".join(lines))


# ---------------------------------------------------------------- formatting helpers

_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
_PKG = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # ezpz_nb/
_EXAMPLES = os.path.join(_PKG, "examples")
_CELL_RE = re.compile(r"(ipykernel_\d+[/\\]\d+\.py$)|(<ipython-input-)|(<ranks-cell-\d+>)")
_PLUMBING = {"wrapper", "inner", "_fn", "fn", "decorate_context"}


def is_library(filename: str) -> bool:
    """Frames that belong to torch, the stdlib or our plumbing rather than to the user."""
    if filename.startswith("<") and not _CELL_RE.search(filename):
        return True
    path = os.path.realpath(filename)
    if path.startswith(_EXAMPLES):
        return False
    return (
        f"{os.sep}torch{os.sep}" in path
        or path.startswith(_STDLIB)
        or path.startswith(_PKG)
        or "site-packages" in path
    )


def _is_torch(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}" in filename


def describe_location(filename: str, lineno: int) -> str:
    """``line 9 of cell In[4]`` for notebook cells, ``file.py:9`` otherwise."""
    if _CELL_RE.search(filename):
        cell = _cell_number(filename)
        return f"line {lineno} of cell In[{cell}]" if cell else f"line {lineno} of the cell"
    return f"{os.path.basename(filename)}:{lineno}"


def _cell_number(filename: str) -> int | None:
    # The function may come from an earlier cell than the one that launched it;
    # IPython knows which execution count compiled each cell file.
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    return names.get(filename) if isinstance(names, dict) else None


def fill_line(filename: str, lineno: int, line: str) -> str:
    """The source line, looked up in the notebook's linecache when the rank lacked it."""
    if line:
        return line.strip()
    return linecache.getline(filename, lineno).strip()


def format_frames(frames: list[Frame]) -> str:
    """Render frames like the standard traceback module does."""
    out = []
    for filename, lineno, name, line in frames:
        out.append(f'  File "{filename}", line {lineno}, in {name}\n')
        text = fill_line(filename, lineno, line)
        if text:
            out.append(f"    {text}\n")
    return "".join(out)


def format_chain(chain: list[tuple[list[Frame], str, str]]) -> str:
    """Render an exception chain sent by a rank: [(frames, "Type: message", link)]."""
    parts = []
    for frames, header, link in chain:
        if link:
            parts.append(f"\n{link}\n\n")
        if frames:
            parts.append("Traceback (most recent call last):\n" + format_frames(frames))
        parts.append(header + "\n")
    return "".join(parts)


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, with a hint for the common out-of-memory kill."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGKILL:
        name += " (killed from outside, often by the out-of-memory killer)"
    return name


_THREAD_RE = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
_FRAME_RE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str, marker: str) -> list[Frame]:
    """The stack of the thread whose frames include ``marker`` (a function name).

    faulthandler prints most recent call first; we return outermost first, like
    tracebacks, with the source line left blank for :func:`fill_line`.
    """
    blocks: list[list[Frame]] = []
    for raw in text.splitlines():
        if _THREAD_RE.match(raw):
            blocks.append([])
            continue
        m = _FRAME_RE.match(raw)
        if m and blocks:
            blocks[-1].append((m.group(1), int(m.group(2)), m.group(3), ""))
    for frames in reversed(blocks):  # the latest dump wins
        if any(name == marker for _, _, name, _ in frames):
            return list(reversed(frames))
    return []


def stack_from_frames(rank: int, frames: list[Frame]) -> RankStack:
    """Find the blocking call and the user's own line in a main-thread stack."""
    user_idx = None
    for i, (fname, _, _, _) in enumerate(frames):
        if not is_library(fname):
            user_idx = i
    call = None
    start = (user_idx + 1) if user_idx is not None else 0
    for fname, _, name, _ in frames[start:]:
        # The first public torch function below the user's line is what they called
        # (c10d wraps collectives in a decorator named "wrapper": skip such plumbing).
        if _is_torch(fname) and name not in _PLUMBING and not name.startswith("_"):
            call = name
            break
    if call is None and user_idx is not None and user_idx + 1 < len(frames):
        nxt = frames[user_idx + 1][2]
        call = None if nxt.startswith("_") else nxt
    where = source = None
    if user_idx is not None:
        fname, lineno, _, line = frames[user_idx]
        where = describe_location(fname, lineno)
        source = fill_line(fname, lineno, line)
    return RankStack(
        rank=rank,
        state="blocked",
        call=call,
        where=where,
        source=source or "",
        frames=tuple(frames),
    )
