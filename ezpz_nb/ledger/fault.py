"""A rank's side of a checker's injected crash: each step waits for the checker's go.

Notebook 14's checker (:func:`ezpz_nb.agents.by_hand.check_worker`) must see the learner's
worker survive a rank that dies mid-job, and see that the restart resumes from what the
worker saved, not from where the checker made it die. Which rank dies at which step, and
the earlier step whose saved position the restart must find in its checkpoint, is the
checker's plan (:class:`ezpz_nb.agents.crash_plan.CrashPlan`), and it stays in the
checker's process: a worker can read anything its own process holds (``os.environ``,
``/proc/self/environ``, its modules, the folders it can name), so nothing of the plan is
put there.

What a rank holds is :data:`ENV`: the address of the checker's Unix socket. The recorder
(:func:`ezpz_nb.ledger.record`) calls :func:`at_step` after writing each step to the ledger
file, as the step is handed to the training loop, and :func:`at_step` says "rank R reached
step s" to the checker and waits for its answer: go on (every step, the same answer), or
no answer at all (the crash: the checker kills a rank with SIGKILL from outside, and holds
the others until torchrun stops them). A rank started after the crash is told it is free
and stops asking. A step out of turn (skipped, or claimed ahead of the recorder) is refused:
the rank says so and stops.

A rank never waits forever: when the checker closes the connection (it stopped, or died)
or does not answer within :data:`RANK_WAIT_S`, the rank says so on stderr and kills itself,
as a rank held at the crash is killed: one that went on could save a position past it.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

__all__ = ["ENV", "FREE", "GO", "RANK_WAIT_S", "REFUSED", "WAIT_S", "at_step"]

#: The checker's socket (a path), set in the ranks' environment; no variable: no stepping.
ENV = "EZPZ_NB_STEP_GATE"

#: How long the checker waits for every rank at a step before it lets the ones there go on
#: (then the output folder is not kept there, and a crash there puts nothing back).
WAIT_S = 60.0

#: How long a rank waits for the checker's answer: longer than the checker's own wait, so
#: only a checker that stopped answering (or a rank held at the crash) reaches it.
RANK_WAIT_S = 2 * WAIT_S

#: The checker's answers, one byte: go on with this step; go on and stop asking; this step
#: is out of turn (each rank's steps come from one process, one after the other).
GO, FREE, REFUSED = b"g", b"f", b"x"

_conn: tuple[int, socket.socket] | None = None  # (pid, connection): a forked child reconnects
_free = False


def _connect(address: str) -> socket.socket:
    global _conn
    if _conn is None or _conn[0] != os.getpid():
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(RANK_WAIT_S)
        sock.connect(address)
        _conn = (os.getpid(), sock)
    return _conn[1]


def at_step(rank: int, epoch: int, step: int) -> None:
    """Tell the checker (if one steps this job) this rank reached the step; wait for its go."""
    global _free
    address = os.environ.get(ENV)
    if not address or _free:
        return
    reply = b""
    try:
        sock = _connect(address)
        sock.sendall(f"{rank} {epoch} {step} {os.getpid()}\n".encode())
        reply = sock.recv(1)
    except OSError:  # no checker there, or no answer in time
        pass
    if reply == GO:
        return
    if reply == FREE:
        _free = True
        return
    why = (
        f"the checker refused epoch {epoch} step {step}: a rank's steps come from the "
        "recorder of one process, one after the other from epoch 0 step 0 (not skipped, "
        "not claimed ahead)"
        if reply == REFUSED
        else f"the checker sent no go for epoch {epoch} step {step} (it stopped, or this "
        "rank is held at its crash)"
    )
    # Flushed before the kill: nothing of this process runs after it.
    print(f"rank {rank}: {why}: the rank stops here", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
