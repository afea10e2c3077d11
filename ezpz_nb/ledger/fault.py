"""A crash injected into a recorded rank at one step, once per job: what a checker restarts.

Notebook 14's checker (:func:`ezpz_nb.agents.by_hand.check_worker`) must see the learner's
worker survive a rank that dies mid-job, without relying on the worker's own ``--kill``
option (a worker that ignores it would never be restarted). It sets :data:`ENV` in the
ranks' environment; the recorder (:func:`ezpz_nb.ledger.record`) calls :func:`at_step` after
writing each step to the ledger file, as the step is handed to the training loop:

* the chosen rank is killed with SIGKILL, as the out-of-memory killer would: nothing of the
  worker runs after it, so it cannot tell this crash from a real one;
* every other rank waits there, as ranks blocked in a collective with a dead peer do, until
  its agent stops it (torchrun's restart), so no rank saves a position past the crash.

It happens once per job, whatever attempt number the worker believes: the dying rank leaves a
file in the folder the variable names, and ranks started after that file go on.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["ENV", "WAIT_S", "at_step", "fail_once"]

#: ``RANK:EPOCH:STEP:FOLDER``: the rank that dies, where (the recorder's epoch label and its
#: count of steps in that pass), and the folder of the marks.
ENV = "EZPZ_NB_FAIL_ONCE"

#: How long the other ranks wait for their agent to stop them; then they die too (an agent
#: that never restarts them must not leave them waiting forever).
WAIT_S = 60.0

# When this process imported the recorder: before any rank of its attempt took a step.
_STARTED = time.time()


def fail_once(rank: int, epoch: int, step: int, folder: str | Path) -> dict[str, str]:
    """The environment that makes ``rank`` die at ``(epoch, step)``, once per job."""
    return {ENV: f"{rank}:{epoch}:{step}:{folder}"}


def at_step(rank: int, epoch: int, step: int) -> None:
    """Die, or wait to be stopped, if :data:`ENV` names this step and no rank died yet."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    victim, at_epoch, at, folder = spec.split(":", 3)
    if (epoch, step) != (int(at_epoch), int(at)):
        return
    mark = Path(folder) / "died"
    if rank == int(victim):
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # it died in an earlier attempt: this one goes on
        os.kill(os.getpid(), signal.SIGKILL)
        return  # not reached: SIGKILL ends the process
    # A rank started after the death is a restarted one: it goes on. Every rank of the
    # first attempt waits, even one that comes here after the death: one that went on
    # could finish the step with the ranks still alive, and save a position past it.
    if mark.exists() and mark.stat().st_mtime < _STARTED:
        return
    time.sleep(WAIT_S)
    os.kill(os.getpid(), signal.SIGKILL)
