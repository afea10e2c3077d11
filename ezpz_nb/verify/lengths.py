"""What a map-style dataset holds past its ``__len__``: storage that a short ``__len__`` hides.

No sampler reads past ``__len__``, so samples stored there are never seen, and the ids
the batches carry cannot show them. :func:`probe_beyond` asks the dataset itself, at a
few indices past its length (:mod:`~ezpz_nb.verify.universe` calls it for the base dataset
and for every view without ``.indices`` above it).
"""

from __future__ import annotations

from typing import Any

from ezpz_nb.verify.batches import leaf_digest

__all__ = ["dataset_len", "probe_beyond"]


def dataset_len(ds: Any) -> int | None:
    """``len(ds)``, or None when it has none (an ``IterableDataset``'s TypeError too)."""
    try:
        return len(ds)
    except Exception:  # noqa: BLE001 - no __len__, or an IterableDataset's TypeError: unknown
        return None


# How far past ``__len__`` a wrapping dataset's period is looked for (and before it, whether
# its own samples already repeat): a few getitems, paid only by a dataset that answers far out.
_WRAP_PROBES = 32


def _digest(sample: Any) -> str:
    """A sample's bytes, every leaf (ids included): two equal digests are one stored sample."""
    return leaf_digest(sample)


def _wraps_at(ds: Any, n: int) -> int | None:
    """``m`` (``n < m``) when ``ds[m]`` is ``ds[0]`` again: storage of ``m`` samples read modulo
    its size behind a ``__len__`` of ``n``. None when ``ds`` repeats within ``__len__`` (its data
    holds repeats: no period can be told) or no repeat shows within :data:`_WRAP_PROBES`."""
    try:
        first = _digest(ds[0])
        if any(_digest(ds[j]) == first for j in range(1, min(n, _WRAP_PROBES))):
            return None
        return next(
            (j for j in range(n + 1, n + 1 + _WRAP_PROBES) if _digest(ds[j]) == first), None
        )
    except Exception:  # noqa: BLE001 - a getitem that fails here tells nothing about a period
        return None


def probe_beyond(ds: Any) -> str:
    """Whether a map-style dataset holds more samples than its ``__len__`` says.

    ``ds[len(ds)]`` answering alone proves nothing: a synthetic dataset computes a
    sample from any index. But one that answers there and raises further on (at
    ``2 * len + 1``) reads finite storage that ends past its ``__len__``; one that
    answers everywhere but gives ``ds[0]`` again at some ``m > len`` (and no repeat
    of it below ``len``) reads storage of ``m`` samples modulo its size: either way
    the samples between are never read by any sampler (an off-by-one ``__len__``).
    "" otherwise.
    """
    from torch.utils.data import IterableDataset

    n = dataset_len(ds)
    if not n or isinstance(ds, IterableDataset) or not hasattr(ds, "__getitem__"):
        return ""
    far = 2 * n + 1
    try:
        ds[n]
    except Exception:  # noqa: BLE001 - the expected end of the data (IndexError, KeyError...)
        return ""
    try:
        ds[far]
    except Exception:  # noqa: BLE001 - finite storage that ends between n and far
        return (
            f"{type(ds).__name__}[{n}] returns a sample though its __len__ is {n} (and "
            f"[{far}] raises): the dataset holds more samples than __len__ says, and no "
            "sampler reads those past it: make __len__ count every sample"
        )
    m = _wraps_at(ds, n)
    if m is not None:
        return (
            f"{type(ds).__name__}[{m}] returns the same sample as [0] though its __len__ is "
            f"{n}: it reads storage of {m} samples modulo its size, and no sampler reads the "
            f"{m - n} past __len__: make __len__ count every sample"
        )
    return ""
