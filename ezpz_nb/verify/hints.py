"""Likely causes, each chosen from what the ledger shows (or none, said plainly).

A hint that contradicts the evidence (blaming ``drop_last`` on a loader that does
not set it, sharding advice for peers that never sharded) teaches the wrong fix, so
each cause here is picked by a test on the records, and where none fits the hint
says that no known cause fits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from ezpz_nb.ledger import Allowance, StepRecord

__all__ = [
    "NO_KNOWN_CAUSE",
    "dp_hint",
    "never_seen_hint",
    "no_data_hint",
    "order_hint",
    "resume_hint",
    "tp_hint",
]

NO_KNOWN_CAUSE = "no known cause fits this evidence: look at the records (report.ledger)"


def _ids_by(recs: Sequence[StepRecord], attr: str) -> dict[int, set[int]]:
    out: dict[int, set[int]] = defaultdict(set)
    for r in recs:
        out[getattr(r, attr)].update(r.sample_ids)
    return out


def dp_hint(recs: Sequence[StepRecord]) -> str:
    """Samples on two DP replicas: no sharding at all, or shards that overlap."""
    by_dp = _ids_by(recs, "dp_rank")
    union = set().union(*by_dp.values()) if by_dp else set()
    if len(by_dp) > 1 and all(ids == union for ids in by_dp.values()):
        return (
            "no sharding at all: every DP replica saw every sample. Shard by replica: "
            "DistributedSampler(ds, num_replicas=layout.dp_size, rank=layout.dp_rank)"
        )
    return (
        "the replicas' shards overlap: samplers that disagree across ranks (another seed, "
        "num_replicas or rank on some ranks)"
    )


def tp_hint(recs: Sequence[StepRecord], same_ids: bool) -> str:
    """TP/CP peers that differ: in bytes (data made per rank) or in ids (sharded or seeded per rank)."""
    if same_ids:
        return (
            "the same sample ids with other bytes: the dataset's content depends on the "
            "global rank (a generator seeded by rank): make each sample a function of its "
            "index, or broadcast within the TP group"
        )
    by_rank = _ids_by(recs, "rank")
    groups: dict[int, list[int]] = defaultdict(list)
    for r in recs:
        if r.rank not in groups[r.dp_rank]:
            groups[r.dp_rank].append(r.rank)
    disjoint = all(
        not (by_rank[a] & by_rank[b]) for peers in groups.values() for a in peers for b in peers
        if a < b
    )  # fmt: skip
    if disjoint:
        return (
            "TP peers got disjoint shards: the sampler shards over the global world (rank, "
            "world_size) instead of the DP group; use num_replicas=layout.dp_size, "
            "rank=layout.dp_rank"
        )
    return (
        "TP peers drew different but overlapping samples: a sampler or shuffle seeded per "
        "global rank; seed it the same on every rank (by dp_rank at most), or broadcast "
        "within the TP group"
    )


def never_seen_hint(allowance: Allowance | None) -> str:
    """Samples never seen that the loader's settings do not explain."""
    if allowance is None or not (allowance.loader_drop_last or allowance.sampler_drop_last):
        return (
            "drop_last is not set, so nothing was meant to be dropped: the data was split "
            "into more shards than there are DP replicas (a sampler over the whole world), "
            "the epoch was cut short, or the loader skipped them"
        )
    return (
        "more than drop_last drops: the data was split into more shards than there are DP "
        "replicas, or the loader skipped them"
    )


def no_data_hint(
    epoch: int,
    had_data_before: bool,
    reiterable: bool,
    allowance: Allowance | None,
    num_samples: int | None,
    dp_size: int,
    length: int | None = None,
) -> str:
    """An epoch (or a whole run) without a single batch; ``length`` is ``len(loader)``."""
    if had_data_before and not reiterable:
        return (
            "the loader is a one-pass iterator (make_loader returned iter(DataLoader) or a "
            f"generator): it was spent after the first epoch, so epoch {epoch} is empty. "
            "Return the DataLoader itself"
        )
    if num_samples == 0 or length == 0 and not allowance_drops(allowance):
        return (
            "len(loader) is 0: the dataset (or the Subset or shard this rank reads) is empty; "
            "a filter or split that kept nothing"
        )
    batch = allowance.batch_size if allowance is not None else None
    if (
        allowance is not None
        and allowance_drops(allowance)
        and batch
        and num_samples is not None
        and -(-num_samples // dp_size) < batch
    ):
        return (
            f"DataLoader(drop_last=True) with batches of {batch} and at most "
            f"{-(-num_samples // dp_size)} sample(s) per replica: every batch is partial "
            "and dropped. Use a smaller batch or drop_last=False"
        )
    return NO_KNOWN_CAUSE


def allowance_drops(allowance: Allowance | None) -> bool:
    """The DataLoader drops partial batches (``drop_last=True``)."""
    return bool(allowance is not None and allowance.loader_drop_last)


def order_hint(shufflers: Sequence[str], unreached: Sequence[str]) -> str:
    """Two epochs in one order although the loader asked for a shuffle."""
    if unreached:
        return (
            f"the epoch never reached {'; '.join(unreached)}, so it repeats its order. "
            "Give the outermost loader a set_epoch that passes the epoch on (or seed the "
            "shuffle with seed + epoch)"
        )
    return (
        f"set_epoch reached every shuffling part ({', '.join(shufflers)}) and the order "
        "still repeated: the shuffle's seed does not depend on the epoch"
    )


def resume_hint(
    straight: list[StepRecord], resumed: list[StepRecord], at: int, changed: str, scenario: str
) -> str:
    """The likeliest known cause of a divergence at step ``at`` of one rank's epoch."""
    if changed:
        return changed
    first = [r.sample_ids for r in straight[:1]]
    restarted = at < len(resumed) and at > 0 and [resumed[at].sample_ids] == first
    if restarted and scenario == "right after a resume":
        return (
            "the position loaded by the previous resume was lost when the state was saved "
            "again before the first step: a sampler that forgets a loaded offset once its "
            "iterator is made (torchdata's StatefulDistributedSampler does) saves a fresh "
            "epoch's state"
        )
    if restarted:
        return (
            "the resumed loader started the epoch over: its state did not carry the "
            "sampler's position (a plain DistributedSampler has none: use torchdata's "
            "StatefulDistributedSampler, or a sampler with state_dict/load_state_dict)"
        )
    if at >= len(resumed):
        return (
            "the resumed loader ended the epoch early: a state saved at the end of an epoch "
            "loaded into a loader that considers that epoch done (start the next epoch "
            "with a fresh iterator, or save the state before the epoch ends)"
        )
    ours = sorted(i for r in resumed[at:] for i in r.sample_ids)
    theirs = sorted(i for r in straight[at:] for i in r.sample_ids)
    if ours == theirs:
        return (
            "the same samples in another order: the shuffle's seed or epoch was not "
            "restored (call set_epoch(epoch) before load_state_dict)"
        )
    if any(len(set(r.worker_ids)) > 1 for r in resumed):
        return (
            "the DataLoader workers resumed from other positions than they stopped at "
            "(per-worker state, or an IterableDataset re-read by each worker)"
        )
    return "the resumed loader gave other samples than the straight run from here on"
