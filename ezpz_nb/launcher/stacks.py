"""Where a blocked rank was: both ends of a stack dump, and the call it was in.

The whole path of a hang, and where each deadline lives:

1. The run's deadline is ``Cluster.timeout`` (seconds), watched by
   :func:`ezpz_nb.launcher.run.collect` on a clock that leaves out the time the ranks
   were kept waiting for a CPU (:mod:`.runclock`: a busy machine is not a hang); ranks
   that have not answered by then are *pending*, and
   :func:`ezpz_nb.launcher.policy.decide` calls that a hang. (gloo's
   own collective timeout, ``timeout + 60`` s, is fixed when the ranks start: it
   only ends a rank the notebook no longer watches.)
2. Rank side: :func:`register_dump`, called once by ``rank.main``, makes SIGUSR1
   write every thread's Python stack into the rank's dump file (faulthandler works
   while the rank is blocked inside a C++ collective).
3. Notebook side: :func:`ask_stacks` sends SIGUSR1 to each pending rank and reads
   the dumps back within :data:`ASK_S` seconds (its own deadline); this module
   then finds the learner's own line and the torch call below it
   (:func:`stack_from_frames`), which ``HangError`` words.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Literal

from ezpz_nb.launcher.failures import describe_location, fill_line, is_library, is_ours
from ezpz_nb.launcher.wire import Frame

__all__ = [
    "ASK_S",
    "RankStack",
    "StackState",
    "ask_stacks",
    "parse_faulthandler",
    "register_dump",
    "stack_from_frames",
]

#: How long the notebook waits for the blocked ranks' dumps, all together.
ASK_S = 2.0
#: The rank loop's function: the main thread's stack is the one that holds it, and a
#: rank whose deepest frame of ours is this one waits for the next job.
RANK_LOOP = "_serve_forever"

#: ``"blocked"`` (inside a call), ``"finished"`` (returned already) or ``"unknown"``
#: (no stack could be read).
StackState = Literal["blocked", "finished", "unknown"]


@dataclass(frozen=True)
class RankStack:
    """Where one rank was when a run timed out or was interrupted.

    Attributes:
        rank: Global rank.
        state: See :data:`StackState`.
        call: The torch.distributed (or other library) function it was blocked in.
        where: ``"line 9 of the cell"``-style location of the user's own line.
        source: That line's source text.
        frames: The rank's main-thread stack, outermost first.
    """

    rank: int
    state: StackState
    call: str | None = None
    where: str | None = None
    source: str = ""
    frames: tuple[Frame, ...] = field(default_factory=tuple)

    @property
    def in_collective(self) -> bool:
        """Blocked inside torch.distributed (a collective, a barrier, a send or receive)."""
        return self.state == "blocked" and any(
            "/torch/distributed/" in f.filename.replace("\\", "/") for f in self.frames
        )

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


_THREAD_RE = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)")
_FRAME_RE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_PLUMBING = {"wrapper", "inner", "_fn", "fn", "decorate_context"}
_CALLED = re.compile(r"(\w+)\s*\(")


def parse_faulthandler(text: str, marker: str) -> list[Frame]:
    """The stack of the thread whose frames include ``marker`` (a function name).

    faulthandler prints most recent call first; we return outermost first, like
    tracebacks, with the source line left blank for :func:`fill_line`. Where that
    thread waits in library code only below ``marker`` (a checker that runs the
    learner's function in a thread of its own, as notebook 15's confined saves do), the
    frames of the same dump's thread that runs code of the learner's follow its own.
    """
    dumps: list[list[list[Frame]]] = []  # each SIGUSR1 prints every thread once
    seen: set[str] = set()
    for raw in text.splitlines():
        head = _THREAD_RE.match(raw)
        if head:
            ident = head.group(1)
            if not dumps or ident in seen:
                dumps.append([])
                seen = set()
            seen.add(ident)
            dumps[-1].append([])
            continue
        m = _FRAME_RE.match(raw)
        if m and dumps:
            dumps[-1][-1].append(Frame(m.group(1), int(m.group(2)), m.group(3), ""))
    for dump in reversed(dumps):  # the latest dump wins
        for block in dump:
            if any(f.name == marker for f in block):
                return _with_learner_thread(list(reversed(block)), dump, marker)
    return []


def _with_learner_thread(main: list[Frame], dump: list[list[Frame]], marker: str) -> list[Frame]:
    """``main``, or ``main`` followed by the thread of ``dump`` that runs the learner's code
    when ``main`` itself waits in library code only below ``marker``."""
    loop = max(i for i, f in enumerate(main) if f.name == marker)
    if any(not is_library(f.filename) for f in main[loop + 1 :]):
        return main
    for block in dump:
        if any(not is_library(f.filename) for f in block) and not any(
            f.name == marker for f in block
        ):
            return main + list(reversed(block))
    return main


def _is_torch(filename: str) -> bool:
    return "/torch/" in filename.replace("\\", "/")


def _idle(frames: list[Frame]) -> bool:
    """No user frame, and the rank loop's own call is the deepest of ours."""
    if any(not is_library(f.filename) for f in frames):
        return False
    ours = [f.name for f in frames if is_ours(f.filename)]
    return bool(ours) and ours[-1] == RANK_LOOP


