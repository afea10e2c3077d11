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
* :mod:`~ezpz_nb.agents.worker_job`: what a worker leaves (the ledgers of an elastic job's
  attempts, its startup lines) and the layouts the checker runs it in;
* :mod:`~ezpz_nb.agents.crash_plan`: the checker's crash plan, kept in its own process; it
  steps a job's ranks from outside and kills one at a drawn step;
* :mod:`~ezpz_nb.agents.by_hand`: the learner's worker file checked from outside
  (:func:`check_worker`), with a rank made to die mid-job.

The walkthroughs that run *under* torchrun are in :mod:`ezpz_nb.examples`; this
package starts torchrun itself, and no module below it imports it.
"""

from __future__ import annotations

from ezpz_nb._lazy import lazy

# Each name and its module, loaded on first use: ``proctree`` alone (what a benchmark
# needs to find leftover processes) then loads without torch.
_WHERE = {
    "AgentError": ".result",
    "AgentRun": ".result",
    "Attempts": ".worker_job",
    "WorkerCheckError": ".by_hand",
    "check_worker": ".by_hand",
    "check_worker_file": ".torchrun_args",
    "free_port": ".torchrun_args",
    "load_attempts": ".worker_job",
    "run_agents": ".agents",
    "startup_lines": ".worker_job",
    "torchrun": ".agents",
    "torchrun_argv": ".torchrun_args",
    "worker_from_notebook": ".worker_job",
}

__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy(__name__, _WHERE)
