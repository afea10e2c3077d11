"""A rank's own state, in one object made where the rank process starts.

Everything a launcher rank keeps between runs lives in one :class:`RankRuntime`,
made by :func:`ezpz_nb.launcher.rank.main` and found with :func:`current`:

* ``namespace``: the globals shared by every function sent by value and every
  ``%%ranks`` cell, so what one run sets is there in the next;
* ``group``: how this rank joins (and rejoins) its default process group;
* ``send_event``: the channel ``ez.publish`` writes through (connected to
  :func:`ezpz_nb.events.connect`, which the ledger uses without knowing the launcher).

In the notebook, in a script or under torchrun there is no runtime: :func:`current`
is None there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ezpz_nb import events
from ezpz_nb.launcher.wire import new_namespace

__all__ = ["GroupSpec", "RankRuntime", "current"]


@dataclass
class GroupSpec:
    """How this rank joins its default process group (see :mod:`.rankgroup`)."""

    backend: str
    rank: int
    world_size: int
    timeout: timedelta
    #: The rendezvous store, kept for the rank's life: a destroyed group is remade on it.
    store: Any = None
    #: Groups made so far; each new one uses a fresh key prefix in the store.
    generation: int = 0
    #: Whether rank 0 already said that a pasted init_process_group was skipped.
    noted: bool = False


@dataclass
class RankRuntime:
    """The state one rank process keeps for its whole life."""

    group: GroupSpec
    namespace: dict[str, Any] = field(default_factory=new_namespace)
    send_event: Callable[[Any], None] | None = None

    def install(self) -> RankRuntime:
        """Make this the process's runtime and connect ``ez.publish`` to it."""
        global _CURRENT
        _CURRENT = self
        events.connect(self.send_event)
        return self


# The one per-process pointer: set once, in the rank's main.
_CURRENT: RankRuntime | None = None


def current() -> RankRuntime | None:
    """This rank's runtime, or None outside a launcher rank."""
    return _CURRENT
