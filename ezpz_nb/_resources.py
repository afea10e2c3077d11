"""Where files that ship with the package are found."""

from __future__ import annotations

from pathlib import Path

__all__ = ["notebooks_dir"]

_PACKAGE = Path(__file__).resolve().parent


def notebooks_dir() -> Path:
    """The folder holding the tutorial notebooks.

    An installed wheel carries them in ``ezpz_nb/_notebooks`` (copied there when the
    wheel is built); an editable install or a source checkout uses the repository's
    ``notebooks/`` beside the package.

    Raises:
        FileNotFoundError: Neither folder exists (e.g. an install made without them).
    """
    for folder in (_PACKAGE / "_notebooks", _PACKAGE.parent / "notebooks"):
        if folder.is_dir():
            return folder
    raise FileNotFoundError(f"the tutorial notebooks are neither in {_PACKAGE / '_notebooks'} "
                            f"nor in {_PACKAGE.parent / 'notebooks'}; reinstall ezpz_nb from "
                            "its wheel or use a checkout of the repository")
