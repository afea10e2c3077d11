"""One channel from code running on a rank to the notebook, while the rank runs.

The launcher connects it in each rank it starts; the ledger (and any user code)
publishes through it without knowing who listens. Outside a launcher rank (a
plain script, torchrun) nothing is connected and :func:`publish` does nothing.

Warnings of our own (:class:`~ezpz_nb.errors.EzpzWarning`) take the same channel:
on a rank, library code deep in a run issues them, and printed there they would
point at the library's line, once per rank. So a connected rank sends them as a
:class:`RelayedWarning` instead, and the notebook :func:`reissue` s each one once,
at the learner's line that launched the run, naming the ranks. Every other warning
(torch's, a third party's) is printed by the rank as before.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ezpz_nb.errors import EzpzWarning

__all__ = ["RelayedWarning", "connect", "publish", "reissue"]

_SINK: Callable[[Any], None] | None = None
# The process that connected: a DataLoader worker forked from a rank inherits the
# sink but must not write on the rank's pipe (it prints its warnings instead).
_SINK_PID = 0
# How this process showed warnings before :func:`connect` took ``warnings.showwarning``.
_SHOWN_BEFORE: Callable[..., None] = warnings.showwarning
# Frames in these folders are not the learner's: a relayed warning points past them.
_OURS = os.path.dirname(os.path.abspath(__file__)) + os.sep


@dataclass(frozen=True)
class RelayedWarning:
    """An :class:`~ezpz_nb.errors.EzpzWarning` a rank issued, on its way to the notebook."""

    category: type[Warning]
    text: str


def connect(sink: Callable[[Any], None] | None) -> None:
    """Send every published item to ``sink`` (None disconnects). Called by the launcher.

    While connected, this process's own warnings are relayed (see the module's doc).
    """
    global _SINK, _SINK_PID, _SHOWN_BEFORE
    _SINK, _SINK_PID = sink, os.getpid()
    if sink is not None and warnings.showwarning is not _relay_or_show:
        _SHOWN_BEFORE = warnings.showwarning
        warnings.showwarning = _relay_or_show


def _relay_or_show(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """``warnings.showwarning`` on a rank: relay our own warnings, show the rest.

    It runs after the rank's filters, so ``simplefilter("ignore")`` in a rank still
    silences a warning there.
    """
    if (
        file is None
        and issubclass(category, EzpzWarning)
        and _SINK is not None
        and _SINK_PID == os.getpid()
    ):
        try:
            publish(RelayedWarning(category, str(message)))
            return
        except Exception:  # noqa: BLE001 - an unpicklable subclass: printed here instead
            pass
    _SHOWN_BEFORE(message, category, filename, lineno, file, line)


def publish(item: Any) -> bool:
    """Send ``item`` to the notebook now, while the rank keeps running.

    The notebook collects published items in arrival order (``Cluster.events``,
    and ``.events`` on ``RankError`` / ``HangError``), so what a rank recorded
    before a failure or a hang is not lost.

    Returns:
        True when sent; False outside a launcher rank (plain script, torchrun),
        where it does nothing.
    """
    sink = _SINK
    if sink is None:
        return False
    sink(item)
    return True


def reissue(relayed: Iterable[tuple[int, RelayedWarning]]) -> None:
    """In the notebook: warn once per distinct warning (category and text), naming its ranks.

    Each is issued with :func:`warnings.warn` at the first frame outside ezpz_nb
    (and IPython): the learner's line that launched the run. So the notebook's own
    filters decide: ``simplefilter("ignore", ...)`` silences it, ``"error"`` raises
    it there.
    """
    ranks: dict[RelayedWarning, set[int]] = {}
    for rank, item in relayed:
        ranks.setdefault(item, set()).add(rank)
    level = _launching_level()
    for item, rs in ranks.items():
        who = f"rank {min(rs)}" if len(rs) == 1 else f"ranks {', '.join(map(str, sorted(rs)))}"
        sep = "" if item.text.startswith("\n") else " "
        warnings.warn(f"on {who}:{sep}{item.text}", item.category, stacklevel=level)


def _launching_level() -> int:
    """The ``stacklevel`` for :func:`reissue`'s warning: the first frame outside ezpz_nb."""
    skip = [_OURS]
    ipython = sys.modules.get("IPython")
    if ipython is not None and ipython.__file__:
        skip.append(os.path.dirname(os.path.abspath(ipython.__file__)) + os.sep)
    frame, level = sys._getframe(1), 1  # level 1: reissue itself
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(tuple(skip))
        or frame.f_code.co_filename.startswith("<decorator-gen")
    ):
        frame, level = frame.f_back, level + 1
    return level
