"""Notebook 05, exercise 4 (after notebook 02): a loop over epochs that reshuffles each one.

``check_run_epochs(fn)``: ``fn(loader, num_epochs)`` returns each epoch's sample ids.
Its job hands every rank of 4 real gloo ranks (dp 2 x tp 2) a loader whose sampler
records what it yielded, pass by pass, so the checker judges what the loader really
gave, not what the learner's code says it did.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Sampler

from ezpz_nb.workshop.stops import CHECK_TIMEOUT, each_returned, fresh_seed, wrong

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["check_run_epochs"]


class RecordingSampler(Sampler):
    """A sampler's stand-in that records, per pass, the indices it yielded.

    ``set_epoch`` and the ``epoch`` and ``seed`` attributes reach the wrapped
    sampler, so whatever reshuffles a DistributedSampler reshuffles this one.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.passes: list[list[int]] = []

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.inner.epoch

    @epoch.setter
    def epoch(self, value: int) -> None:
        self.inner.epoch = value

    @property
    def seed(self) -> int:
        return self.inner.seed

    @seed.setter
    def seed(self, value: int) -> None:
        self.inner.seed = value

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Iterator[int]:
        self.passes.append([])
        for i in self.inner:
            self.passes[-1].append(int(i))
            yield i


def job_epochs(fn: Callable, epochs: int, seed: int) -> Any:
    """Exercise 4: what ``fn`` returned, and what the loader really yielded, pass by pass.

    dp 2 x tp 2, 16 samples in batches of 2: each DP replica's share divides.
    """
    from torch.utils.data import DistributedSampler

    from ezpz_nb.data import RandomTokenDataset
    from ezpz_nb.data.groups import make_layout

    lay = make_layout(tp_size=2)
    ds = RandomTokenDataset(64, 4, num_samples=16)
    sampler = RecordingSampler(
        DistributedSampler(
            ds, num_replicas=lay.dp_size, rank=lay.dp_rank, shuffle=True, seed=seed, drop_last=True
        )
    )
    out = fn(DataLoader(ds, batch_size=2, sampler=sampler), epochs)
    if out is None:
        return None
    try:  # plain ints, so the notebook process never unpickles a learner's object
        out = [[int(i) for i in epoch] for epoch in out]
    except (TypeError, ValueError):
        out = repr(out)[:200]
    return lay.dp_rank, lay.tp_rank, out, sampler.passes


def check_run_epochs(
    fn: Callable[[Any, int], list[list[int]]],
    *,
    timeout: float = CHECK_TIMEOUT,
    cluster: Cluster | None = None,
) -> CheckResult:
    """Exercise 4: ``fn(loader, num_epochs)`` returns each epoch's sample ids, reshuffled.

    4 ranks as dp 2 x tp 2, 16 samples in batches of 2, 3 epochs; the loader
    shuffles with a DistributedSampler over the DP group (seed drawn per
    check). Judged by what the loader really yielded: once per epoch, in the
    order returned; a new order every epoch on every rank; TP peers alike; the
    two DP replicas split the 16 samples between them in every epoch. Any
    epoch numbering passes (``set_epoch(epoch + 1)`` as well as ``set_epoch(epoch)``).
    """
    # Here, not at the top: a rank imports this module for its jobs (see stops.py).
    from ezpz_nb.workshop.verdicts import judge, run_learner

    epochs = 3

    def body() -> str:
        seed = fresh_seed()  # drawn after the answers were sent (see verdicts.judge)
        got = run_learner(job_epochs, fn, epochs, seed, timeout=timeout, cluster=cluster)
        each_returned(got, "one list of sample ids per epoch")
        for r, (_dp, _tp, out, passes) in enumerate(got):
            if isinstance(out, str):
                raise wrong(
                    f"rank {r} returned {out}: return a list with one list of sample "
                    "ids (ints, from batch['index']) per epoch."
                )
            if len(passes) != epochs:
                raise wrong(
                    f"rank {r} iterated its loader {len(passes)} time(s) for "
                    f"{epochs} epochs: once per epoch."
                )
            if len(out) != epochs:
                raise wrong(f"rank {r} returned {len(out)} epoch(s), expected {epochs}.")
            for e, (o, p) in enumerate(zip(out, passes, strict=True)):
                if o != p:
                    raise wrong(
                        f"rank {r}, epoch {e}: returned {o}, but its loader yielded "
                        f"{p}: return the ids the loader gave, in order."
                    )
            for e in range(1, epochs):
                for earlier in range(e):
                    if out[e] == out[earlier]:
                        raise wrong(
                            f"rank {r} saw the same order in epoch {earlier} and epoch "
                            f"{e} ({out[e]}): the sampler reshuffles only when told a "
                            "new epoch. Look at what your loop tells loader.sampler "
                            "(set_epoch) before each pass."
                        )
        by_place = {(dp, tp): out for dp, tp, out, _ in got}
        for (dp, tp), out in by_place.items():
            if tp and out != by_place[(dp, 0)]:
                raise wrong(
                    f"the TP peers of DP replica {dp} saw different orders: call "
                    "set_epoch with the same number on every rank."
                )
        for e in range(epochs):
            a, b = by_place[(0, 0)][e], by_place[(1, 0)][e]
            if set(a) & set(b) or len(set(a) | set(b)) != 16:
                raise wrong(
                    f"in epoch {e} the DP replicas got {sorted(a)} and {sorted(b)}, "
                    "which do not split the 16 samples between them: every rank must "
                    "set the same epoch."
                )
        return (
            "Every epoch had a new order on every rank, TP peers alike, the DP replicas "
            "splitting the data between them."
        )

    return judge("run_epochs", body)
