"""A crash injected into a recorded rank at one step, once per job: what a checker restarts.

Notebook 14's checker (:func:`ezpz_nb.agents.by_hand.check_worker`) must see the learner's
worker survive a rank that dies mid-job, without relying on the worker's own ``--kill``
option (a worker that ignores it would never be restarted), and must see that the restart
resumes from what the worker saved, not from where the checker made it die. The recorder
(:func:`ezpz_nb.ledger.record`) calls :func:`at_step` after writing each step to the ledger
file, as the step is handed to the training loop, and the plan (:func:`fail_once`) says:

* ``keep``: at this step every rank waits for the others, and a copy of the job's output
  folder (its checkpoint, whatever the worker's format) is taken: the position saved then;
* ``crash``: the chosen rank waits until every other rank is there too, puts the output
  folder back as the copy had it (ledger files aside: as if the later saves never reached
  the disk), then is killed with SIGKILL, as the out-of-memory killer would: nothing of the
  worker runs after it, so it cannot tell this crash from a real one; every other rank waits
  there, as ranks blocked in a collective with a dead peer do, until its agent stops it
  (torchrun's restart), so no rank saves a position past the crash.

A restart that resumes from the position it reads in its checkpoint resumes from ``keep``;
one that works the position out from the crash (or from the ledgers) does not. The plan is
kept from the worker's code: it travels in :data:`ENV`, which a ``sitecustomize`` module
(:func:`fail_once` writes it and puts it on ``PYTHONPATH``) takes out of every rank's
``os.environ`` when the interpreter starts, before the worker's first line runs.

It happens once per job, whatever attempt number the worker believes: the dying rank leaves
a file in the plan's folder, and ranks started after that file go on.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ENV", "WAIT_S", "at_step", "crashed", "fail_once", "restored"]

#: The plan (JSON): the rank that dies and where (the recorder's epoch label and its count of
#: steps in that pass), the step where the kept copy is taken, the ranks, the job's output
#: folder and the folder of the marks.
ENV = "EZPZ_NB_FAIL_ONCE"

#: How long a rank waits for the others or for its agent; then it goes on (a copy or a
#: restore that not every rank reached is skipped) or dies (an agent that never restarts
#: it must not leave it waiting forever).
WAIT_S = 60.0

# The module the sitecustomize below leaves the plan in: not os.environ, which the worker reads.
_HELD = "_ezpz_nb_fail_once"

# Runs in every process started with the plan's PYTHONPATH. torchrun's agent keeps the
# variable (its ranks inherit it); a rank (RANK set by the agent) takes it out at once.
_SITE = f"""\
import os, sys, types
if "RANK" in os.environ and {ENV!r} in os.environ:
    held = types.ModuleType({_HELD!r})
    held.plan = os.environ.pop({ENV!r})
    sys.modules[held.__name__] = held
