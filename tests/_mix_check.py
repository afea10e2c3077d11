"""What notebook 17's checker tests share (test_mix_exercise.py, test_mix_fresh.py)."""

from __future__ import annotations

import os

from ezpz_nb.workshop.mixture import check_mix_batch

#: Checks per answer: each draws its own sizes, weights and seed. One in `make unit`, as in
#: every checker's file (each run draws afresh), 20 in `make stress`.
DRAWS = int(os.environ.get("EZPZ_NB_DRAWS", "1"))


def rejected(cluster, fn, says: str | tuple[str, ...], draws: int) -> None:
    """``fn`` judged wrong ``draws`` times, its message holding ``says`` (or one of them)."""
    said = [says] if isinstance(says, str) else says
    for _ in range(draws):
        got = check_mix_batch(fn, cluster=cluster)
        assert got.status == "wrong" and any(x in got.message for x in said), got.message
