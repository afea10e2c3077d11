"""Both ends of a rank failure: encoded on the rank, decoded and rendered in the notebook.

A rank sends plain data (frames and header lines, :class:`~.wire.Error`), never the
exception object, so a failure always reaches the notebook even when the exception
itself cannot be pickled. The notebook turns it into a :class:`RankFailure` that
keeps those frames: the wording of :class:`~.errors.RankError`, IPython's view of it,
and the workshop's checkers all read the same frames, none parses text back.

Source lines of notebook cells are filled in from the notebook's ``linecache``:
cell code is only known to the kernel, not to ranks forked from a clean forkserver.
"""

from __future__ import annotations

import difflib
import linecache
import os
import re
import signal
import sysconfig
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

from ezpz_nb.launcher.kernel import ipython_cell_name
from ezpz_nb.launcher.wire import Chain, Error, Frame, Link, Unpicklable

__all__ = [
    "FailureKind",
    "RankFailure",
    "cannot_travel",
    "decode",
    "encode",
    "from_exit",
    "stopped",
]

#: What happened to a rank: it raised, was killed by a signal, exited without
#: replying, returned something that cannot travel, or was stopped by us because
#: another rank failed while it was still running.
FailureKind = Literal["exception", "signal", "exit", "unpicklable", "stopped"]


@dataclass(frozen=True)
class RankFailure:
    """What went wrong on one rank.

    Attributes:
        rank: Global rank.
        kind: See :data:`FailureKind`.
        exc_type: Qualified name of the exception type (``""`` when not an exception).
        message: One-line description.
        chain: The exception and its causes, oldest first, with their frames.
        ours: Set when the failure is ezpz_nb's own (before the learner's function
            ran): what to make of it. Our frames are shown only then.
        signal: Signal number when the rank was killed by one.
    """

    rank: int
    kind: FailureKind
    exc_type: str
    message: str
    chain: Chain = ()
    ours: str = ""
    signal: int | None = None

    @property
    def traceback(self) -> str:
        """The rank's traceback as Python prints it, cell source lines filled in."""
        if not self.chain:
            return ""
        return _format_chain(self.chain) + (f"\n{self.ours}\n" if self.ours else "")

    @property
    def frames(self) -> tuple[Frame, ...]:
        """Frames of the exception that ended the run (the last of the chain)."""
        return self.chain[-1].frames if self.chain else ()

    def user_frames(self) -> list[Frame]:
        """The learner's own frames (not torch, stdlib or ezpz_nb), the chain's last last."""
        return [f for lk in self.chain for f in lk.frames if not is_library(f.filename)]


# ---------------------------------------------------------------- on the rank

_RANK_FILE = os.path.join(os.path.dirname(os.path.realpath(__file__)), "rank.py")
_CAUSE = "The above exception was the direct cause of the following exception:"
_CONTEXT = "During handling of the above exception, another exception occurred:"
#: Said with a failure outside the user's function (loading the job, rejoining the group).
OUR_FAULT = (
    "ezpz_nb failed on this rank before your function ran (while loading the job "
    "or preparing the process group): a bug in ezpz_nb, or an object in the job "
    "that cannot be rebuilt on the ranks. The traceback shows where."
)


def encode(exc: BaseException, ours: bool = False, loop: Iterable[str] = ()) -> Error:
    """The message a rank sends for ``exc`` (runs on the rank).

    The rank loop's own frames are left out (they are the same in every
    traceback), unless ``ours``: the failure is in the rank's own plumbing, and
    they are then the only frames there are. ``loop`` names the files of another
    rank loop (a Slurm rank's, under torchrun) whose frames are left out alike.
    """
    skip = {_RANK_FILE, *(os.path.realpath(f) for f in loop)}
    links: list[Link] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        frames = tuple(
            Frame(f.filename, f.lineno or 0, f.name, f.line or "")
            for f in traceback.extract_tb(cur.__traceback__)
            if ours or os.path.realpath(f.filename) not in skip
        )
        header = "".join(traceback.format_exception_only(type(cur), cur)).rstrip()
        header = name_groups(header, cur.__traceback__) + did_you_mean(cur)
        if cur.__cause__ is not None:
            link, nxt = _CAUSE, cur.__cause__
        elif cur.__context__ is not None and not cur.__suppress_context__:
            link, nxt = _CONTEXT, cur.__context__
        else:
            link, nxt = "", None
        links.append(Link(frames, header, link))
        cur = nxt
    return Error(tuple(reversed(links)), OUR_FAULT if ours else "")


