"""The loader's state inside one ``torch.distributed.checkpoint`` save, keyed per DP rank.

``dcp.save`` takes every rank's state dict and writes each *key* once. Two
ranks that put a value under the same key are taken to hold the same value
(``dedup_save_plans`` in torch 2.13, pytorch PR #125334): one copy is written,
from the rank whose plan is smallest so far, not from a fixed rank, and ``dcp.load``
hands that copy to every rank. A loader saved as ``{"loader": loader.state_dict()}``
on every rank therefore comes back as *one* rank's place on all of them: the
others replay its shard. :class:`LoaderCheckpoint` writes

    {"layout": {"version", "dp_size", "tp_size", "design"},
     "dp_rank_<r>": {"loader": loader.state_dict()},
     "rng_rank_<g>": this process's generators (pickled), # one per global rank g
     "global": {"epoch", "consumed_samples"}}            # design "reshard" only

so each DP replica keeps its own place, and each process its own random state:
torch's and Python's generators, numpy's and the rank's CUDA device's when the
process has them, DTensor's tracker's where it keeps its own (``rng_state``). The
generators are per *process*, not per DP rank: TP peers may draw differently
(Megatron seeds each TP rank's model-parallel CUDA generator apart), so a peer
must not get its leader's. TP peers of one DP rank write the same
key, holding their TP leader's part (sent to them in :meth:`LoaderCheckpoint.state_dict`),
so DCP's one copy per TP group is the leader's, and a peer restores it to resume in
step with its leader. Before any byte is written the peers are checked to agree with
the leader on everything they track: a peer that does not load
(``TPBroadcastDataLoader``: ``"loader": None``) must still be at the leader's step.

Resuming at another layout has two designs (``on_new_layout``):

* ``"refuse"`` (torchtitan since PR #816): a per-rank place cannot be split over
  another DP size, so :meth:`LoaderCheckpoint.prepare_load` raises
  :class:`CheckpointLayoutError` saying what differs;
* ``"reshard"`` (Megatron's ``consumed_samples``, MosaicML's global sample
  position): the DP ranks' global counter, checked equal at save, is loaded
  into a loader that cuts the rest of the epoch anew (``GlobalOrderLoader``).
  Its randomness must not be per rank (the loader says so with ``reshardable``).

Nothing is ever dropped silently: a DP rank whose saved state has no new owner
is a refusal.
"""

from __future__ import annotations

import pickle
from typing import Any, Literal, get_args

import torch.distributed as dist

from ezpz_nb.data.rng_state import capture_rng, restore_rng
from ezpz_nb.data.state_print import shape_print, tracks
from ezpz_nb.errors import EzpzError

__all__ = [
    "CHECKPOINT_VERSION",
    "DESIGNS",
    "CheckpointLayoutError",
    "CheckpointStateError",
    "Design",
    "LoaderCheckpoint",
    "sub_layout",
]

#: Bumped when the keys below change; a restore of another version refuses.
#: 2: the random state moved from ``dp_rank_<r>`` to one key per process, and grew
#: numpy's, the CUDA device's and DTensor's generators.
CHECKPOINT_VERSION = 2
Design = Literal["refuse", "reshard"]
DESIGNS: tuple[str, ...] = get_args(Design)


class CheckpointLayoutError(EzpzError, RuntimeError):
    """The checkpoint's loader state was saved at a layout (or version) this run cannot resume."""


class CheckpointStateError(EzpzError, RuntimeError):
    """Ranks that must hold the same loader state do not: saving it would keep one silently."""


def _gather(value: Any, group: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, value, group=group)
    return out


