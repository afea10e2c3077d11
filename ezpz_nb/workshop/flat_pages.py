"""Notebook 19: the pages a loader worker holds alone, read by the notebook's process from /proc.

A forked worker shares every page with its rank until one of them writes it; a page the
worker then holds alone (present and mapped by it only: the exclusive bit of
``/proc/PID/pagemap``) is one it wrote, its own copy of the rank's page or a page its
allocator took afresh. Its private memory in all (:func:`~ezpz_nb.ledger.memory.read_memory`)
counts every such page: its loader's, and those a library's allocator writes as it reads,
on the free room of the rank's heap. Issue 45's seventh trial: a Hugging Face ``datasets``
table, a right answer, grew each worker by 4.3-4.7 MiB beyond the checker's own flat
array's, all of it copies of the rank's pages (2.2 MiB on glibc's heap, the rest on small
allocators' arenas), while no page of its Arrow buffer was written. So the checker asks
which of the pages a worker wrote hold the dataset's storage: :func:`written` gives the
worker's side, as page numbers; the rank's walk (:func:`.flat_held.holdings`) gives the
pages of what the dataset references.

Linux only: :func:`written` answers ``None`` elsewhere, or where the map cannot be read or
shows no exclusive page (a kernel that does not report it). This module imports only the
standard library: the witness, which a rank imports, calls it.
"""

from __future__ import annotations

import mmap
from array import array

__all__ = ["PAGE", "written"]

#: Bytes a page: page numbers are addresses divided by it.
PAGE = mmap.PAGESIZE
_PRESENT, _EXCLUSIVE = 1 << 63, 1 << 56


def _dirty_ranges(pid: int) -> tuple[list[tuple[int, int]], int]:
    """The private writable mappings of ``pid`` that hold dirty or swapped pages, and how
    many kB those pages are (``/proc/PID/smaps``): the only places a written page can be."""
    ranges: list[tuple[int, int]] = []
    span: tuple[int, int] | None = None
    dirty = total = 0
    with open(f"/proc/{pid}/smaps", encoding="ascii", errors="replace") as fh:
        for line in fh:
            first, _, rest = line.partition(" ")
            if first.endswith(":"):  # a field of the mapping above
                if first in ("Private_Dirty:", "Swap:") and span is not None:
                    dirty += int(rest.split()[0])
                continue
            if span is not None and dirty:
                ranges.append(span)
                total += dirty
            low, _, high = first.partition("-")
            perms = rest.split()[0]
            span = (int(low, 16), int(high, 16)) if perms[1] == "w" and perms[3] == "p" else None
            dirty = 0
    if span is not None and dirty:
        ranges.append(span)
        total += dirty
    return ranges, total


def written(pid: int) -> array[int] | None:
    """The page numbers process ``pid`` holds alone (present, mapped by it only) in its
    private writable mappings; ``None`` where they cannot be read (see the module)."""
    want = _PRESENT | _EXCLUSIVE
    try:
        ranges, dirty = _dirty_ranges(pid)
        out: array[int] = array("Q")
        with open(f"/proc/{pid}/pagemap", "rb") as fh:
            for low, high in ranges:
                first = low // PAGE
                fh.seek(first * 8)
                entries = array("Q", fh.read((high - low) // PAGE * 8))
                out.extend(first + k for k, e in enumerate(entries) if e & want == want)
    except (OSError, ValueError, IndexError):  # gone, not Linux, or a line not as above
        return None
    if dirty and not out:  # dirty pages, none reported exclusive: the bit is not given here
        return None
    return out
