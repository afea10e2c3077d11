"""The root of every error ezpz_nb raises on purpose.

It sits at the bottom of the package (it imports nothing of ours) so that every
layer, from ``data`` up to ``workshop``, can derive its errors from it and a learner
can catch them all with one ``except ezpz_nb.EzpzError``.
"""

from __future__ import annotations

__all__ = ["EzpzError"]


class EzpzError(Exception):
    """Base class of every error ezpz_nb raises on purpose."""
