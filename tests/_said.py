"""What a verify report says about one rule, for the tests that read its words."""

from __future__ import annotations

from typing import Any


def said(rep: Any, rule: str) -> str:
    """The first finding of ``rule`` in ``rep``: its message and hint, on one line."""
    f = rep.first(rule)
    return " ".join(" ".join([f.message, f.hint]).split()) if f is not None else ""
