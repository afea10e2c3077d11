"""DP x TP data loading with ezpz's API, without its pitfalls.

The public names and signatures of ``ezpz.data.distributed`` (saforem2/ezpz),
written here from scratch, with a few extra keyword arguments. One return value
differs: ezpz's ``RandomTokenDataset`` yields each sample as a raw tensor of
``seq_length + 1`` tokens; ours yields ``{"input_ids", "labels", "index"}`` so a
rank (and the sample ledger) can always tell which sample it holds. What else
differs, and why (docs/ezpz_pitfalls.md lists ezpz's pitfalls):

* :class:`RandomTokenDataset` is generated lazily and deterministically per
  sample index, never seeded by rank: TP peers that load for themselves get
  the same tokens (ezpz's, as of commit 1229a17, ``src/ezpz/data/text.py``, are drawn eagerly
  from a generator seeded by ``(rank + 1) * 1234`` and silently break TP).
* :func:`get_random_dataset_fsdp_tp` warns (on rank 0, once for the job) when ``tp_group`` comes without
  ``dp_group`` (the sampler would shard over the whole world), pins memory only
  when CUDA is used, honours ``seed`` without torch.distributed too, and
  rejects inputs that would give zero batches.
* :class:`TPBroadcastDataLoader` has the leader *announce* every step (a
  batch, the end of the epoch, or its exception) instead of peers trusting
  their own ``len()``, so an IterableDataset, a lying ``__len__`` or a failing
  leader ends the epoch, or raises, on every TP rank: no hang. It can also
  save and restore its place in an epoch (``state_dict``/``load_state_dict``).
"""

from __future__ import annotations

import itertools
import operator
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ezpz_nb._dist import uses_nccl
from ezpz_nb.data.broadcast import BatchBroadcaster
from ezpz_nb.errors import EzpzError, EzpzWarning
from ezpz_nb.wrapping import wrap_message

__all__ = [
    "DataLayoutWarning",
    "RandomTokenDataset",
    "TPBroadcastDataLoader",
    "TPLeaderError",
    "forward_set_epoch",
    "get_random_dataset_fsdp_tp",
    "splitmix64",
]

_MASK64 = (1 << 64) - 1


class DataLayoutWarning(EzpzWarning):
    """A data-loading setup that runs but is probably not what was meant."""


def _warn_layout(text: str) -> None:
    """Warn of a layout mistake, pointing at the caller of the public function.

    The text starts on a line of its own, broken between words: the first line
    already holds the caller's file and line, and a notebook's output area breaks a
    longer line mid-word.
    """
    warnings.warn("\n" + wrap_message(text), DataLayoutWarning, stacklevel=3)


class TPLeaderError(EzpzError, RuntimeError):
    """The TP leader failed while loading; raised on every other TP rank.

    Attributes:
        leader_rank: Global rank of the TP leader that raised.
        error_type: Name of the leader's exception class.
        error_message: ``str()`` of the leader's exception.
        leader_traceback: The leader's formatted traceback.
    """

    def __init__(self, info: dict[str, Any], rank: int) -> None:
        self.leader_rank = info["rank"]
        self.error_type = info["type"]
        self.error_message = info["message"]
        self.leader_traceback = info["traceback"]
        super().__init__(
            f"TP leader (global rank {self.leader_rank}) raised {self.error_type}: "
            f"{self.error_message}. Rank {rank} stops here instead of waiting for a "
            f"batch that will never come; fix the leader's loader. Leader's traceback:\n"
            f"{self.leader_traceback}"
        )


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def splitmix64(x: int) -> int:
    """One splitmix64 round: a 64-bit integer mixed into an unrelated one.

    Neighbouring indices must give unrelated streams; one round decorrelates them
    before they seed a generator (here and in the capstone's token stream).
    """
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class RandomTokenDataset(Dataset):
    """Random token sequences, the same on every rank, made on demand.

    Sample ``i`` depends only on ``(seed, i)``: any rank, DataLoader worker or
    later run that asks for it gets the same tokens, and nothing is stored, so
    ``num_samples=10**6`` with ``seq_length=2048`` costs no memory up front.

    Args:
        vocab_size: Tokens are drawn from ``range(vocab_size)``.
        seq_length: Length of ``input_ids`` and ``labels``.
        num_samples: Number of samples; defaults to ``vocab_size`` (the length of ezpz's dataset as of 1229a17).
        seed: Seed of the whole dataset (never a rank).

    Each item is ``{"input_ids": int64[seq_length], "labels": int64[seq_length],
    "index": int}`` where ``labels`` are the next tokens and ``index`` is the
    sample id, so a rank can always tell which sample it holds.
    """

    def __init__(
        self, vocab_size: int, seq_length: int, *, num_samples: int | None = None, seed: int = 0
    ) -> None:
        self.vocab_size = _positive_int("vocab_size", vocab_size)
        self.seq_length = _positive_int("seq_length", seq_length)
        self.num_samples = (
            vocab_size if num_samples is None else _positive_int("num_samples", num_samples)
        )
        self.seed = operator.index(seed)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, Any]:
        i = operator.index(index)
        if i < 0:
            i += self.num_samples
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {index} out of range for {self.num_samples} samples")
        g = torch.Generator().manual_seed(splitmix64((self.seed << 40) ^ i) >> 1)
        tokens = torch.randint(0, self.vocab_size, (self.seq_length + 1,), generator=g)
        return {"input_ids": tokens[:-1], "labels": tokens[1:], "index": i}

    def __repr__(self) -> str:
        return (
            f"RandomTokenDataset(vocab_size={self.vocab_size}, seq_length={self.seq_length}, "
            f"num_samples={self.num_samples}, seed={self.seed})"
        )


