"""Models and datasets shared by the walkthroughs, the workshop's checkers and the tests.

* :mod:`.rule_lm`: the capstone's tiny decoder (:class:`CapstoneLM`) and its data
  (:class:`RuleTokenDataset`, sequences that follow one rule);
* :mod:`.tokenizing`: documents generated and tokenized on every read
  (:class:`TokenizingDataset`), the cost behind notebook 12's straggler.

A walkthrough in :mod:`ezpz_nb.examples` imports them from here; nothing here imports
a walkthrough.
"""

from __future__ import annotations

from ezpz_nb.models.rule_lm import CapstoneLM, RuleTokenDataset
from ezpz_nb.models.tokenizing import TokenizingDataset, tokenize

__all__ = ["CapstoneLM", "RuleTokenDataset", "TokenizingDataset", "tokenize"]
