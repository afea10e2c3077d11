"""The root of every error ezpz_nb raises on purpose.

It sits at the bottom of the package (it imports nothing of ours) so that every
layer, from ``data`` up to ``workshop``, can derive its errors from it and a learner
can catch them all with one ``except ezpz_nb.EzpzError``.
"""

from __future__ import annotations

__all__ = ["EzpzError", "EzpzWarning"]


class EzpzError(Exception):
    """Base class of every error ezpz_nb raises on purpose."""


class EzpzWarning(UserWarning):
    """Base class of every warning ezpz_nb issues on purpose.

    Issued on a launcher rank, it is shown once in the notebook, pointing at the
    line that launched the run and naming the ranks (see :mod:`ezpz_nb.events`).
    """
