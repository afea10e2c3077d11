"""The workshop: exercises whose checkers run the learner's code on real ranks.

One module per exercise family, holding its checkers and what they run on the
ranks; a family that would grow past about 300 lines is split by exercise, one
module per exercise (notebooks 05 and 11). A family's checkers run in the notebook
(launch, judge, say what is wrong); its jobs run on the ranks, which import the
module by reference to unpickle them. So the modules below import at their top only
what a rank may load (torch, the data layers, :mod:`.stops`), and take
:func:`~ezpz_nb.workshop.verdicts.judge` and
:func:`~ezpz_nb.workshop.verdicts.run_learner` inside each checker: :mod:`.verdicts`
brings the launcher's notebook side with it. Every ``check_*`` is listed here, by
module, and re-exported by :mod:`.exercises` (``import ezpz_nb.workshop.exercises as
ex``); a test holds the list, the re-exports and docs/architecture.md to what the
modules define.

* :mod:`.collectives`: notebook 05, exercises 1-2: ``check_global_sum``,
  ``check_share_from_leader``;
* :mod:`.dp_sampler`: notebook 05, exercise 3: ``check_make_sampler``;
* :mod:`.epochs`: notebook 05, exercise 4: ``check_run_epochs``;
* :mod:`.send_batch`: notebook 05, exercise 5: ``check_send_batch``;
* :mod:`.leader_loop`: notebook 05, exercise 6: ``check_leader_batches``;
* :mod:`.stream_steps`: notebook 05, exercise 7: ``check_steps_over_stream``;
* :mod:`.packing`: notebook 11, exercise 1: ``check_pack``;
* :mod:`.budget_plan`: notebook 11, exercise 2: ``check_budget_plan``;
* :mod:`.throughput`: notebook 12: ``check_faster_loader``;
* :mod:`.tp_plan`: notebook 08: ``check_tp_plan``;
* :mod:`.dcp_state`: notebook 15: ``check_loader_state``;
* :mod:`.exact_eval`: notebook 16: ``check_exact_mean``;
* :mod:`.mixture`: notebook 17: ``check_mix_batch``;
* :mod:`.flat_storage`: notebook 19: ``check_flat`` (its epoch :mod:`.flat_epoch`, its rows and
  what a dataset holds of them :mod:`.flat_rows`, where it keeps the tokens :mod:`.flat_held` and :mod:`.flat_find`,
  whether its samples are read from there :mod:`.flat_protect`, the verdict :mod:`.flat_judge`); the
  lesson's storages and their per-worker measurement are :mod:`.storages` (whose tokens
  ``check_flat`` also uses), its loader that fills ``/dev/shm`` is :mod:`.shm_fill`, and
  :mod:`.witness` reads ``check_flat``'s workers' memory from the notebook's process;
* :mod:`.exercises`: the index: every checker above, re-exported;
* :mod:`.stops` and :mod:`.verdicts`: what every checker shares: what stops a check
  (``wrong``, ``not_done``) and small helpers, importable on a rank; and running on
  ranks (through the launcher's one ``run_on_ranks``) and turning what the ranks did
  into a verdict (a :class:`~ezpz_nb.workshop.verdicts.CheckResult`, a report of the
  package's one outcome vocabulary).
"""
