"""Where a resume check's part stops: the state taken there, and the run going on past it.

The resumed part loads the state taken at the stop, while the loader was asked for
its state again :data:`LATER` step(s) later. A position kept outside ``state_dict()``
(a file, a global of the rank's process, which warm ranks keep) then holds the later
one, and the resumed run leaves the straight one, as a restart from an older
checkpoint would show.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["LATER", "Stop"]

#: Steps a run goes on past its stop before the state is asked for again.
LATER = 1


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

    def finish(self, loader: Any, out: Any) -> Any:
        """Ask for the state again, then return ``out`` as it was at the stop."""
        loader.state_dict()  # where a position kept elsewhere moves on to the later step
        del out.records[self.kept :]
        kept = {(r.epoch, r.step) for r in out.records}
        out.fields = {k: v for k, v in out.fields.items() if k in kept}
        out.contents = {k: v for k, v in out.contents.items() if k in kept}
        out.state = self.state
        return out
