"""What the explorer draws into its Output widget, and when: output dicts and a debouncer.

The explorer replaces its ``ipywidgets.Output``'s outputs in one assignment, as
nbformat output dicts: a PNG, a text stream, or an error as one line with the
details folded. :class:`Debouncer` turns a burst of control changes into one run.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Debouncer", "error_outputs", "png_output", "text_output"]


class Debouncer:
    """Call ``fn`` once, ``delay`` seconds after the last of a burst of pokes.

    In a kernel the call is scheduled on its event loop, so it runs in the main
    thread once the kernel is idle; elsewhere a timer thread runs it.
    """

    def __init__(self, delay: float, fn: Callable[[], Any]) -> None:
        self.delay = delay
        self.fn = fn
        self._handle: Any = None
        self._lock = threading.Lock()

    def poke(self) -> None:
        if self.delay <= 0:
            self.fn()
            return
        with self._lock:
            self.cancel()
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                self._handle = loop.call_later(self.delay, self.fn)
            else:
                self._handle = threading.Timer(self.delay, self.fn)
                self._handle.daemon = True
                self._handle.start()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def png_output(png: bytes, title: str) -> dict[str, Any]:
    """A display_data output of ``png``, shown at its own width in JupyterLab."""
    # Imported here: ranks import the explorer's module and need no matplotlib.
    from ezpz_nb.viz.figure import UNCONFINED

    return {
        "output_type": "display_data",
        "metadata": {"image/png": UNCONFINED},
        "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": title},
    }


def error_outputs(error: BaseException | None) -> list[dict[str, Any]]:
    """One line saying what failed, then the full message folded (click to open).

    A RankError from 8 ranks repeats the same message 8 times, with 8 tracebacks:
    the line names the ranks once, the fold keeps every detail.
    """
    import html

    failures = getattr(error, "failures", None) or {}
    raised = [f for f in failures.values() if f.kind != "stopped"]
    messages = sorted({f.message for f in raised})
    if len(messages) == 1:
        ranks = ", ".join(str(f.rank) for f in raised)
        line = f"rank{'s' if len(raised) > 1 else ''} {ranks}: {messages[0]}"
    else:
        line = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    details = html.escape(str(error))
    return [
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {
                "text/html": (
                    f'<div class="ezpz-error"><b>{html.escape(line)}</b>'
                    "<details><summary>the full error (every rank's traceback)</summary>"
                    f"<pre>{details}</pre></details></div>"
                ),
                "text/plain": line,
            },
        }
    ]


def text_output(text: str, name: str = "stdout") -> dict[str, Any]:
    """A stream output (``stdout`` or ``stderr``) of ``text``, newline-terminated."""
    return {
        "output_type": "stream",
        "name": name,
        "text": text if text.endswith("\n") else text + "\n",
    }
