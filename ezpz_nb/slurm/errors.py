"""Errors of a Slurm job that are Slurm's own: refused, pending too long, ended by Slurm, interrupted.

A rank's exception and a hang are told by the launcher's own ``RankError`` and
``HangError``; these are the failures a scheduler adds, each quoting Slurm's words.
"""

from __future__ import annotations

from ezpz_nb.errors import EzpzError
from ezpz_nb.wrapping import wrap_message

__all__ = ["SlurmError", "SlurmInterrupted", "SlurmJobError"]


class SlurmError(EzpzError, RuntimeError):
    """Slurm refused or could not run something; the message quotes Slurm and says what to do."""

    def __init__(self, message: str):
        # Wrapped between words: a notebook's output area breaks long lines mid-word.
        super().__init__(wrap_message(message))

    def _render_traceback_(self) -> list[str]:
        # The message says everything; our frames would push it off the screen.
        return [f"{type(self).__name__}: {self}"]


class SlurmJobError(SlurmError):
    """Slurm ended a job before its ranks answered (time limit, node failure, cancelled,
    pending past the start deadline).

    Attributes:
        job_id: The job's id.
        state: Slurm's state (``TIMEOUT``, ``NODE_FAIL``, ``PENDING``...).
        reason: Slurm's reason, as ``squeue``/``scontrol`` give it.
    """

    def __init__(self, job_id: str, state: str, reason: str, message: str):
        self.job_id, self.state, self.reason = job_id, state, reason
        super().__init__(message)


class SlurmInterrupted(SlurmError, KeyboardInterrupt):
    """The waiting cell was interrupted; the job was cancelled with ``scancel``.

    Still a ``KeyboardInterrupt``, so whatever stops on an interrupt still stops.
    """
