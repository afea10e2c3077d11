"""A package's public names, each loaded from its module on first use: one table, one hook.

``import ezpz_nb`` must stay cheap (a rank imports it and needs only the rank side;
the doctor imports it where torch may be missing), and so must a package whose names
pull in matplotlib or torch. Such a package keeps a table ``{name: module}`` and asks
:func:`lazy` for its module ``__getattr__`` and ``__dir__`` (PEP 562).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy"]


def lazy(
    package: str, where: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names live where ``where`` says.

    Args:
        package: The package's ``__name__``.
        where: ``{name: module}``; a module may be relative to the package (``".result"``).

    The first lookup of a name imports its module and keeps the value in the package,
    so later lookups are plain attribute reads.
    """

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