def did_you_mean(exc: BaseException) -> str:
    """``. Did you mean: 'rank'?`` for a NameError, as Python's own traceback ends it.

    Python adds it when it prints a traceback (3.11 in the interpreter's printer, 3.12 and
    later in ``TracebackException`` given the traceback); ``format_exception_only``, which
    has no traceback, never does, so a header sent as text would lose it. Names are looked
    up in the failing frame, as Python does; difflib's ratio stands in for its edit distance.
    """
    name, tb = getattr(exc, "name", None), exc.__traceback__
    if not isinstance(exc, NameError) or not name or tb is None or "Did you mean" in str(exc):
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    names = {*frame.f_locals, *frame.f_globals, *frame.f_builtins}
    match = difflib.get_close_matches(name, names, n=1)
    return f". Did you mean: '{match[0]}'?" if match else ""


#: torch words a group in its errors by the object's default repr ("Global rank 0 is not
#: part of group <torch._C._distributed_c10d.ProcessGroup object at 0x7f...>").
_GROUP_REPR = re.compile(r"<torch\.[\w.]*ProcessGroup object at (0x[0-9a-f]+)>")


def name_groups(text: str, tb: TracebackType | None) -> str:
    """``text`` with process groups named by their global ranks, ``ProcessGroup(ranks=[2, 3])``.

    The groups are found by address among the failing frames' variables (runs on the
    rank, while they are alive); one not found reads ``ProcessGroup(ranks unknown)``.
    """
    if "ProcessGroup object at" not in text:
        return text
    groups: dict[str, Any] = {}
    for frame, _ in traceback.walk_tb(tb):
        for value in frame.f_locals.values():
            if type(value).__name__ == "ProcessGroup":
                groups[hex(id(value))] = value

    def named(match: re.Match[str]) -> str:
        group = groups.get(match.group(1))
        try:
            import torch.distributed as dist

            return f"ProcessGroup(ranks={dist.get_process_group_ranks(group)})"
        except Exception:  # noqa: BLE001 - not found, or already destroyed: say less
            return "ProcessGroup(ranks unknown)"

    return _GROUP_REPR.sub(named, text)


# ---------------------------------------------------------------- in the notebook


def decode(rank: int, msg: Error | Unpicklable) -> RankFailure:
    """The :class:`RankFailure` a rank's failure message describes."""
    if isinstance(msg, Unpicklable):
        return RankFailure(
            rank,
            "unpicklable",
            "PicklingError",
            cannot_travel(f"its {msg.what}", msg.why),
        )
    chain = tuple(Link(tuple(Frame(*f) for f in lk.frames), lk.header, lk.link) for lk in msg.chain)
    header = chain[-1].header if chain else "unknown error"
    where = " (inside ezpz_nb, before your function ran)" if msg.ours else ""
    # The type is the header's first line up to its colon: an exception with no message
    # but a note (add_note) has the note on the next line, with no colon before it.
    kind = header.split("\n", 1)[0].split(":")[0]
    return RankFailure(rank, "exception", kind, header + where, chain, msg.ours)


def cannot_travel(what: str, why: str) -> str:
    """The one wording for a value a rank cannot send back (``ez.launch`` and ``ez.submit``)."""
    return (
        f"{what} could not be sent back to the notebook ({why}); return plain data "
        "(numbers, lists, dicts, tensors) instead"
    )


def from_exit(rank: int, exitcode: int | None) -> RankFailure:
    """A rank that died without replying, from its exit code."""
    if exitcode is not None and exitcode < 0:
        return RankFailure(
            rank, "signal", "", f"killed by {signal_name(-exitcode)}", signal=-exitcode
        )
    return RankFailure(
        rank,
        "exit",
        "",
        f"exited with code {exitcode} without replying (os._exit or sys.exit in a worker thread?)",
    )


