"""The workshop: exercises whose checkers run the learner's code on real ranks.

A checker lives in an ``*_exercises`` module (the notebook process: launch, judge,
say what is wrong) and what it runs on the ranks in the ``*_jobs`` module of the
same name, so the rank side stays small and picklable by reference:

* :mod:`.exercises` / :mod:`.jobs`: exercises 1-4 of notebook 05; ``exercises`` also
  re-exports every workshop checker (``import ezpz_nb.workshop.exercises as ex``);
* :mod:`.batch_exercises` / :mod:`.batch_jobs`: exercises 5-7 (a batch, a leader's
  loop, a step count);
* :mod:`.packing_exercises` / :mod:`.packing_jobs`: notebook 11's packing collate and
  token-budget plan;
* :mod:`.throughput`: notebook 12's straggler exercise; :mod:`.tp_plan`: notebook 08's
  TP plan on the capstone model (each small enough to hold both sides);
* :mod:`.verdicts`: what every checker shares: running the learner's code on ranks, and
  turning what the ranks did into a verdict.
"""
