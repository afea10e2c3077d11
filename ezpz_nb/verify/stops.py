"""Where a resume check's part stops: the state taken there, and the run going on past it.

A state asked for twice at the stop must be the same both times (:func:`state_difference`):
one that holds a fresh ticket each time carries no position of its own, and a resume from
it is not judged. The resumed part loads the state taken at the stop, while the loader was asked for
its state again :data:`LATER` step(s) later. A position kept outside ``state_dict()``
(a file, a global of the rank's process, which warm ranks keep) then holds the later
one, and the resumed run leaves the straight one, as a restart from an older
checkpoint would show.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["LATER", "Stop", "state_difference"]

#: Steps a run goes on past its stop before the state is asked for again.
LATER = 1


def state_difference(a: Any, b: Any, path: str = "state") -> str:
    """Where two states differ (``"state['ticket']"``), or "" when they hold the same values.

    Dicts by keys and values, sequences item by item, tensors and arrays by value, the
    rest by ``==``.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{path}'s keys"
        return next((d for k in a if (d := state_difference(a[k], b[k], f"{path}[{k!r}]"))), "")
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{path}'s length"
        return next((d for i, (x, y) in enumerate(zip(a, b, strict=True))
                     if (d := state_difference(x, y, f"{path}[{i}]"))), "")  # fmt: skip
    if hasattr(a, "shape") and hasattr(b, "shape"):
        import numpy as np

        x = a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)
        y = b.detach().cpu().numpy() if hasattr(b, "detach") else np.asarray(b)
        return "" if x.shape == y.shape and np.array_equal(x, y) else path
    try:
        return "" if bool(a == b) else path
    except Exception:  # noqa: BLE001 - values that cannot be compared: not evidence of a change
        return ""


class Stop:
    """The state taken at the stop; the records past it are dropped at :meth:`finish`.

    ``out`` is the rank's :class:`~ezpz_nb.verify.observe.Outcome` (not imported: observe
    imports this module).
    """

    def __init__(self) -> None:
        self.state: Any = None
        self.kept = -1  # records before the stop; -1: not reached yet
        self.later = 0  # steps taken since

    def take(self, loader: Any, out: Any) -> None:
        """Take the loader's state now, as a checkpoint holds it."""
        state = loader.state_dict()
        try:  # a copy: the steps that follow must not change it
            self.state = copy.deepcopy(state)
        except Exception:  # noqa: BLE001 - an object that cannot be copied: kept as it is
            self.state = state
        self.kept = len(out.records)
        # Asked again at the same position, a state that carries the position is the same;
        # a fresh ticket each time points to a position kept elsewhere (a file, the process).
        plain = getattr(loader, "plain_state_dict", None)  # a DCP token wraps the real state
        first, again = (
            (plain(), plain()) if plain is not None else (self.state, loader.state_dict())
        )
        moved = state_difference(first, again)
        if moved:
            out.state_note = moved

    def finish(self, loader: Any, out: Any) -> Any:
        """Ask for the state again, then return ``out`` as it was at the stop."""
        loader.state_dict()  # where a position kept elsewhere moves on to the later step
        del out.records[self.kept :]
        kept = {(r.epoch, r.step) for r in out.records}
        out.fields = {k: v for k, v in out.fields.items() if k in kept}
        out.contents = {k: v for k, v in out.contents.items() if k in kept}
        out.state = self.state
        return out
