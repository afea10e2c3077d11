"""What a torchrun job started from a notebook did, and the error that says why it failed.

:class:`AgentRun` holds each agent's command, exit status and output, and reads
torchrun's failure report (:meth:`AgentRun.root_cause`). :class:`AgentError` carries
one. Both live here, below :mod:`~ezpz_nb.agents.torchrun_args` (which refuses bad
input) and :mod:`~ezpz_nb.agents.agents` (which runs the agents), so neither of those
imports the other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ezpz_nb.errors import EzpzError

__all__ = ["AgentError", "AgentRun"]


class AgentError(EzpzError):
    """A torchrun job started from the notebook was refused, failed, or was stopped.

    Attributes:
        run: What the agents did (output, exit statuses), or ``None`` when the job
            was refused before any process started.
    """

    def __init__(self, message: str, run: AgentRun | None = None) -> None:
        super().__init__(message)
        self.run = run


@dataclass
class AgentRun:
    """What a set of torchrun agents did.

    Attributes:
        commands: Each agent's command line.
        returncodes: Each agent's exit status (negative: killed by that signal).
        output: Each agent's stdout and stderr, interleaved as written.
        elapsed_s: Seconds from the first start to the last exit.
        stopped: Why the agents were stopped early ("deadline", "interrupt"), or "".
        label: What the run was, in words, when a checker ran it (its layout), or "".
    """

    commands: list[list[str]]
    returncodes: list[int | None] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    stopped: str = ""
    label: str = ""

    @property
    def ok(self) -> bool:
        """True when every agent exited 0 on its own."""
        return not self.stopped and all(rc == 0 for rc in self.returncodes)

    def diagnosis(self) -> str:
        """One plain paragraph: how the job ended and what to do about it."""
        text = "\n".join(self.output)
        if self.stopped:
            return f"stopped ({self.stopped}) after {self.elapsed_s:.1f} s; every agent and rank killed"
        if self.ok:
            return f"every agent exited 0 ({len(self.commands)} node(s), {self.elapsed_s:.1f} s)"
        if "RendezvousTimeoutError" in text:
            return (
                "the rendezvous gave up: not every node joined within --rdzv-conf join_timeout, "
                "so the agents that came exited without starting any rank. Start every node "
                "(same --nnodes, --rdzv-endpoint and --rdzv-id), or raise join_timeout when "
                "nodes start far apart (a queue that starts them one by one)."
            )
        if "RendezvousConnectionError" in text or "DistNetworkError" in text:
            return (
                "an agent could not talk to the rendezvous store at --rdzv-endpoint: check that "
                "the endpoint host runs an agent and that its port is free and reachable."
            )
        cause = self.root_cause()
        if cause:
            return (
                "a rank failed, so its node's torchrun stopped that node's ranks; its report:\n"
                + cause
            )
        return f"agents exited with {self.returncodes}; see their output"

    def root_cause(self) -> str:
        """The failed rank that started it (rank, exit code, traceback), from torchrun's report, or "".

        torchrun names as root cause the failure with the earliest time stamp, to the
        second: a rank whose collective lost its peer ("Connection closed by peer")
        often ties with the rank that raised, and wins. A failure that is not such a
        consequence is preferred, and the text says so when it is not torchrun's pick.
        """
        for out in self.output:
            head, found, tail = out.partition("Root Cause (first observed failure):")
            if not found:
                continue
            root = _entries(tail.split("=" * 20)[0])
            others = _entries(head.rpartition("Failures:")[2]) if "Failures:" in head else []
            if root and _lost_peer(root[0]):
                first = next((e for e in others if not _lost_peer(e)), None)
                if first is not None:
                    return (
                        "The failure that started it (torchrun's first observed failure, "
                        "to the second, was a rank that lost its peer):\n" + first
                    )
            return "Root Cause (first observed failure):\n" + (root[0] if root else tail.rstrip())
        return ""

    def raise_for_status(self) -> AgentRun:
        """Return this run if it went well, else raise :class:`AgentError` saying why."""
        if not self.ok:
            raise AgentError(self.diagnosis(), self)
        return self

    def lines(self, pattern: str = "") -> list[str]:
        """Every agent's output lines that match the regular expression ``pattern``."""
        return [ln for out in self.output for ln in out.splitlines() if re.search(pattern, ln)]


# What a rank's collective raises when another rank died first: a consequence.
_LOST_PEER = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe")


def _entries(section: str) -> list[str]:
    """The ``[n]:`` entries of one section of torchrun's failure report, each whole."""
    parts = re.split(r"^(?=\[\d+\]:)", section, flags=re.M)
    return [p.split("-" * 20)[0].rstrip() for p in parts if re.match(r"\[\d+\]:", p)]


def _lost_peer(entry: str) -> bool:
    """The entry's traceback ends in a lost connection, or its rank was only stopped (SIGTERM)."""
    return bool(_LOST_PEER.search(entry)) or "(SIGTERM)" in entry
