"""One channel from code running on a rank to the notebook, while the rank runs.

The launcher connects it in each rank it starts; the ledger (and any user code)
publishes through it without knowing who listens. Outside a launcher rank (a
plain script, torchrun) nothing is connected and :func:`publish` does nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["connect", "publish"]

_SINK: Callable[[Any], None] | None = None


def connect(sink: Callable[[Any], None] | None) -> None:
    """Send every published item to ``sink`` (None disconnects). Called by the launcher."""
    global _SINK
    _SINK = sink


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