def stack_from_frames(rank: int, frames: list[Frame]) -> RankStack:
    """Find the blocking call and the user's own line in a main-thread stack."""
    frames = [Frame(*f) for f in frames]
    if _idle(frames):
        # Back in the rank loop, waiting for the next job: it finished its function
        # (its reply was sent but not yet read when the run was interrupted).
        return RankStack(rank, "finished", frames=tuple(frames))
    # Only frames below the rank loop are the run's: those above it are the launching
    # process's own calls, inherited through fork (a notebook cell calling a checker),
    # never where this rank is working.
    loop = max((i for i, f in enumerate(frames) if f.name == RANK_LOOP), default=-1)
    user_idx = None
    for i, f in enumerate(frames):
        if i > loop and not is_library(f.filename):
            user_idx = i
    call = None
    start = (user_idx + 1) if user_idx is not None else 0
    for f in frames[start:]:
        # The first public torch function below the user's line is what they called
        # (c10d wraps collectives in a decorator named "wrapper": skip such plumbing).
        if _is_torch(f.filename) and f.name not in _PLUMBING and not f.name.startswith("_"):
            call = f.name
            break
    if call is None and user_idx is not None and user_idx + 1 < len(frames):
        nxt = frames[user_idx + 1].name
        call = None if nxt.startswith("_") or nxt in _PLUMBING else nxt
    where = source = None
    if user_idx is not None:
        f = frames[user_idx]
        where = describe_location(f.filename, f.lineno)
        source = fill_line(f.filename, f.lineno, f.line)
        if call is None and source:
            # Caught inside torch's decorator, before the call itself (a stack taken
            # just as the rank got there): the user's line names what it called.
            named = _CALLED.search(source)
            call = named.group(1) if named else None
    return RankStack(
        rank=rank,
        state="blocked",
        call=call,
        where=where,
        source=source or "",
        frames=tuple(frames),
    )


def register_dump(path: str) -> None:
    """Rank side: on SIGUSR1, write every thread's stack to ``path`` (kept open for life)."""
    dump = open(path, "w")  # no with: faulthandler writes to it later
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)


def ask_stacks(
    pids: dict[int, int], dump_paths: dict[int, str], blocked: set[int]
) -> dict[int, RankStack]:
    """Notebook side: where each rank is, asking the ``blocked`` ones for their stack.

    Args:
        pids: Each rank's process id.
        dump_paths: Each rank's dump file (the ``path`` its :func:`register_dump` got).
        blocked: The ranks that did not answer; the others finished.
    """
    for r in blocked:
        try:
            os.kill(pids[r], signal.SIGUSR1)
        except ProcessLookupError:
            pass
    stacks: dict[int, RankStack] = {}
    deadline = time.monotonic() + ASK_S
    for r in sorted(pids):
        if r not in blocked:
            stacks[r] = RankStack(r, "finished")
            continue
        frames: list = []
        while not frames and time.monotonic() < deadline:
            time.sleep(0.02)
            try:
                with open(dump_paths[r]) as fh:
                    frames = parse_faulthandler(fh.read(), RANK_LOOP)
            except OSError:
                pass
        stacks[r] = stack_from_frames(r, frames) if frames else RankStack(r, "unknown")
    return stacks
