"""The workshop: exercises whose checkers run the learner's code on real ranks.

One module per exercise family. A family's checkers run in the notebook (launch,
judge, say what is wrong); what they run on the ranks is either in the same module
or, for the four largest families, in the ``*_jobs`` module of the same name, so no
module grows past about 300 lines and the rank side stays small and picklable by
reference. Every ``check_*`` is listed here, by module, and re-exported by
:mod:`.exercises` (``import ezpz_nb.workshop.exercises as ex``); a test holds the
list, the re-exports and docs/architecture.md to what the modules define.

* :mod:`.exercises` / :mod:`.jobs`: notebook 05, exercises 1-4:
  ``check_global_sum``, ``check_share_from_leader``, ``check_make_sampler``,
  ``check_run_epochs``;
* :mod:`.batch_exercises` / :mod:`.batch_jobs`: notebook 05, exercises 5-7:
  ``check_send_batch``, ``check_leader_batches``, ``check_steps_over_stream``;
* :mod:`.packing_exercises` / :mod:`.packing_jobs`: notebook 11:
  ``check_pack``, ``check_budget_plan``;
* :mod:`.throughput`: notebook 12: ``check_faster_loader``;
* :mod:`.tp_plan`: notebook 08: ``check_tp_plan``;
* :mod:`.dcp_state`: notebook 15: ``check_loader_state``;
* :mod:`.exact_eval`: notebook 16: ``check_exact_mean``;
* :mod:`.mixture`: notebook 17: ``check_mix_batch``;
* :mod:`.memory_exercises` / :mod:`.memory_jobs` (and :mod:`.shm_jobs`, a loader that
  fills ``/dev/shm``): notebook 19: ``check_flat``;
* :mod:`.verdicts`: what every checker shares: running on ranks (through the
  launcher's one ``run_on_ranks``), and turning what the ranks did into a verdict
  (a :class:`~ezpz_nb.workshop.verdicts.CheckResult`, a report of the package's
  one outcome vocabulary).
"""
