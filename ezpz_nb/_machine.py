"""What this machine has to spare, read without torch (``ezpz-nb doctor`` runs without it)."""

from __future__ import annotations

__all__ = ["available_memory"]


def available_memory() -> int | None:
    """Bytes of memory available to new processes, or None where it cannot be read."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
