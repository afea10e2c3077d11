"""The processes of one benchmark measurement: run it with a time limit, find what it left.

Every process a measurement starts inherits a tag in its environment (children,
DataLoader workers, a forkserver and its ranks, torchrun's workers alike, even
the ones that moved to a process group of their own). After the measurement,
whatever still carries the tag outlived it: counted, then killed. Found the way
``ezpz_nb.agents.proctree`` finds a torchrun job's processes (:func:`marked`, the one
reader of ``/proc`` for it). Linux only; elsewhere nothing is found.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence

from ezpz_nb.agents.proctree import marked

TAG_VAR = "EZPZ_NB_BENCH_TAG"


def new_tag() -> str:
    """A tag no other measurement uses."""
    return uuid.uuid4().hex


def tagged_env(tag: str, env: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """``env`` (default: this process's) with the tag and ``extra`` set."""
    return dict(os.environ if env is None else env, **extra, **{TAG_VAR: tag})


def tagged(tag: str) -> list[int]:
    """Live (not zombie) processes, other than this one, that carry ``tag``."""
    return sorted(pid for pid in marked(tag, TAG_VAR) if pid != os.getpid())


def kill_tagged(tag: str) -> int:
    """SIGKILL every live process that carries ``tag``; return how many there were."""
    pids = tagged(tag)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return len(pids)


def run_limited(
    cmd: Sequence[str],
    *,
    tag: str,
    limit_s: float,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
) -> tuple[int | str, str, float]:
    """Run ``cmd`` (with ``tag`` in its environment) for at most ``limit_s`` seconds.

    Only ``cmd`` itself is waited for: a process it left behind (still holding
    its stdout, say) does not make it "hung"; :func:`tagged` finds those.

    Returns:
        ``(status, output, seconds)``: the exit status, or ``"hung"`` when the
        limit passed (then every tagged process has been killed); stdout and
        stderr together.
    """
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            list(cmd),
            env=tagged_env(tag, env),
            cwd=cwd,
            text=True,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            status: int | str = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            kill_tagged(tag)
            proc.kill()
            proc.wait()
            status = "hung"
        seconds = time.monotonic() - start
        log.seek(0)
        return status, log.read(), seconds
