"""Real torchrun agents driven from a notebook cell (notebook 14's machinery).

A cluster runs one torchrun agent per node; here the "nodes" are agents on this
machine that meet in a c10d rendezvous on 127.0.0.1, so every torchrun option is
exercised for real, bounded in time, with nothing left behind. Modules, from the
bottom up:

* :mod:`~ezpz_nb.agents.result`: :class:`AgentRun` (what the agents did, torchrun's
  root cause read back) and :class:`AgentError`;
* :mod:`~ezpz_nb.agents.proctree`: every process below the agents, and how to stop them;
* :mod:`~ezpz_nb.agents.torchrun_args`: one agent's command line, and the input torchrun
  itself does not check, refused before any process starts;
* :mod:`~ezpz_nb.agents.agents`: :func:`run_agents` and :func:`torchrun` (start, relay
  output, stop at a deadline, clean up);
* :mod:`~ezpz_nb.agents.by_hand`: the learner's worker file checked from outside
  (:func:`check_worker`), and the ledgers of an elastic job's attempts.

The walkthroughs that run *under* torchrun are in :mod:`ezpz_nb.examples`; this
package starts torchrun itself, and no module below it imports it.
"""

from __future__ import annotations

from ezpz_nb.agents.agents import run_agents, torchrun
from ezpz_nb.agents.by_hand import (
    Attempts,
    WorkerCheckError,
    check_worker,
    load_attempts,
    startup_lines,
    worker_from_notebook,
)
from ezpz_nb.agents.result import AgentError, AgentRun
from ezpz_nb.agents.torchrun_args import check_worker_file, free_port, torchrun_argv

__all__ = [
    "AgentError",
    "AgentRun",
    "Attempts",
    "WorkerCheckError",
    "check_worker",
    "check_worker_file",
    "free_port",
    "load_attempts",
    "run_agents",
    "startup_lines",
    "torchrun",
    "torchrun_argv",
    "worker_from_notebook",
]
