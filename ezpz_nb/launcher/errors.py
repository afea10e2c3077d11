"""Exceptions raised in the notebook when ranks fail, hang or are interrupted: types and wording.

What a failure *is* (its frames, where it came from) lives in :mod:`.failures`, where
a hung rank was in :mod:`.stacks`; here is how they are told. Each error has two
faces: ``str(err)``, complete and plain, for a script or a log; and, in IPython,
``_render_traceback_`` (IPython shows what it returns instead of the usual
traceback), which leads with the learner's own line that raised, names cells as
IPython does, says each rank once, folds ranks that failed the same way, and ends
with the line that launched.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from types import TracebackType

from ezpz_nb.errors import EzpzError
from ezpz_nb.launcher.failures import (
    RankFailure,
    cell_line,
    fill_line,
    format_for_learner,
    frame_title,
    is_library,
    is_ours,
)
from ezpz_nb.launcher.stacks import RankStack
from ezpz_nb.launcher.wire import Frame, RankEvent
from ezpz_nb.wrapping import wrap_message

__all__ = [
    "EzpzError",
    "HangError",
    "LaunchTypeError",
    "LaunchValueError",
    "RankError",
    "RankFailure",
    "RankStack",
    "RunInterrupted",
    "WorldSizeError",
]


def ranks_text(ranks: list[int]) -> str:
    """``rank 1``, ``ranks 0-3``, ``ranks 0, 2 and 5``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _same(f: RankFailure) -> tuple:
    """What two failures must share to be told as one."""
    frames = tuple((lk.header, lk.link, tuple(fr[:3] for fr in lk.frames)) for lk in f.chain)
    return (f.kind, f.message, f.signal, frames)


def fold(failures: dict[int, RankFailure]) -> list[tuple[list[int], RankFailure]]:
    """Failures that are the same on several ranks, told once: ``[(ranks, failure)]``."""
    groups: dict[tuple, tuple[list[int], RankFailure]] = {}
    for r, f in sorted(failures.items()):
        if f.kind != "stopped":
            groups.setdefault(_same(f), ([], f))[0].append(r)
    return list(groups.values())


_VERB = {"exception": " failed: ", "signal": " was ", "exit": " ", "unpicklable": ": "}


def _headline(ranks: list[int], f: RankFailure) -> str:
    same = " (the same on each)" if len(ranks) > 1 else ""
    return f"{ranks_text(ranks)}{_VERB.get(f.kind, ': ')}{f.message}{same}"


class RankError(EzpzError, RuntimeError):
    """One or more ranks failed; the other ranks were stopped or finished.

    Attributes:
        failures: ``{rank: RankFailure}`` for every rank that failed or was stopped.
        events: Items the ranks published before the failure, in arrival order.
        note: What became of the ranks (kept, or started afresh next run).
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

    def _summary(self, detail: Callable[[RankFailure], list[str]] = lambda f: []) -> list[str]:
        """Each failure's headline (with ``detail``'s lines under it), who was stopped, the note."""
        lines = [
            line for ranks, f in fold(self.failures) for line in [_headline(ranks, f), *detail(f)]
        ] or ["a rank failed"]
        stopped = [f.rank for f in self.failures.values() if f.kind == "stopped"]
        if stopped:
            were = "was" if len(stopped) == 1 else "were"
            lines.append(
                f"{ranks_text(stopped)} {were} still running (probably waiting in a collective "
                "for the failed rank) and stopped."
            )
        if self.note:
            lines.append(self.note)
        return lines

    def _render(self) -> str:
        lines = self._summary()
        for ranks, f in fold(self.failures):
            if f.traceback:
                lines.append(f"\n--- {ranks_text(ranks)} traceback ---\n{f.traceback.rstrip()}")
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        """What IPython shows: each failure with the learner's line that raised it, its
        traceback, and last the cell line that launched.

        Each rank is named once, in its failure's headline: a traceback is labelled with
        its ranks only when there are several different failures to tell apart.
        """
        groups = fold(self.failures)
        summary = self._summary(_failing_line)
        out = wrap_message(f"{type(self).__name__}: " + "\n".join(summary)).split("\n")
        for ranks, f in groups:
            text = format_for_learner(f).rstrip()
            if text and not _only_the_line(f):
                on = f"Traceback on {ranks_text(ranks)}" if len(groups) > 1 else "Traceback"
                out += ["", text.replace("Traceback (most recent", f"{on} (most recent")]
                if f.ours:
                    out.append(f.ours)
        launched = _launched_from(self.__traceback__)
        if launched:
            out += ["", "Launched from:", *launched[1:]]
        return out


def _failing_line(f: RankFailure) -> list[str]:
    """The learner's line where ``f`` was raised, as IPython marks a line: title, arrow.

    Indented under the failure's headline, which names the ranks.
    """
    own = f.user_frames()
    if f.ours or not own:
        return []
    frame = own[-1]
    src = fill_line(frame.filename, frame.lineno, frame.line)
    cell = cell_line(frame.filename, frame.lineno)
    n = cell[1] if cell is not None else frame.lineno
    return [f"  at {frame_title(frame)}"] + ([f"  ----> {n} {src}"] if src else [])


def _only_the_line(f: RankFailure) -> bool:
    """True when ``f``'s traceback would repeat its failing line and nothing else."""
    if f.ours or len(f.chain) != 1:
        return False
    shown = [fr for fr in f.chain[0].frames if not is_ours(fr.filename)]
    return shown == f.user_frames()[-1:]


