"""The workshop: exercises whose checkers run the learner's code on real ranks.

:mod:`.exercises` is what a notebook imports (``import ezpz_nb.workshop.exercises
as ex``); :mod:`.verdicts` turns runs into verdicts; :mod:`.jobs` is what runs on
the ranks for each check.
"""
