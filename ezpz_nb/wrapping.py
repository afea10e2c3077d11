"""Long messages broken between words, to fit a notebook's output column.

JupyterLab breaks a line that is wider than its output area wherever the edge
falls, in the middle of a word (its output CSS has ``word-break: break-all``).
Our own long one-line messages (checker verdicts, doctor lines, verify reports)
go through :func:`wrap_message` first, so the break falls between words.
Nothing of ours is imported here: every layer may use it.
"""

from __future__ import annotations

import textwrap

__all__ = ["COLUMNS", "wrap_message"]

#: Characters per line that fit JupyterLab's output area in its default monospace font
#: (13 px, ~7.8 px a character): ~108 beside the open file browser in a 1280 px window,
#: and 96 leaves a margin for the prompt column and a scrollbar.
COLUMNS = 96


def wrap_message(text: str, width: int = COLUMNS) -> str:
    """``text`` with each line longer than ``width`` broken between words.

    Lines already broken stay as they are; a continuation keeps the line's own
    indent plus two spaces, so a wrapped item reads as one. Words longer than the
    line (a path, a URL) are kept whole rather than cut.

    Args:
        text: The message, possibly of several lines.
        width: Characters per line.

    Returns:
        The message, no line longer than ``width`` unless one word is.
    """
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out.append(
            textwrap.fill(
                line.strip(),
                width,
                initial_indent=indent,
                subsequent_indent=indent + "  ",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)
