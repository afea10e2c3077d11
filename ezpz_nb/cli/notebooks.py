"""``ezpz-nb notebooks DIR``: copy the tutorial notebooks out for the learner to edit.

The installed copies live inside the package, where edits are lost on the next
install; DIR is the learner's own. A notebook already in DIR is the learner's
work, so it is skipped (and listed) unless ``--force`` is given.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ezpz_nb.cli.resources import notebooks_dir

__all__ = ["NotebookCopy", "copy_notebooks", "shipped_files"]

# What ships beside the notebooks (setup.py copies the same patterns into the wheel): the
# solutions in a folder of their own, so a learner does not open them by accident.
PATTERNS = ("*.ipynb", "*.md", "solutions/*.ipynb")


@dataclass
class NotebookCopy:
    """What :func:`copy_notebooks` did.

    Attributes:
        dest: The folder copied to.
        copied: Files that were not there before (paths relative to ``dest``, such as
            ``solutions/05_workshop_solutions.ipynb``).
        overwritten: Files that were there and were replaced (``force=True``).
        skipped: Files that were there and were left alone.
    """

    dest: Path
    copied: list[str] = field(default_factory=list)
    overwritten: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def report(self) -> str:
        """A few lines for the terminal: what was copied, what was skipped and why."""
        lines = []
        if self.copied or self.overwritten:
            lines.append(
                f"copied {len(self.copied) + len(self.overwritten)} file(s) to {self.dest}:"
            )
            lines += [f"  {name}" for name in self.copied]
            lines += [f"  {name} (overwritten)" for name in self.overwritten]
        if self.skipped:
            lines.append(
                f"skipped {len(self.skipped)} file(s) already in {self.dest} "
                "(your edits are kept; --force overwrites them):"
            )
            lines += [f"  {name}" for name in self.skipped]
        return "\n".join(lines)


def shipped_files(source: Path | None = None) -> list[Path]:
    """The notebooks (and notes beside them, and ``solutions/``) that ship with ezpz_nb, sorted."""
    folder = notebooks_dir() if source is None else source
    return sorted(
        p for pattern in PATTERNS for p in folder.glob(pattern) if not p.name.startswith("_")
    )


def copy_notebooks(
    dest: str | Path, *, force: bool = False, source: Path | None = None
) -> NotebookCopy:
    """Copy the tutorial notebooks into ``dest`` (created if missing).

    Args:
        dest: The learner's folder.
        force: Overwrite files that are already there.
        source: Where the notebooks come from; default :func:`notebooks_dir`.

    Raises:
        ValueError: ``dest`` is the folder the notebooks come from.
        FileNotFoundError: No notebooks were found to copy.
    """
    source = notebooks_dir() if source is None else source
    dest = Path(dest).expanduser()
    if dest.exists() and dest.resolve() == source.resolve():
        raise ValueError(f"{dest} is where the notebooks come from; name another folder")
    files = shipped_files(source)
    if not files:
        raise FileNotFoundError(f"no notebooks in {source}; reinstall ezpz_nb from its wheel")
    dest.mkdir(parents=True, exist_ok=True)
    done = NotebookCopy(dest.resolve())
    for path in files:
        name = path.relative_to(source).as_posix()  # solutions/... keeps its folder
        target = dest / name
        if target.exists() and not force:
            done.skipped.append(name)
            continue
        (done.overwritten if target.exists() else done.copied).append(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return done