class LoaderCheckpoint:
    """A ``Stateful`` for ``dcp.save``/``dcp.load`` beside the model and optimizer.

    Example (every rank)::

        state = {"model": model_state, "optim": optim_state,
                 "data": LoaderCheckpoint(loader, layout)}
        dcp.save(state, checkpoint_id=path)
        ...                                   # a new job, fresh loader
        state["data"].prepare_load(path)      # refuses a changed layout, saying what
        dcp.load(state, checkpoint_id=path)

    Args:
        loader: Anything with ``state_dict()``/``load_state_dict()``.
        layout: This rank's :class:`~ezpz_nb.data.groups.Layout` (``dp_rank``,
            ``dp_size``, ``tp_size``, ``dp_group``, ``tp_group``).
        on_new_layout: ``"refuse"`` or ``"reshard"`` (see the module docstring).
        key: The key this object has in the state given to ``dcp.save``
            (read by :meth:`prepare_load`).
        process_rng: Also save and restore this process's generators under
            ``rng_rank_<global rank>`` (:mod:`ezpz_nb.data.rng_state`: torch's, from
            which a DataLoader draws its workers' seeds, Python's, and numpy's, the
            CUDA device's and DTensor's where the process has them).
    """

    def __init__(
        self,
        loader: Any,
        layout: Any,
        *,
        on_new_layout: Design = "refuse",
        key: str = "data",
        process_rng: bool = True,
    ) -> None:
        if on_new_layout not in DESIGNS:
            raise CheckpointLayoutError(
                f"on_new_layout must be one of {DESIGNS}, got {on_new_layout!r}"
            )
        self.loader, self.layout, self.design = loader, layout, on_new_layout
        self.key, self.process_rng = key, process_rng
        self._saved: dict[str, Any] | None = None  # the saved layout, set by prepare_load
        #: The generators the last load put back (``rng_state.restore_rng``'s names).
        self.restored_rng: list[str] = []

    # ------------------------------------------------------------ what is written
    def layout_info(self) -> dict[str, Any]:
        """The layout entry this rank writes: version, DP and TP sizes, design."""
        return {
            "version": CHECKPOINT_VERSION,
            "dp_size": self.layout.dp_size,
            "tp_size": self.layout.tp_size,
            "design": self.design,
        }

    def rank_key(self) -> str:
        """This rank's own key, ``dp_rank_<r>``: one per DP replica, shared by TP peers."""
        return f"dp_rank_{self.layout.dp_rank}"

    def rng_key(self) -> str:
        """This process's key for its generators, ``rng_rank_<global rank>``."""
        return f"rng_rank_{self.layout.rank}"

    def state_dict(self) -> dict[str, Any]:
        """The entry for ``dcp.save`` (collective: every rank calls it, inside ``dcp.save``).

        Raises:
            CheckpointStateError: TP peers hold different loader states, or (design
                ``"reshard"``) DP ranks disagree on the global position.
        """
        if self._saved is not None and self._saved["dp_size"] != self.layout.dp_size:
            # dcp.load asks for a template: only keys the checkpoint has.
            return self._template()
        part: dict[str, Any] = {"loader": self.loader.state_dict()}
        tp, dp = self.layout.tp_group, self.layout.dp_group
        # The TP leader (group rank 0) writes its part; a peer tracks a subset of
        # it (TPBroadcastDataLoader's peers hold "loader": None, only the step).
        prints = [(shape_print(part["loader"]), part)]
        if tp is not None and dist.get_world_size(tp) > 1:
            prints = _gather((prints[0][0], part if dist.get_rank(tp) == 0 else None), tp)
            part = prints[0][1]  # every peer writes the leader's: DCP keeps one copy, the same
        place = self._global_place() if self.design == "reshard" else None
        # One gather over DP tells every rank about every TP group and every place:
        # a refusal raised on some ranks only would leave the others in dcp.save.
        mine = (self.layout.dp_rank, [p for p, _ in prints], place)
        views = _gather(mine, dp) if dp is not None else [mine]
        split = [(d, p) for d, p, _ in views if not all(tracks(q, p[0]) for q in p[1:])]
        if split:
            raise CheckpointStateError(
                f"TP peers of DP rank {split[0][0]} hold different loader states "
                f"(fingerprints {split[0][1]}); DCP would keep one of them. TP peers must "
                "iterate the same loader in lock-step (broadcast from the TP leader)"
            )
        out: dict[str, Any] = {"layout": self.layout_info(), self.rank_key(): part}
        saved = self._saved
        if self.process_rng and (saved is None or saved["tp_size"] == self.layout.tp_size):
            # One opaque value: which generators a process has (CUDA, numpy) may differ
            # between the saving and the loading job, and DCP wants the same keys in both.
            out[self.rng_key()] = pickle.dumps(capture_rng())
        if place is not None:
            places = [p for _, _, p in views]
            if any(p != place for p in places):
                raise CheckpointStateError(
                    f"DP ranks disagree on the global position {places}: a global "
                    "consumed_samples must be the same on every rank (save between steps)"
                )
            out["global"] = place
        return out

    def _global_place(self) -> dict[str, int]:
        state = self.loader.state_dict()
        try:
            return {
                "epoch": int(state["epoch"]),
                "consumed_samples": int(state["consumed_samples"]),
            }
        except (KeyError, TypeError) as exc:
            raise CheckpointStateError(
                f"on_new_layout='reshard' needs a loader whose state has a global 'epoch' and "
                f"'consumed_samples' (GlobalOrderLoader); got keys {sorted(state)}"
            ) from exc

    def _template(self) -> dict[str, Any]:
        # Another layout, design "reshard": the global place only (the old DP
        # ranks' own keys have no owner here and are not asked for).
        return {"layout": dict(self._saved or {}), "global": {"epoch": 0, "consumed_samples": 0}}

    # ------------------------------------------------------------ reading back
    def prepare_load(self, checkpoint_id: Any, process_group: Any = None) -> dict[str, Any]:
        """Read the saved layout (a small ``dcp.load``) and refuse what cannot resume here.

        Call it on every rank of ``process_group`` (as given to ``dcp.load``;
        default the world) before ``dcp.load`` of the whole state. Returns the
        saved layout entry.

        Raises:
            CheckpointLayoutError: Another version, or another layout under the
                ``"refuse"`` design (or a loader that cannot re-shard).
        """
        import torch.distributed.checkpoint as dcp

        probe = {self.key: {"layout": {"version": -1, "dp_size": -1, "tp_size": -1, "design": ""}}}
        dcp.load(probe, checkpoint_id=checkpoint_id, process_group=process_group)
        saved = probe[self.key]["layout"]
        self._check(saved)
        self._saved = saved
        return saved

    def _check(self, saved: dict[str, Any]) -> None:
        here = self.layout_info()
        if saved.get("version") != CHECKPOINT_VERSION:
            raise CheckpointLayoutError(
                f"the loader state was saved by checkpoint version {saved.get('version')}, "
                f"this code reads version {CHECKPOINT_VERSION}: resume with the code that saved it"
            )
        if saved == here:
            return
        diff = ", ".join(
            f"{k} {saved.get(k)} -> {here[k]}" for k in ("dp_size", "tp_size", "design")
            if saved.get(k) != here[k]
        )  # fmt: skip
        if saved.get("dp_size") == here["dp_size"] and saved.get("design") == here["design"]:
            return  # only TP changed: each DP replica still has its own saved place
        if self.design == "refuse" or saved.get("design") != "reshard":
            raise CheckpointLayoutError(
                f"the loader state was saved at dp={saved.get('dp_size')}, "
                f"tp={saved.get('tp_size')} ({saved.get('design')}); this run is "
                f"dp={here['dp_size']}, tp={here['tp_size']} ({diff}). Each of the "
                f"{saved.get('dp_size')} DP ranks saved its own place, which cannot be split "
                f"over {here['dp_size']}: resume at dp={saved.get('dp_size')}, or save with "
                "on_new_layout='reshard' and a loader with a global consumed_samples"
            )
        if not getattr(self.loader, "reshardable", False):
            raise CheckpointLayoutError(
                f"resharding dp={saved.get('dp_size')} -> {here['dp_size']}: this loader draws "
                "per-rank randomness (its 'reshardable' is not True), whose state has no owner "
                "at another DP size: seed each sample's draw by its index instead"
            )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``dcp.load`` read (called by ``dcp.load``).

        Raises:
            CheckpointLayoutError: As :meth:`prepare_load`, when it was not called
                and the layout differs (a smaller DP size loads without a DCP error).
        """
        saved = state["layout"]
        self._check(saved)
        self._saved = None
        if saved["dp_size"] != self.layout.dp_size:
            self.loader.load_state_dict(dict(state["global"]))
            return
        self.loader.load_state_dict(state[self.rank_key()]["loader"])
        blob = state.get(self.rng_key())
        if self.process_rng and isinstance(blob, bytes) and blob:
            # Our own checkpoint's bytes, written by state_dict() above.
            self.restored_rng = restore_rng(pickle.loads(blob))


def sub_layout(dp: int, tp: int = 1) -> tuple[Any, Any] | None:
    """The first ``dp * tp`` ranks as a ``dp x tp`` layout, and their group; None on the rest.

    A job resumed at fewer ranks, played inside ranks that are already running
    (a warm ``ez.Cluster``): pass the group to ``dcp.save``/``dcp.load`` as
    ``process_group``. Every rank must call it, in the same order (``new_group``
    is collective over the whole world).
    """
    from ezpz_nb.data.groups import Layout

    rank, world = dist.get_rank(), dp * tp
    tp_groups = [dist.new_group(list(range(s, s + tp))) for s in range(0, world, tp)]
    dp_groups = [dist.new_group(list(range(t, world, tp))) for t in range(tp)]
    group = dist.new_group(list(range(world)))
    if rank >= world:
        return None
    d, t = divmod(rank, tp)
    return Layout(rank, world, d, dp, t, tp, dp_groups[t], tp_groups[d]), group
