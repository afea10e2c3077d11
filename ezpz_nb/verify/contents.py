"""What the ids alone cannot show: the same data under two ids, an unread tail.

:func:`same_bytes`: the same data under two ids on two DP replicas, sharded ids over
unsharded bytes. :func:`content_findings` adds a dataset longer than its ``__len__``
(:func:`~ezpz_nb.verify.universe.probe_beyond`); :func:`prefix_finding` names a
``Subset`` that cut the last partial global batch.

The contract's rules read the ids the batches carry. A loader that stamps ids dealt
as if sharded (``perm[rank::world]``) on data every replica reads alike (the first
samples of the dataset) passes them all while each replica trains on the same bytes.
An id may hold other bytes in another epoch (augmentation draws them anew), but two
ids holding the very same rows of integers (tokens, pixels) on two replicas are one
sample read twice. Floats are not compared: noise an RNG seeded alike on every rank
draws is the same there without any sample being read twice.
"""

from __future__ import annotations

from collections.abc import Sequence

from ezpz_nb.verify.observe import Outcome
from ezpz_nb.verify.report import Finding
from ezpz_nb.verify.universe import Universe, beyond_len, prefix_cut

__all__ = ["content_findings", "prefix_finding", "same_bytes"]


def same_bytes(outs: Sequence[Outcome]) -> Finding | None:
    """The first sample whose data another DP replica held under another id (None: none)."""
    first: dict[str, tuple[int, int, int, int, int]] = {}  # digest -> id, dp, rank, epoch, step
    for o in sorted(outs, key=lambda o: o.rank):
        for r in o.records:
            digests = o.contents.get((r.epoch, r.step), [])
            if len(digests) != len(r.sample_ids):
                continue
            for i, d in zip(r.sample_ids, digests, strict=True):
                seen = first.setdefault(d, (i, r.dp_rank, r.rank, r.epoch, r.step))
                if seen[0] == i or seen[1] == r.dp_rank:
                    continue
                names = {k: v for x in outs for k, v in x.names.items()}
                a, b = names.get(seen[0], seen[0]), names.get(i, i)
                return Finding(
                    "dp_disjoint", "dp_duplicate", r.epoch,
                    f"Epoch {r.epoch}: sample {b} on rank {r.rank} (step {r.step}) holds the "
                    f"same data as sample {a} on rank {seen[2]} (epoch {seen[3]}, step "
                    f"{seen[4]}): two DP replicas read the same bytes under other ids.",
                    rank=r.rank, step=r.step, sample=str(b), ranks=[seen[2], r.rank],
                    hint="the ids are dealt as if sharded but the data is not: read each "
                    "sample by the id it carries (dataset[i] for the sampler's i), or shard "
                    "the data itself; a dataset that truly holds duplicate samples needs "
                    "key='digest'",
                )  # fmt: skip
    return None


def content_findings(
    outs: Sequence[Outcome], universe: frozenset[int] | None, n: int | None, how: str,
    own_length: bool,
) -> list[Finding]:  # fmt: skip
    """What the ids alone cannot show: a dataset longer than its ``__len__`` (when the
    universe is that length), and the same bytes under two ids on two DP replicas."""
    out = []
    beyond = beyond_len([o.dataset for o in outs], Universe(universe, n, how)) if own_length else ""
    epoch = min((r.epoch for o in outs for r in o.records), default=0)
    if beyond:
        out.append(Finding("exactly_once", "never_seen", epoch, f"The universe {how} is short.",
                           hint=beyond))  # fmt: skip
    same = same_bytes(outs)
    if same is not None:
        out.append(same)
    return out


def prefix_finding(outs: Sequence[Outcome], global_batch: int, epoch: int) -> list[Finding]:
    """A wrapper that reads all but the last partial global batch: a remainder drop, named."""
    m, n = prefix_cut([o.dataset for o in outs], global_batch)
    if not m:
        return []
    return [
        Finding(
            "exactly_once", "never_seen", epoch,
            f"The loader's dataset reads the first {m} of the {n} samples under it: "
            f"samples {m} to {n - 1} are never read.",
            expected=f"a remainder drop: a Subset cut the {n - m} sample(s) past the last "
            f"whole global batch of {global_batch}, as drop_last=True would (pass "
            f"num_samples={n} to judge them as missing)",
            sample=str(m),
        )
    ]  # fmt: skip
