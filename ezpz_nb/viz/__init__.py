"""Figures and widgets that show what each rank did: ``from ezpz_nb import viz``.

Every figure function takes a :class:`~ezpz_nb.ledger.Ledger` (or a layout) and
returns a matplotlib Figure that shows itself as a PNG in a notebook, with what
it draws kept as plain arrays in ``fig.ezpz_data``:

* :mod:`.heatmaps`: :func:`heatmap` (which rank held which samples, step by step);
* :mod:`.samples`: :func:`coverage`, :func:`loaded_vs_received` (was every sample
  seen once; who loaded them);
* :mod:`.peers`: :func:`digests` (did TP peers hold the same bytes at each step);
* :mod:`.ranks`: :func:`timeline`, :func:`layout` (how far each rank got; the
  dp x tp grid);
* :mod:`.steps`: :func:`step_timeline` (each rank's steps split into data
  wait, compute and collective wait, and the straggler named);
* :mod:`.wraps`: :func:`epoch_wraps` (a stepped loader's per-rank epochs, and where
  each rank wrapped);
* :mod:`.tokens`: :func:`doc_lengths`, :func:`token_counts`, :func:`packed_rows`
  (documents of real text: their lengths, real and pad tokens per rank and step,
  packed rows coloured by document);
* :mod:`.mixture`: :func:`mix_shares` (each source's realized share of a mixture
  against its target, per global batch and cumulative, in samples and tokens);
* :mod:`.memory`: :func:`memory_growth` (each DataLoader worker's private memory
  over the steps, per rank or per run);
* :mod:`.training`: :func:`loss_curves` (the loss per step of several runs,
  against a reference run);
* :mod:`.widgets` and :mod:`.progress`: the live explorer and run progress
  (ipywidgets), imported only on demand.

matplotlib is imported at the first figure, not with ``ezpz_nb``.
"""

from __future__ import annotations

from ezpz_nb._lazy import lazy

_WHERE = {
    "heatmap": "heatmaps",
    "digests": "peers",
    "coverage": "samples",
    "loaded_vs_received": "samples",
    "repeat_mask": "heatmaps",
    "loss_curves": "training",
    "timeline": "ranks",
    "layout": "ranks",
    "step_timeline": "steps",
    "epoch_wraps": "wraps",
    "doc_lengths": "tokens",
    "token_counts": "tokens",
    "packed_rows": "tokens",
    "mix_shares": "mixture",
    "memory_growth": "memory",
    "png_bytes": "figure",
    "EzFigure": "figure",
}

__all__ = sorted(_WHERE)


# matplotlib costs ~0.5 s to import: a figure module loads when first used.
__getattr__, __dir__ = lazy(__name__, {name: f".{module}" for name, module in _WHERE.items()})
