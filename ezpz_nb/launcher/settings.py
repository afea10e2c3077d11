"""The launcher's fixed numbers and the words its environment switches accept, in one place.

Both sides read them: the notebook (checks, warm-up, the standby pool) and the rank
(``LOOPBACK``), so this module imports nothing of ours.
"""

from __future__ import annotations

__all__ = [
    "LOOPBACK",
    "MAX_WORLD_SIZE",
    "ONE_LAUNCH",
    "PLAIN_ENV",
    "STANDBY_ENV",
    "START_METHODS",
    "START_METHOD_ENV",
    "WARMUP_ENV",
    "is_off",
    "is_on",
]

#: Largest world size accepted: beyond this, ranks on one machine are all overhead.
MAX_WORLD_SIZE = 64
#: Start methods the launcher supports.
START_METHODS = ("forkserver", "fork", "spawn")
#: The world size most notebook cells launch: the standby pool holds no more when
#: idle, and ``ezpz-nb doctor`` sizes its thread advice for it.
ONE_LAUNCH = 4
#: The address every rank's gloo binds to, whatever the platform names its interfaces
#: (``lo``, ``lo0``, "Loopback Pseudo-Interface 1"): see ``rankgroup.bind_gloo_to``.
LOOPBACK = "127.0.0.1"

#: The environment variable that chooses the default start method.
START_METHOD_ENV = "EZPZ_NB_START_METHOD"
#: The variable that sizes the standby pool (``0``: off).
STANDBY_ENV = "EZPZ_NB_STANDBY"
#: The variable that turns warm-up at import off (``0``).
WARMUP_ENV = "EZPZ_NB_WARMUP"
#: Modules (space- or comma-separated) the forkserver imports once before it forks any rank,
#: beside torch: what every rank would otherwise import on its own (``torch._dynamo``, which
#: an optimizer loads: 1 s of CPU a rank; ``torch.distributed.checkpoint``: 0.6 s).
PRELOAD_ENV = "EZPZ_NB_PRELOAD"
#: The variable that asks for plain text instead of widgets (``1``; ``0`` or unset: widgets).
PLAIN_ENV = "EZPZ_NB_PLAIN"

_OFF_WORDS = ("0", "off", "false", "no")


def is_off(value: str | None) -> bool:
    """True when a switch's value says off: ``0``, ``off``, ``false`` or ``no`` (any case)."""
    return (value or "").strip().lower() in _OFF_WORDS


def is_on(value: str | None) -> bool:
    """True when a switch that is off by default is set, to anything but an off word."""
    return bool((value or "").strip()) and not is_off(value)