"""

# When this process imported the recorder: before any rank of its attempt took a step.
_STARTED = time.time()
_POLL_S = 0.02


def fail_once(
    rank: int,
    epoch: int,
    step: int,
    folder: str | Path,
    *,
    keep: tuple[int, int] | None = None,
    out: str | Path | None = None,
    world: int = 1,
) -> dict[str, str]:
    """The environment that makes ``rank`` die at ``(epoch, step)``, once per job.

    Args:
        rank, epoch, step: Who dies, and at which step of which epoch label.
        folder: An empty folder of the checker's (marks, the kept copy, the sitecustomize).
        keep: ``(epoch, step)`` before the crash where every rank waits while ``out`` is
            copied; the copy is put back before the crash. None: nothing is put back.
        out: The job's output folder (``--out``): ledgers and the worker's checkpoint.
        world: Ranks in the job (the ones waited for).
    """
    folder = Path(folder)
    site = folder / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITE)
    plan = {"rank": rank, "epoch": epoch, "step": step, "folder": str(folder), "world": world}
    if keep is not None and out is not None:
        plan.update(keep=list(keep), out=str(out))
    paths = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {ENV: json.dumps(plan), "PYTHONPATH": os.pathsep.join(paths)}


def crashed(folder: str | Path) -> bool:
    """True when the rank of the plan with this ``folder`` died as planned."""
    return (Path(folder) / "died").exists()


def restored(folder: str | Path) -> bool:
    """True when the crash of the plan with this ``folder`` put the kept copy back."""
    return (Path(folder) / "restored").exists()


def _plan() -> dict[str, Any] | None:
    held = sys.modules.get(_HELD)
    text = getattr(held, "plan", None) or os.environ.get(ENV)
    return json.loads(text) if text else None


def at_step(rank: int, epoch: int, step: int) -> None:
    """Keep a copy, or die, or wait to be stopped, if the plan names this step."""
    plan = _plan()
    if not plan:
        return
    folder = Path(plan["folder"])
    mark = folder / "died"
    if mark.exists() and mark.stat().st_mtime < _STARTED:
        return  # started after the death: a restarted rank goes on
    if plan.get("keep") and (epoch, step) == tuple(plan["keep"]) and not mark.exists():
        _keep(plan, rank, folder)
    if (epoch, step) != (plan["epoch"], plan["step"]):
        return
    if rank == plan["rank"]:
        if mark.exists():
            return  # it died in an earlier attempt: this one goes on
        # Every other rank at this step is past its last save: the folder is still now. If
        # one never came, it could still save: nothing is put back (the checker then expects
        # the last position saved: restored() is False).
        everyone = _wait(lambda: len(list(folder.glob("at-crash-*"))) >= plan["world"] - 1)
        if everyone and plan.get("keep") and (folder / "kept").is_dir():
            _put_back(folder / "kept", Path(plan["out"]))
            (folder / "restored").touch()
        if not _claim(mark):
            return
        os.kill(os.getpid(), signal.SIGKILL)
        return  # not reached: SIGKILL ends the process
    # Every rank of the first attempt waits, even one that comes here after the death: one
    # that went on could finish the step with the ranks still alive, and save a position past it.
    (folder / f"at-crash-{rank}").touch()
    time.sleep(WAIT_S)
    os.kill(os.getpid(), signal.SIGKILL)


def _keep(plan: dict[str, Any], rank: int, folder: Path) -> None:
    """Wait for every rank at the kept step (each past the save before it, none at the next);
    the rank that dies later copies the output folder meanwhile.

    Whoever first creates ``keep.claim`` decides: the copying rank once every rank is there
    (it copies), or a rank that waited :data:`WAIT_S` in vain (there is no copy; it goes on,
    and the crash puts nothing back). So no copy is taken after a rank went on.
    """
    (folder / f"at-keep-{rank}").touch()
    done = folder / "kept.done"
    if rank != plan["rank"]:
        if not _wait(done.exists) and _claim(folder / "keep.claim"):
            return
        while not done.exists():  # the copy was claimed in time: it is being taken
            time.sleep(_POLL_S)
        return
    if _wait(lambda: len(list(folder.glob("at-keep-*"))) >= plan["world"]) and _claim(
        folder / "keep.claim"
    ):
        if Path(plan["out"]).is_dir():
            shutil.copytree(plan["out"], folder / "kept", ignore=_ledgers)
    done.touch()


def _claim(path: Path) -> bool:
    """Create ``path``; False if it exists (another process claimed it first)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _ledgers(where: str, names: list[str]) -> list[str]:
    """The recorder's files (``attempt*/*.jsonl``): they go on as they are, never put back."""
    return [n for n in names if n.endswith(".jsonl") and Path(where).name.startswith("attempt")]


def _put_back(kept: Path, out: Path) -> None:
    """Make ``out`` hold what ``kept`` holds, ledger files aside."""
    for path in sorted(out.rglob("*"), reverse=True):
        rel = path.relative_to(out)
        if path.is_file() and not _ledgers(str(path.parent), [path.name]):
            if not (kept / rel).is_file():
                path.unlink()  # saved after the copy: as if it never reached the disk
    shutil.copytree(kept, out, dirs_exist_ok=True)


def _wait(ready: Callable[[], bool]) -> bool:
    """Poll ``ready`` until it holds (True) or :data:`WAIT_S` passed (False)."""
    end = time.monotonic() + WAIT_S
    while not ready():
        if time.monotonic() > end:
            return False
        time.sleep(_POLL_S)
    return True
