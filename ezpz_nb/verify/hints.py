"""Likely causes, each chosen from what the ledger shows (or none, said plainly).

A hint that contradicts the evidence (blaming ``drop_last`` on a loader that does
not set it, sharding advice for peers that never sharded) teaches the wrong fix, so
each cause here is picked by a test on the records, and where none fits the hint
says that no known cause fits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from ezpz_nb.ledger import Allowance, StepRecord

__all__ = [
    "MODULO",
    "NO_KNOWN_CAUSE",
    "dp_hint",
    "drop_last_differs",
    "never_seen_hint",
    "no_data_hint",
    "order_hint",
    "resume_hint",
    "tp_hint",
]

NO_KNOWN_CAUSE = "no known cause fits this evidence: look at the records (report.ledger)"

#: A replay seen only at a save right after an epoch's last batch.
MODULO = (
    "the state saved right after the epoch's last batch (its iterator not yet ended) "
    "read as the epoch's start, so the resumed loader replayed the epoch: a position "
    "taken modulo the epoch's length reads 0 there. Keep the position until the "
    "iterator ends, and start the next epoch at 0 when it begins"
)


def _ids_by(recs: Sequence[StepRecord], attr: str) -> dict[int, set[int]]:
    out: dict[int, set[int]] = defaultdict(set)
    for r in recs:
        out[getattr(r, attr)].update(r.sample_ids)
    return out


def dp_hint(
    recs: Sequence[StepRecord], streams: bool = False, unseen: bool = False, sampled: bool = True
) -> str:
    """Samples on two DP replicas: no sharding at all, or shards that overlap.

    ``streams``: the loader reads an ``IterableDataset``, which no sampler shards;
    ``unseen``: some samples of the epoch were never seen (so the replicas read one
    share, not everything); ``sampled``: the loader has a sampler to blame.
    """
    by_dp = _ids_by(recs, "dp_rank")
    union = set().union(*by_dp.values()) if by_dp else set()
    if len(by_dp) > 1 and all(ids == union for ids in by_dp.values()):
        if unseen:
            return (
                "every DP replica read the same share and the other shares were never read: "
                "the ranks took the same shard (the same rank= on every rank, e.g. a "
                "hard-coded rank=0); pass rank=layout.dp_rank"
            )
        if streams:
            return (
                "no sharding by rank: every DP replica streamed every sample. A sampler does "
                "not apply to an IterableDataset: shard the stream by layout.dp_rank and "
                "layout.dp_size in its __iter__ (before splitting it over the DataLoader "
                "workers), or split_dataset_by_node for a Hugging Face stream"
            )
        return (
            "no sharding at all: every DP replica saw every sample. Shard by replica: "
            "DistributedSampler(ds, num_replicas=layout.dp_size, rank=layout.dp_rank)"
        )
    if not sampled:
        return (
            "the replicas' shards overlap: the loader's own sharding (or a resumed position) "
            "gives two replicas the same samples"
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


def never_seen_hint(
    allowance: Allowance | None,
    same_share: bool = False,
    parts: bool = False,
    sampled: bool = True,
    repeated: str = "",
) -> str:
    """Samples never seen that the loader's settings do not explain.

    ``same_share``: every DP replica read the same samples; ``parts``: each rank read
    its own part (a ``Subset``, a ``SubsetRandomSampler``) of a common whole;
    ``sampled``: the loader has a sampler (else neither drop_last nor shards are named);
    ``repeated``: the same epoch's duplicates, in words, when they number the samples missing.
    """
    if same_share:
        return (
            "every DP replica read the same share, so the other shares were never read: the "
            "ranks took the same shard (the same rank= on every rank)"
        )
    if repeated:
        return (
            f"as many samples came twice ({repeated}) in the same epoch: a sampler or shard "
            "that gave a repeat in place of these samples; fix the repeat and they return"
        )
    if parts:
        return (
            "each rank reads its own part of the dataset, and no rank's part holds these "
            "samples: a remainder part no rank reads (random_split's last part) or indices "
            "that stop short. If they are held out on purpose, wrap the ranks' whole in a "
            "Subset of the samples meant to be read"
        )
    if not sampled:
        return (
            "the loader has no sampler and drops no partial batch: it skipped these samples, "
            "or its epoch was cut short (a resumed position past them)"
        )
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


def drop_last_differs(allowances: Mapping[int, Allowance | None]) -> str:
    """Ranks built with different ``drop_last`` (or batch sizes): their step counts differ."""
    said = {
        r: (a.loader_drop_last, a.batch_size)
        for r, a in sorted(allowances.items())
        if a is not None
    }
    if len(set(said.values())) <= 1:
        return ""
    parts = ", ".join(f"rank {r}: drop_last={d}, batch_size={b}" for r, (d, b) in said.items())
    return (
        f"the ranks built their loaders with different settings ({parts}): every rank must "
        "build the same loader, only its shard may differ"
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
    straight: list[StepRecord],
    resumed: list[StepRecord],
    at: int,
    changed: str,
    scenario: str,
    streams: bool = False,
    sampled: bool = True,
) -> str:
    """The likeliest known cause of a divergence at step ``at`` of one rank's epoch.

    ``streams``: the loader reads an ``IterableDataset``, whose position no sampler
    holds; ``sampled``: it has a sampler at all (a plain iterable with a state has none).
    """
    if changed:
        return changed
    first = [r.sample_ids for r in straight[:1]]
    restarted = at < len(resumed) and at > 0 and [resumed[at].sample_ids] == first
    if restarted and streams:
        return (
            "the resumed loader started the epoch over: the position lived in the "
            "IterableDataset (in each DataLoader worker's copy of it, with workers), which "
            "the loader's state did not carry: give the dataset state_dict/"
            "load_state_dict (torchdata's StatefulDataLoader saves and restores it per "
            "worker), or count the samples consumed and skip them on resume"
        )
    if restarted and scenario == "right after a resume":
        return (
            "the position loaded by the previous resume was lost when the state was saved "
            "again before the first step: "
            + (
                "a sampler that forgets a loaded offset once its iterator is made "
                "(torchdata's StatefulDistributedSampler does) saves a fresh epoch's state"
                if sampled
                else "the state counts from the last load (or resets when the iterator is "
                "made), not from the epoch's start"
            )
        )
    if restarted and scenario == "after an epoch's last batch":
        return MODULO
    if restarted and not sampled:
        return (
            "the resumed loader started the epoch over: its state did not carry its position "
            "in the epoch (it has no sampler to hold one): save the samples or batches taken "
            "in state_dict and skip them in load_state_dict"
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
    got = resumed[at].sample_ids
    near = [at + d for d in (-1, 1, -2, 2) if 0 <= at + d < len(straight)]
    step = next((s for s in near if straight[s].sample_ids == got), None)
    if step is not None and step < at:
        return (
            f"the resumed loader repeats the straight run's step {step}: the state is "
            f"{at - step} batch(es) "
            "behind where it stopped (a position counted before the last batch was taken, "
            "or loaded minus one)"
        )
    if step is not None:
        return (
            f"the resumed loader skipped to the straight run's step {step}, {step - at} "
            "batch(es) past the "
            "state it was given. The check takes the state at the stop, runs on, then "
            "resumes from the stop's state: a position kept outside state_dict() (a file, a "
            "global of the rank's process) reads the later one. Keep all of it in the state"
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