def _launched_from(tb: TracebackType | None) -> list[str]:
    """The learner's own lines that led to the error (the cell line that launched)."""
    out = []
    for fs in traceback.extract_tb(tb):
        # %%ranks cells show as IPython's `get_ipython().run_cell_magic(...)`: not theirs.
        if is_library(fs.filename) or (fs.line or "").startswith("get_ipython()."):
            continue
        frame = Frame(fs.filename, fs.lineno or 0, fs.name, fs.line or "")
        src = fill_line(frame.filename, frame.lineno, frame.line)
        out += ["", frame_title(frame)] + ([f"----> {frame.lineno} {src}"] if src else [])
    return out


class _ShownPlain:
    """In IPython: the message, then the learner's lines that led to it; none of ours.

    For errors whose message says everything: the frames of ezpz_nb that raised
    them would only push the learner's own line down the screen.
    """

    __traceback__: TracebackType | None

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}", *_launched_from(self.__traceback__)]


class LaunchTypeError(_ShownPlain, EzpzError, TypeError):
    """A launch argument of the wrong type (or one that cannot travel); nothing started."""


class LaunchValueError(_ShownPlain, EzpzError, ValueError):
    """A launch argument with a wrong value; nothing started."""


class WorldSizeError(LaunchValueError):
    """A job needs another number of ranks than the cluster (or torchrun) has; nothing ran.

    Attributes:
        needed: The ranks the job needs.
        got: The ranks there are.
    """

    def __init__(self, message: str, *, needed: int, got: int):
        super().__init__(message)
        self.needed = needed
        self.got = got


def _where_lines(stacks: dict[int, RankStack]) -> list[str]:
    return ["  " + s.describe() for s in stacks.values()]


class HangError(_ShownPlain, EzpzError, TimeoutError):
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
        lines += _where_lines(self.stacks)
        lines.append(
            "All ranks were stopped. Make every rank make the same collective calls "
            "in the same order (or raise `timeout=` if the work is just slow)."
        )
        super().__init__(wrap_message("\n".join(lines)))


class RunInterrupted(_ShownPlain, EzpzError, KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, Jupyter's stop button); every rank was stopped.

    Still a ``KeyboardInterrupt``, so whatever stops on an interrupt still stops.

    Attributes:
        stacks: ``{rank: RankStack}`` saying where each rank was.
        events: Items the ranks published before the interrupt, in arrival order.
    """

    def __init__(self, stacks: dict[int, RankStack], events: list[RankEvent] | None = None):
        self.stacks = dict(sorted(stacks.items()))
        self.events = list(events or [])
        lines = ["interrupted while the ranks ran. Where each rank was:"]
        lines += _where_lines(self.stacks)
        last = "All ranks were stopped; the next run starts fresh ranks."
        if any(s.in_collective for s in self.stacks.values()):
            # Said only where a stack shows it: a rank busy in its own code waits for nobody.
            last += " A rank blocked in a collective is waiting for a call another rank never made."
        lines.append(last)
        super().__init__(wrap_message("\n".join(lines)))