def stopped(rank: int) -> RankFailure:
    """A rank we stopped because another one failed while it still ran."""
    return RankFailure(rank, "stopped", "", "stopped while still running")


def signal_name(signum: int) -> str:
    """``SIGKILL`` for 9, with a hint for the common out-of-memory kill."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if signum == signal.SIGKILL:
        name += " (killed from outside, often by the out-of-memory killer)"
    return name


# ---------------------------------------------------------------- whose frame is it

_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
_PKG = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # ezpz_nb/
_EXAMPLES = os.path.join(_PKG, "examples")
_CELL_RE = re.compile(
    r"(ipykernel_\d+[/\\]\d+\.py$)|(<ipython-input-)|(<ranks-cell-\d+( In\[\d+\])?>)"
)


def is_cell(filename: str) -> bool:
    """Whether a frame's file is a notebook cell (or a ``%%ranks`` cell)."""
    return bool(_CELL_RE.search(filename))


def is_ours(filename: str) -> bool:
    """Frames of ezpz_nb's own plumbing (its examples are learners' code)."""
    path = os.path.realpath(filename)
    return path.startswith(_PKG + os.sep) and not path.startswith(_EXAMPLES)


def is_library(filename: str) -> bool:
    """Frames that belong to torch, the stdlib or our plumbing rather than to the user."""
    if filename.startswith("<") and not is_cell(filename):
        return True
    path = os.path.realpath(filename)
    if path.startswith(_EXAMPLES):
        return False
    return (
        f"{os.sep}torch{os.sep}" in path
        or path.startswith(_STDLIB)
        or is_ours(filename)
        or "site-packages" in path
    )


def cell_line(filename: str, lineno: int) -> tuple[int | None, int] | None:
    """``(In[] number or None, line in the cell)`` for a cell's frame, else None."""
    if not is_cell(filename):
        return None
    named = ipython_cell_name(filename)
    return (named[0], lineno + named[1]) if named else (None, lineno)


def describe_location(filename: str, lineno: int) -> str:
    """``line 9 of cell In[4]`` for notebook cells, ``file.py:9`` otherwise."""
    cell = cell_line(filename, lineno)
    if cell is not None:
        count, line = cell
        return f"line {line} of cell In[{count}]" if count else f"line {line} of the cell"
    return f"{os.path.basename(filename)}:{lineno}"


def fill_line(filename: str, lineno: int, line: str) -> str:
    """The source line, looked up in the notebook's linecache when the rank lacked it."""
    if line:
        return line.strip()
    return linecache.getline(filename, lineno).strip()


def frame_title(frame: Frame) -> str:
    """``Cell In[12], line 6, in f`` as IPython names cells, ``File "x.py", line 6, in f``."""
    cell = cell_line(frame.filename, frame.lineno)
    if cell is not None and cell[0] is not None:
        # As IPython: a cell's own top level is not named "<module>".
        inside = "" if frame.name == "<module>" else f", in {frame.name}"
        return f"Cell In[{cell[0]}], line {cell[1]}{inside}"
    return f'File "{frame.filename}", line {frame.lineno}, in {frame.name}'


def format_frames(frames: Iterable[Frame]) -> str:
    """Render frames like the standard traceback module does (cells as IPython names them)."""
    out = []
    for f in frames:
        out.append(f"  {frame_title(f)}\n")
        text = fill_line(f.filename, f.lineno, f.line)
        if text:
            out.append(f"    {text}\n")
    return "".join(out)


def _format_chain(chain: Chain, keep_ours: bool = True) -> str:
    parts = []
    for lk in chain:
        if lk.link:
            parts.append(f"\n{lk.link}\n\n")
        frames = [f for f in lk.frames if keep_ours or not is_ours(f.filename)]
        if frames:
            parts.append("Traceback (most recent call last):\n" + format_frames(frames))
        parts.append(lk.header + "\n")
    return "".join(parts)


def format_for_learner(failure: RankFailure) -> str:
    """The rank's traceback without ezpz_nb's frames, unless the failure is ours."""
    return _format_chain(failure.chain, keep_ours=bool(failure.ours))
