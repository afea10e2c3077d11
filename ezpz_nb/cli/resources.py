"""Where the tutorial notebooks that ship with the package are found."""

from __future__ import annotations

from pathlib import Path

__all__ = ["is_packaged", "notebooks_dir"]

# The ezpz_nb package folder (this file is ezpz_nb/cli/resources.py).
_PACKAGE = Path(__file__).resolve().parent.parent
# Where setup.py puts the notebooks when it builds a wheel.
_PACKAGED = "_notebooks"


def notebooks_dir() -> Path:
    """The folder holding the tutorial notebooks.

    An installed wheel carries them in ``ezpz_nb/_notebooks`` (copied there when the
    wheel is built); an editable install or a source checkout uses the repository's
    ``notebooks/`` beside the package.

    Raises:
        FileNotFoundError: Neither folder exists (e.g. an install made without them).
    """
    for folder in (_PACKAGE / _PACKAGED, _PACKAGE.parent / "notebooks"):
        if folder.is_dir():
            return folder
    raise FileNotFoundError(
        f"the tutorial notebooks are neither in {_PACKAGE / _PACKAGED} "
        f"nor in {_PACKAGE.parent / 'notebooks'}; reinstall ezpz_nb from "
        "its wheel or use a checkout of the repository"
    )


def is_packaged(folder: Path) -> bool:
    """True for the installed copy inside the package, which a learner should not edit.

    Edits there are lost on the next install and, in a system or shared
    environment, may not even be allowed; a checkout's ``notebooks/`` is the
    learner's own.
    """
    return folder.resolve() == (_PACKAGE / _PACKAGED).resolve()