def forward_set_epoch(loader: Any, epoch: int) -> None:
    """Pass ``epoch`` on to ``loader.set_epoch``, else to ``loader.sampler.set_epoch``.

    Wrappers (broadcasting, recording, step-agreeing loaders) call this so that
    a ``set_epoch`` on the outermost one reaches the sampler and reshuffles;
    a loader with neither is left alone.
    """
    target: Any = loader if hasattr(loader, "set_epoch") else getattr(loader, "sampler", None)
    if hasattr(target, "set_epoch"):
        target.set_epoch(epoch)


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _group_rank(group: Any, name: str) -> int:
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"global rank {dist.get_rank()} is not a member of the {name} it was given; "
            f"pass this rank's own group (e.g. layout.{name} from ezpz_nb.data.groups.make_layout)"
        )
    return rank


class TPBroadcastDataLoader:
    """Only the TP leader loads; it announces each step to its TP peers.

    The leader (rank 0 of ``tp_group``) iterates ``dl``. Every step it sends
    the batch, or says that the epoch ended, or that it raised. Peers follow
    those announcements, not their own ``len(dl)``, so every TP rank takes the
    same number of steps and sees the same stop or error.

    Args:
        dl: The loader to wrap (iterated on the leader only).
        tp_group: The TP process group. ``None`` means no TP group, as in
            ezpz: every rank is a leader and loads its own data (no broadcast).
            To broadcast over the whole world, pass ``dist.group.WORLD``.
        mode: ``"tensor"`` (one packed collective per batch) or ``"pickle"``
            (ezpz's ``broadcast_object_list`` path, for comparison).

    With nccl the peers receive on their current CUDA device (the leader
    yields its batch as loaded); with gloo everything stays on the CPU.

    Attributes:
        is_leader: True on the rank that loads.
        source: ``"loaded"`` on the leader, ``"received"`` on the peers (read
            by :mod:`ezpz_nb.ledger`).
    """

    def __init__(self, dl: Any, tp_group: Any = None, *, mode: str = "tensor") -> None:
        if mode not in ("tensor", "pickle"):
            raise ValueError(f"mode must be 'tensor' or 'pickle', got {mode!r}")
        self.dl = dl
        self.tp_group = tp_group
        self.mode = mode
        self._broadcaster: BatchBroadcaster | None = None
        if _is_dist() and tp_group is not None:
            self.is_leader = _group_rank(tp_group, "tp_group") == 0
            self.leader_rank = dist.get_global_rank(tp_group, 0)
            if dist.get_world_size(tp_group) > 1:
                self._broadcaster = BatchBroadcaster(tp_group, mode=mode)
        else:
            # No TP group (ezpz's _tp_is_leader(None) is True): each rank leads
            # itself. Reading None as the world group would make global rank 0
            # feed every DP replica the same batches.
            self.is_leader = True
            self.leader_rank = dist.get_rank() if _is_dist() else 0
        self.source = "loaded" if self.is_leader else "received"
        self._steps = 0  # batches yielded so far in the current epoch
        self._resume_at = 0  # set by load_state_dict: where the next epoch starts
        self._resume_loader = False  # the inner loader restored its own place

    @property
    def sampler(self) -> Any:
        """The wrapped loader's sampler (``None`` if it has none)."""
        return getattr(self.dl, "sampler", None)

    @property
    def dataset(self) -> Any:
        """The wrapped loader's dataset."""
        return getattr(self.dl, "dataset", None)

    @property
    def batch_size(self) -> int | None:
        """The wrapped loader's batch size."""
        return getattr(self.dl, "batch_size", None)

    def set_epoch(self, epoch: int) -> None:
        """Forward ``epoch`` to the sampler so the next epoch reshuffles."""
        forward_set_epoch(self.dl, epoch)

    def __len__(self) -> int:
        # A hint only: the leader's announcements decide when an epoch ends.
        return len(self.dl)

    def state_dict(self) -> dict[str, Any]:
        """Where this rank stands in the epoch, for :meth:`load_state_dict` after a restart.

        No collective: call it on every rank at the same step, between steps,
        and save each rank's (or only the leader's, see below).

        Returns:
            ``{"steps": batches yielded so far this epoch, "leader_rank": ...,
            "loader": the wrapped loader's state_dict() or None}``. Only the
            leader's state holds the wrapped loader's state (a
            ``torchdata.stateful_dataloader.StatefulDataLoader`` has one); a
            peer loads nothing, so ``"loader"`` is None there.
        """
        inner = self.dl.state_dict() if self.is_leader and hasattr(self.dl, "state_dict") else None
        return {"steps": self._steps, "leader_rank": self.leader_rank, "loader": inner}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the next epoch where ``state`` (from :meth:`state_dict`) left off.

        Peers have nothing to restore: after the restart they follow the
        leader's announcements as always, so any rank's state may be loaded on
        a peer. On the leader, a saved ``"loader"`` state goes to the wrapped
        loader's ``load_state_dict``: over a map-style dataset its sampler's
        state resumes without loading what was consumed; over an
        ``IterableDataset`` without ``state_dict`` torchdata fast-forwards by
        reading the consumed items again. Without one (a plain ``DataLoader``), the leader loads and
        throws away the first ``"steps"`` batches of the next epoch, as ezpz's
        fsdp_tp example skips consumed batches: correct, but it pays for loading
        them. Call ``set_epoch`` with the saved epoch as usual.

        Raises:
            ValueError: ``state`` is not what :meth:`state_dict` returns.
        """
        if (
            not isinstance(state, dict)
            or not isinstance(state.get("steps"), int)
            or state["steps"] < 0
        ):
            raise ValueError(
                f"not a TPBroadcastDataLoader state (from state_dict()): {state!r:.200}"
            )
        self._resume_at = state["steps"]
        self._resume_loader = False
        if (
            self.is_leader
            and state.get("loader") is not None
            and hasattr(self.dl, "load_state_dict")
        ):
            self.dl.load_state_dict(state["loader"])
            self._resume_loader = True

    def __iter__(self) -> Iterator[Any]:
        # A restored place applies to the one epoch that follows load_state_dict.
        self._steps, self._resume_at = self._resume_at, 0
        bc = self._broadcaster
        if not self.is_leader:
            while True:
                kind, payload = bc.recv()  # type: ignore[union-attr]  # peers always have one
                if kind == "end":
                    return
                if kind == "error":
                    raise TPLeaderError(payload, dist.get_rank())
                self._steps += 1
                yield payload
        # A restored inner loader starts where it stopped; a plain one starts
        # the epoch over, so the batches already consumed are loaded and dropped.
        skip = 0 if self._resume_loader else self._steps
        self._resume_loader = False
        it = itertools.islice(iter(self.dl), skip, None)
        while True:
            try:
                batch = next(it)
            except StopIteration:
                if bc is not None:
                    bc.end()
                return
            except Exception as exc:
                if bc is not None:
                    bc.error(exc)
                raise
            if bc is not None:
                bc.send(batch)
            self._steps += 1
            yield batch

    def __repr__(self) -> str:
        role = "leader" if self.is_leader else f"peer of rank {self.leader_rank}"
        return f"TPBroadcastDataLoader(mode={self.mode!r}, {role}, dl={self.dl!r})"


def _cuda_in_use() -> bool:
    if not torch.cuda.is_available():
        return False
    # Ranks on gloo use the CPU even where a GPU exists.
    return not _is_dist() or uses_nccl()


def worker_context(num_workers: int) -> str | None:
    """The DataLoader ``multiprocessing_context`` for workers started inside a rank.

    ``"fork"`` on Linux before CUDA is used, else None (the platform's default).
    """
    if num_workers == 0 or not sys.platform.startswith("linux") or torch.cuda.is_initialized():
        return None
    # Ranks started by a forkserver or spawn inherit that start method, and a
    # worker started that way re-imports torch (measured: 25 s on 2 busy cores);
    # fork is what DataLoader uses by default on Linux and is safe before CUDA.
    return "fork"


def get_random_dataset_fsdp_tp(
    batch_size: int,
    vocab_size: int,
    seq_length: int,
    *,
    num_workers: int = 0,
    pin_memory: bool = True,
    dp_group: Any = None,
    tp_group: Any = None,
    broadcast_within_tp: bool = False,
    drop_last: bool = True,
    seed: int = 1337,
    num_samples: int | None = None,
    shuffle: bool = True,
    dataset: Dataset | None = None,
    broadcast: str = "tensor",
) -> dict[str, Any]:
    """Build dataset, sampler and dataloader for FSDP (DP) + tensor parallel (TP).

    The data is sharded over the DP group only: TP peers must see the same
    batch. With ``broadcast_within_tp`` only the TP leader loads and sends
    each batch to its peers.

    Args:
        batch_size: Samples per batch on each DP replica.
        vocab_size: Vocabulary of the :class:`RandomTokenDataset`.
        seq_length: Sequence length of the :class:`RandomTokenDataset`.
        num_workers: DataLoader worker processes (persistent when > 0).
        pin_memory: Pin host memory; applied only when CUDA is in use.
        dp_group: Data-parallel group the sampler shards over. ``None`` means
            the whole world, which is wrong as soon as TP > 1.
        tp_group: Tensor-parallel group (used for the broadcast).
        broadcast_within_tp: Only the TP leader loads; peers receive.
        drop_last: Drop the incomplete last batch and the samples that do not
            divide evenly over DP (otherwise the sampler pads with repeats).
        seed: Shuffle seed (each epoch adds ``set_epoch``'s epoch); the same on
            every rank.
        num_samples: Dataset length (default ``vocab_size``, as ezpz).
        shuffle: Shuffle the sample order.
        dataset: Use this map-style dataset instead of a RandomTokenDataset.
        broadcast: ``"tensor"`` or ``"pickle"`` (see :class:`TPBroadcastDataLoader`).

    Returns:
        ``{"dataset": ..., "sampler": DistributedSampler or None,
        "dataloader": DataLoader or TPBroadcastDataLoader}``.

    Raises:
        ValueError: On sizes below 1, a batch larger than a DP shard with
            ``drop_last`` (zero batches), or a group this rank is not in.
    """
    _positive_int("batch_size", batch_size)
    if dataset is None:
        dataset = RandomTokenDataset(vocab_size, seq_length, num_samples=num_samples)
    use_dist = _is_dist()
    sampler: DistributedSampler | None = None
    generator = None
    # One warning for the job, on rank 0 (its log, its notebook line), not one per rank:
    # every rank makes the same call, and 4 copies of it were a wall of red in notebook 08.
    warn = use_dist and dist.get_rank() == 0
    if use_dist:
        if warn and tp_group is not None and dp_group is None:
            _warn_layout(
                "tp_group was given without dp_group: the sampler shards over the whole world "
                f"({dist.get_world_size()} ranks), so TP peers get different samples. "
                "Pass dp_group=layout.dp_group (ezpz_nb.data.groups.make_layout)."
            )
        if warn and broadcast_within_tp and tp_group is None:
            _warn_layout(
                "broadcast_within_tp=True without tp_group: there is no TP group to broadcast "
                "in, so every rank loads for itself. Pass tp_group=layout.tp_group."
            )
        if tp_group is not None:
            _group_rank(tp_group, "tp_group")
        dp_rank, dp_size = _group_rank(dp_group, "dp_group"), dist.get_world_size(dp_group)
        # Shard over DP replicas only (not the global world): TP peers share a shard.
        sampler = DistributedSampler(
            dataset,
            num_replicas=dp_size,
            rank=dp_rank,
            shuffle=shuffle,
            drop_last=drop_last,
            seed=seed,
        )
        shard = len(sampler)
    else:
        dp_size, shard = 1, len(dataset)  # type: ignore[arg-type]
        if shuffle:
            generator = torch.Generator().manual_seed(seed)
    if drop_last and shard < batch_size:
        raise ValueError(
            f"batch_size={batch_size} is larger than a DP shard ({len(dataset)} samples over "  # type: ignore[arg-type]
            f"{dp_size} replicas = {shard} each) and drop_last=True: every rank would get zero "
            "batches. Lower batch_size, add samples, or set drop_last=False."
        )
    dl: Any = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        shuffle=shuffle if sampler is None else False,  # a sampler excludes shuffle=
        generator=generator,
        num_workers=num_workers,
        pin_memory=pin_memory and _cuda_in_use(),
        drop_last=drop_last,
        persistent_workers=num_workers > 0,
        multiprocessing_context=worker_context(num_workers),
    )
    if use_dist and broadcast_within_tp and tp_group is not None:
        dl = TPBroadcastDataLoader(dl, tp_group, mode=broadcast)
    return {"dataset": dataset, "sampler": sampler, "dataloader": dl}
