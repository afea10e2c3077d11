"""The notebooks' walkthroughs as importable workers that also run under torchrun.

Each module has a ``run(...)`` worker that returns the rank's
:class:`~ezpz_nb.ledger.Ledger` and works unchanged in both places:

* in a notebook: ``ez.launch(tp_broadcast.run, world_size=4, tp_size=2)``;
* on a cluster: ``python -m torch.distributed.run --standalone --nproc_per_node=4
  -m ezpz_nb.examples.tp_broadcast --out DIR`` (each rank writes ``DIR/rank{r}.jsonl``;
  ``Ledger.load(DIR)`` merges them for plotting).

Modules: :mod:`~ezpz_nb.examples.dp_sharding` (shard over DP, not the world),
:mod:`~ezpz_nb.examples.tp_broadcast` (the TP leader loads and broadcasts),
:mod:`~ezpz_nb.examples.step_alignment` (uneven step counts, and two fixes),
:mod:`~ezpz_nb.examples.capstone` (a tiny language model trained with FSDP2 x TP,
its losses against one process), :mod:`~ezpz_nb.examples.throughput` (step times
per rank: data wait, compute, waiting for a straggler), :mod:`~ezpz_nb.examples.packed`
(packed documents under TP), :mod:`~ezpz_nb.examples.explore` (notebook 06's explorer
run). What every walkthrough shares is in :mod:`~ezpz_nb.examples.common`; the command
line each one gets under torchrun in :mod:`~ezpz_nb.examples.command`. The models and
datasets they train on (the capstone's ``CapstoneLM`` and ``RuleTokenDataset``, 12's
``TokenizingDataset``) live in :mod:`ezpz_nb.models`, which the workshop's checkers share.

Notebook 14's machinery, which starts torchrun agents itself rather than running under
them, is its own package, :mod:`ezpz_nb.agents`. Submodules are imported on use so
``import ezpz_nb.examples`` stays cheap.
"""
