"""The handle of a job ``ez.submit`` sent to Slurm: it waits, streams, answers, cancels.

``ez.submit`` (:mod:`ezpz_nb.slurm.submission`) is built on ``sbatch`` directly, not on submitit: the job is one short script a learner
can read and submit by hand, torchrun starts the ranks exactly as on any cluster, and
the state comes from ``scontrol`` (submitit reads ``sacct``, which a cluster without
slurmdbd lacks: it then waits forever for a job that crashed). See docs/scale-out.md.

The handle reads the job folder the ranks write (:mod:`ezpz_nb.slurm.rank`) while it
polls Slurm: output lines as they come (``[n1 rank 0] ...``), replies, ledger files,
stack dumps. Everything it decides from them is in :mod:`ezpz_nb.slurm.outcome`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ezpz_nb.ledger import Ledger
from ezpz_nb.slurm import outcome
from ezpz_nb.slurm.commands import JobInfo, Slurm
from ezpz_nb.slurm.errors import SlurmInterrupted, SlurmJobError
from ezpz_nb.slurm.script import JobSpec

__all__ = ["SlurmJob"]

#: How often the handle looks at Slurm and the job folder.
_POLL_S = 0.25
#: From RUNNING to every rank in the function: srun, torchrun's rendezvous, import torch.
_START_GRACE_S = 30.0
#: squeue's reasons that waiting does not clear: the request itself is out of bounds.
_NEVER_STARTS = (
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "ReqNodeNotAvail",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
)


def _pending_hint(reason: str) -> str:
    """What to do about a reason that will not pass by waiting (a limit, a configuration)."""
    if reason.startswith(_NEVER_STARTS):
        return (
            ": the request exceeds what the partition or account allows, or asks for nodes that "
            "are not available (`sinfo` and `scontrol show partition` say which); stop the cell "
            "to cancel the job, and ask for fewer nodes or less time"
        )
    return ""


class SlurmJob:
    """A submitted job: its id, state, output, results, ledger; cancel it.

    Attributes:
        job_id: Slurm's id.
        spec: What was submitted (:class:`~ezpz_nb.slurm.script.JobSpec`).
        script: The path of the sbatch script (submit it by hand: ``sbatch <script>``).
        output: Every output line shown so far, ``[node rank r] text``.
        first_output: ``time.monotonic()`` when the first of them was shown, or None.
    """

    def __init__(self, slurm: Slurm, spec: JobSpec, job_id: str, *, echo: TextIO | None = None):
        self.slurm, self.spec, self.job_id = slurm, spec, job_id
        self.dir = Path(spec.job_dir)
        self.script = self.dir / "job.sbatch"
        self.output: list[str] = []
        self.first_output: float | None = None
        self.echo = echo
        self._offsets: dict[int, int] = {}
        self._partial: dict[int, str] = {}
        self._results: list[Any] | None = None
        self._said = ""

    def __repr__(self) -> str:
        return (
            f"SlurmJob({self.job_id}, {self.state}, {self.spec.nodes}x{self.spec.ranks_per_node})"
        )

    @property
    def state(self) -> str:
        """Slurm's state now (``PENDING``, ``RUNNING``, ``COMPLETED``...)."""
        return self.slurm.show(self.job_id).state

    def _say(self, text: str) -> None:
        out = self.echo if self.echo is not None else sys.stdout
        print(text, file=out, flush=True)

    # ------------------------------------------------------------ streaming
    def _stream(self) -> None:
        """Show the ranks' new complete lines, each prefixed ``[node rank r]``."""
        ranks = outcome.read_ranks(self.dir)
        for r in sorted(ranks):
            path = self.dir / "out" / f"rank-{r}.log"
            try:
                with path.open("rb") as fh:
                    fh.seek(self._offsets.get(r, 0))
                    chunk = fh.read()
            except OSError:
                continue
            self._offsets[r] = self._offsets.get(r, 0) + len(chunk)
            text = self._partial.pop(r, "") + chunk.decode(errors="replace")
            *lines, rest = text.split("\n")
            if rest:
                self._partial[r] = rest
            for line in lines:
                shown = f"[{ranks[r]['node']} rank {r}] {line}"
                if self.first_output is None:
                    self.first_output = time.monotonic()
                self.output.append(shown)
                self._say(shown)

    # ------------------------------------------------------------ waiting
    def wait(self, start_deadline: float | None = None) -> JobInfo:
        """Wait until the job ends, showing its queue state and the ranks' output.

        Args:
            start_deadline: Seconds the job may stay pending; then it is cancelled.

        Returns:
            Slurm's last word on the job.

        Raises:
            SlurmJobError: Pending past ``start_deadline`` (squeue's reason quoted).
            HangError: The ranks outlived the job's ``timeout``: where each one was.
            SlurmInterrupted: The cell was interrupted; the job was cancelled.
        """
        submitted = time.monotonic()
        running_since: float | None = None
        try:
            while True:
                info = self.slurm.show(self.job_id)
                self._stream()
                now = time.monotonic()
                if info.state == "PENDING":
                    self._tell(f"job {self.job_id} is queued (squeue's reason: {info.reason})"
                               + _pending_hint(info.reason))  # fmt: skip
                    if start_deadline is not None and now - submitted > start_deadline:
                        self._end_pending(info, start_deadline)
                elif info.state in ("RUNNING", "COMPLETING") and running_since is None:
                    running_since = now
                    self._tell(f"job {self.job_id} is running on {info.nodes}")
                if info.ended:
                    break
                if running_since is not None and (
                    self._all_dumped() or now - running_since > self._hang_after()
                ):
                    self._hang()
                time.sleep(_POLL_S)
            self._settle()
            return info
        except KeyboardInterrupt:
            self.cancel()
            raise SlurmInterrupted(
                f"interrupted: job {self.job_id} was cancelled (scancel {self.job_id}); "
                "nothing of it is left in squeue. Its folder keeps what the ranks wrote: "
                f"{self.dir}"
            ) from None

    def _tell(self, text: str) -> None:
        if text != self._said:
            self._said = text
            self._say(f"[slurm] {text}")

    def _hang_after(self) -> float:
        return self.spec.timeout + _START_GRACE_S

    def _end_pending(self, info: JobInfo, deadline: float) -> None:
        self.cancel()
        raise SlurmJobError(
            self.job_id,
            info.state,
            info.reason,
            f"job {self.job_id} was still pending after {deadline:g} s, squeue's reason: "
            f"{info.reason!r}; it was cancelled. `sinfo` shows the nodes: are they up, and is "
            "the request (nodes, partition, time) one they can ever satisfy?",
        )

    def _all_dumped(self) -> bool:
        """Every rank started, and each one still running dumped its stack: past its timeout."""
        ranks = outcome.read_ranks(self.dir)
        if len(ranks) < self.spec.world_size:
            return False
        waiting = set(ranks) - set(outcome.read_replies(self.dir))
        return bool(waiting) and all(outcome.dumped(self.dir, r) for r in waiting)

    def _hang(self) -> None:
        deadline = time.monotonic() + 5.0  # each rank dumps at its own deadline: the last ones
        while time.monotonic() < deadline and not self._all_dumped():
            time.sleep(0.1)
        finished = set(outcome.read_replies(self.dir))
        self.cancel()
        raise outcome.hang_error(self.dir, self.spec.world_size, self.spec.timeout, finished)

    def _settle(self) -> None:
        """After the end: wait until squeue no longer lists the job, show the last lines."""
        deadline = time.monotonic() + 30.0
        while self.slurm.in_queue(self.job_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._stream()
        for r, rest in sorted(self._partial.items()):
            self._say(f"[rank {r}] {rest}")
        self._partial.clear()

    def cancel(self) -> None:
        """Cancel the job (``scancel``) and wait until squeue no longer lists it."""
        self.slurm.scancel(self.job_id)
        self._settle()

    # ------------------------------------------------------------ answers
    def result(self, rank: int | None = None, *, start_deadline: float | None = None) -> Any:
        """Wait for the job; every rank's return value in rank order, or ``rank``'s.

        Raises:
            RankError: A rank raised (folded as ``ez.launch`` folds, nodes named).
            HangError, SlurmJobError, SlurmInterrupted: see :meth:`wait`; also when
                Slurm ended the job (time limit, node failure) before the ranks replied.
        """
        if self._results is None:
            info = self.wait(start_deadline)
            self._results = self._collect(info)
        if rank is None:
            return self._results
        if not 0 <= rank < len(self._results):
            raise IndexError(
                f"rank {rank} is not in job {self.job_id}: its ranks are 0 to "
                f"{len(self._results) - 1} (nodes x ranks_per_node)"
            )
        return self._results[rank]

    def _collect(self, info: JobInfo) -> list[Any]:
        replies = outcome.read_replies(self.dir)
        ranks = outcome.read_ranks(self.dir)
        # Exit codes only name ranks that never replied: read Slurm's output only then.
        silent = len(replies) < self.spec.world_size
        exits = outcome.exit_codes(self.dir, self.job_id) if silent else None
        error = outcome.rank_error(self.job_id, self.spec.world_size, replies, ranks, exits)
        # Slurm ended it (time limit, node failure...): that is the cause, unless a rank's
        # own exception is among the failures.
        slurm_ended = info.state not in ("COMPLETED", "FAILED", "GONE")
        if error is not None and not (slurm_ended and outcome.only_peers_gone(replies)):
            raise error
        # Every rank answered: the work is done, whatever torchrun's exit said after it.
        if error is None and len(replies) == self.spec.world_size:
            return [replies[r].value for r in range(self.spec.world_size)]  # type: ignore[union-attr]
        tail = outcome.failure_tail(self.dir, self.job_id)
        raise SlurmJobError(
            self.job_id,
            info.state,
            info.reason,
            f"Slurm ended job {self.job_id} as {info.state} (reason: {info.reason}) before "
            f"every rank answered ({len(replies)} of {self.spec.world_size} did)"
            + (f"; time limit {self.spec.time}" if info.state == "TIMEOUT" else "")
            + (f". The end of slurm-{self.job_id}.out:\n{tail}" if tail else "."),
        )

    def nodes(self) -> dict[int, str]:
        """``{rank: node}`` for the ranks that started (torchrun decides which node is first)."""
        return {r: info["node"] for r, info in sorted(outcome.read_ranks(self.dir).items())}

    def ledger(self) -> Ledger:
        """Every rank's ledger file from the job folder, merged (waits for the job first)."""
        results = self.result()
        merged = Ledger.load(self.dir / "ledger")
        if merged.num_samples is None:
            try:
                merged.num_samples = Ledger.from_results(results).num_samples
            except TypeError:  # the function returned something else: size unknown
                pass
        return merged
