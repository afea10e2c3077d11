"""Every workshop checker, in one place: ``import ezpz_nb.workshop.exercises as ex``.

Each ``check_<name>(fn)`` launches a few gloo ranks, calls ``fn`` inside every
rank the way its exercise describes, and looks at what the ranks *did* (the
values they returned, the samples their loaders yielded, how often each rank's
dataset was read, whether they hung). It prints one verdict in plain words and
returns a :class:`CheckResult`:

* ``"not done"``: the function still raises ``NotImplementedError`` (or returns
  ``None``), as shipped;
* ``"wrong"``: what was wrong, on which rank, and a hint;
* ``"refused"``: the checker's own code was changed in the notebook (by a cell, or by
  code the function ran as it was sent), so no verdict can be trusted (``send_time.py``);
* ``"correct"``.

Checkers never read the learner's source and never trust what it says about
itself: any code that behaves right passes, and code that only looks right
fails. Inputs an answer could be fitted to (values, seeds, lengths, shapes) are
drawn anew for each check. Every checker also takes ``timeout=`` (seconds; most
default to :data:`CHECK_TIMEOUT`) after which the learner's code is reported as
hung and its ranks are stopped.

This module only gathers them: each checker lives beside what it runs on the
ranks, in its exercise's module (the package docstring lists them). Notebook 05's
exercises follow its notebooks: 1-2 after 01 (collectives, subgroups), 3-4 after
02 (sharding, epochs), 5 after 03 (a batch of unknown shape), 6-7 after 04 (step
alignment).

Example::

    import ezpz_nb.workshop.exercises as ex

    def global_sum(x):
        dist.all_reduce(x)
        return x

    ex.check_global_sum(global_sum).passed   # True
"""

from __future__ import annotations

from ezpz_nb.workshop.budget_plan import check_budget_plan
from ezpz_nb.workshop.collectives import check_global_sum, check_share_from_leader
from ezpz_nb.workshop.dcp_state import check_loader_state
from ezpz_nb.workshop.dp_sampler import check_make_sampler
from ezpz_nb.workshop.epochs import check_run_epochs
from ezpz_nb.workshop.exact_eval import check_exact_mean
from ezpz_nb.workshop.flat_storage import check_flat
from ezpz_nb.workshop.leader_loop import check_leader_batches
from ezpz_nb.workshop.mixture import check_mix_batch
from ezpz_nb.workshop.packing import check_pack
from ezpz_nb.workshop.send_batch import check_send_batch
from ezpz_nb.workshop.send_time import mark_baseline
from ezpz_nb.workshop.stops import CHECK_TIMEOUT
from ezpz_nb.workshop.stream_steps import check_steps_over_stream
from ezpz_nb.workshop.throughput import check_faster_loader
from ezpz_nb.workshop.tp_plan import check_tp_plan
from ezpz_nb.workshop.verdicts import CheckResult

__all__ = [
    "CHECK_TIMEOUT",
    "CheckResult",
    "check_budget_plan",
    "check_exact_mean",
    "check_faster_loader",
    "check_flat",
    "check_global_sum",
    "check_leader_batches",
    "check_loader_state",
    "check_make_sampler",
    "check_mix_batch",
    "check_pack",
    "check_run_epochs",
    "check_send_batch",
    "check_share_from_leader",
    "check_steps_over_stream",
    "check_tp_plan",
]

# Last, once every checker is imported: the print of the checkers' code that each check
# compares with, so a checker changed by a cell before its check is refused (send_time.py).
mark_baseline()
