"""Notebook 19's exercise: make a list-of-dicts dataset flat, same samples, workers that stay small.

The learner writes ``make_flat(rows)``: given the rows of a
:class:`~ezpz_nb.workshop.storages.DictsDataset` (``{"index": i, "tokens":
[int, ...]}``), return a dataset that yields exactly what ``DictsDataset`` yields
(``{"index", "input_ids", "labels"}``, int64, in index order) and whose forked
DataLoader workers' private memory grows by less than :data:`BOUND` of the data
over an epoch. Any storage that reading does not write passes: one numpy array,
one tensor, a memory-mapped file, one ``bytes`` blob, an array per row (its
tokens apart from its header); one Python object per token does not, nor a
``bytes`` or a pickle per row (each row a Python object with a reference count,
its tokens on the pages the count is written to: the loader has each worker read
every sample, see :data:`ORDER`).

What it checks, on 2 real ranks with fresh tokens (a new seed each check):

* first, an epoch of the checker's own flat array, in a job of its own that carries
  none of the learner's code (a class attribute's ``__reduce__`` runs at unpickling,
  before the job that receives it starts), then, in a second job, one of the learner's
  dataset (built from rows the rank alone holds, before anything read them),
  each with 2 forked workers; at each epoch's end, its workers alive and idle,
  the notebook's process reads their private memory (:mod:`.witness`). A forked
  worker's private memory counts from zero (every page is shared with the rank
  until written), so a learner's worker's reading, less the checker's worker's,
  is what reading the learner's storage wrote (the checker's worker's counted at most
  :data:`OWN_MOST`: above it, code of the learner's left in warm ranks changed the
  checker's epoch, and the verdict says so): a dataset that still reads the rows
  (wrapping them, converting per sample, building a private array at some read, in
  the rank or in each worker) grows, and ``gc.freeze()`` does not stop it. The
  readings are taken where the learner's code never runs: no slot, frame or memory
  reader in the rank decides them, and an ask from another process than the rank
  (a worker) is refused;
* that the workers read the storage themselves, from counts the witness reads in
  ``/proc``: no thread in the rank besides the loader's (one serving the rows), no
  new signal handler there, no process of the learner's (a manager of the rows), no
  child of a worker, alive or reaped (a throwaway child per read takes its writes
  with it; reaped, its page faults add to the worker's);
* every batch the workers yield against the tokens, and every index once;
* then every sample, all of them, read in the rank, against the list of dicts'
  own (keys, dtype, values): a dataset right on the first few samples only, or
  in another order, or of another length, is wrong.

The loader's settings (workers, start method, batch size, order) are the checker's: the learner changes the storage, not the measurement.

Margins, measured offline on 2 loaded cores (a warm 2-rank cluster, fresh tokens per
draw; rows of 256 tokens then): over 230 draws of the notebook's solution, a worker's
reading beyond the checker's own worker's was at most 0.86 MiB (median 0.02 MiB)
against the 2.0 MiB bound, the own worker's 7.6-8.3 MiB; the other right answers of the
tests and the outside trial (tensor, bytes, memory map, int32 widened per read, an array
per row) 0-0.2 MiB; every dodge keeping the rows 16.6-17.5 MiB, 8x the bound. A pickled
``bytes`` per row wrote the pages of every row a worker read, 1.6-2.4 MiB: either side
of the bound by draw (issue 45, third trial). Since each worker reads every sample
(:data:`ORDER`), over 14-15 draws each (time allowed no more; a full check is ~5 s
here): the solution 0.0-0.4 MiB, a tensor in shared memory 0.0-0.2, a memory map
0.0-0.5, an ``array.array`` 0.2-0.4, int32 widened per read 0.2-0.6, an array per row
0.0; a pickle per row 3.4-3.7 MiB (1.7x the bound), a ``bytes`` per row 8.2-8.5, the
rows kept 32.6-32.9, an array built in each worker 40.2-40.6: no verdict wrong. (Rows
of 4096-8192 tokens, to make an object per row write one page per row, were tried and
dropped: a right answer copying a 32-64 KiB row per read then grew 2-5 MiB on some
draws, its heap's doing.)
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data._utils.signal_handling import _set_SIGCHLD_handler

from ezpz_nb.ledger.memory import MIB, read_memory
from ezpz_nb.workshop.stops import fresh_seed, wrong
from ezpz_nb.workshop.storages import ArrayDataset, DictsDataset, tokens
from ezpz_nb.workshop.witness import Witness, ask_witness

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["BOUND", "EXERCISE", "OWN_MOST", "check_flat", "flat_job", "own_job"]

EXERCISE = "Flat storage"
#: Largest growth of a worker's private memory, as a share of the data's bytes.
BOUND = 0.25
#: The data: samples x tokens (8 MiB of int64 tokens, 16 MiB of Python ints and more).
N, LENGTH = 4096, 256
#: The most a worker of the checker's own flat array may reach (its loader loop, first
#: collate and puts, the pages the rank wrote since the fork): measured 7.6-8.6 MiB on 2
#: loaded cores whatever the storage (7.4-8.4 over 92 workers of 23 own epochs, warm and
#: fresh ranks, issue 45's fourth trial), so 12 MiB leaves room for the heap's moods. A
#: baseline above it was raised by code in the ranks (a learner's class from an earlier
#: check on a warm cluster, patching the checker's dataset): it would hide a dataset
#: that keeps the rows (~33 MiB a worker), so it is refused, not used.
OWN_MOST = 12 * MIB
#: The loader's workers (forked), and its batch size (a divisor of N).
WORKERS, BATCH = 2, 64
#: The loader's order: every sample twice, the second pass a batch on, so that each of the
#: 2 workers (batches go to them in turn) reads every sample: a storage written by reading
#: (Python objects, a ``bytes`` or a pickle per row) is then written all over in each.
ORDER = (*range(N), *range(BATCH, N), *range(BATCH))


class _Reads(Dataset):
    """A dataset as the checker's loader sees it: the checker's length, each read passed on.

    So the loader, in the rank, calls none of the learner's code during the epoch (its
    ``__len__`` is asked before, once); the workers call its ``__getitem__``.
    """

    def __init__(self, ds: Any, size: int) -> None:
        self.ds, self.size = ds, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Any:
        return self.ds[i]


def _differs(want: dict[str, Any], got: Any) -> str | None:
    """How ``got`` differs from the list of dicts' sample ``want``, or None."""
    if not isinstance(got, dict):
        return f"a {type(got).__name__}, not a dict"
    if set(got) != set(want):
        return f"keys {sorted(got)}, not {sorted(want)}"
    for key, value in want.items():
        if key == "index":
            if int(got[key]) != value:
                return f"index {got[key]!r}"
            continue
        other = got[key]
        if not torch.is_tensor(other):
            return f"{key!r} is a {type(other).__name__}, not a tensor"
        if other.dtype != value.dtype or other.shape != value.shape:
            return f"{key!r} is {other.dtype} {tuple(other.shape)}, not {value.dtype} {tuple(value.shape)}"
        if not torch.equal(other, value):
            return f"{key!r} holds other tokens"
    return None


def _batch_differs(data: np.ndarray, batch: Any, seen: list[int]) -> str | None:
    """How a loader batch differs from the rows of ``data`` it names, or None; notes its indices."""
    if not isinstance(batch, dict) or set(batch) != {"index", "input_ids", "labels"}:
        return "a batch without the keys index, input_ids, labels"
    index = torch.as_tensor(batch["index"]).reshape(-1).tolist()
    if any(not 0 <= int(i) < len(data) for i in index):
        return "an index out of range"
    seen.extend(int(i) for i in index)
    rows = torch.from_numpy(data[[int(i) for i in index]])
    for key, want in (("input_ids", rows[:, :-1]), ("labels", rows[:, 1:])):
        got = batch[key]
        if not torch.is_tensor(got) or got.dtype != want.dtype or not torch.equal(got, want):
            return f"{key!r} holds other tokens"
    return None


def _epoch(
    ds: _Reads,
    compare: Callable[[Any], object],
    ask: Callable[[str], None],
    label: str,
    *,
    _loader: type[DataLoader] = DataLoader,
    _collect: Callable[[], int] = gc.collect,
    _order: tuple[int, ...] = ORDER,
) -> None:
    """One epoch of ``ds`` through the checker's loader; the witness reads its workers at the end.

    The last batch in, every worker has read all it will and waits, alive, for the
    loader's next index: the witness reads them then (``ask``), before they exit. The
    loader, the collector and the order are bound here, at import, not looked up after the
    learner's code ran in the rank (and :func:`flat_job` holds this function likewise).
    """
    _collect()  # every loader's workers fork from a rank collected alike
    loader = _loader(
        ds,
        batch_size=BATCH,
        sampler=_order,
        num_workers=WORKERS,
        multiprocessing_context="fork",
        prefetch_factor=2,
    )
    batches = iter(loader)
    for _ in range(len(_order) // BATCH):
        compare(next(batches))
    ask(label)
    for batch in batches:  # none left: the loop's end shuts the workers down
        compare(batch)


def own_job(seed: int, address: str) -> None:
    """On a rank: an epoch of the checker's own flat array, the witness reading its workers.

    A job of its own, sent before :func:`flat_job`: the learner's function is not among
    its arguments, so none of the learner's code (a class attribute's ``__reduce__`` runs
    when the rank unpickles the class) has run in these ranks when this baseline is taken,
    unless an earlier check left it in a warm cluster (:data:`OWN_MOST` catches that).
    """
    import torch.distributed as dist

    ask = ask_witness(address, dist.get_rank() if dist.is_initialized() else 0)
    ask("start")
    data = tokens(N, LENGTH, seed)
    torch.ones(1 << 18).sum()  # torch's intra-op threads, as in flat_job
    _epoch(_Reads(ArrayDataset(data), N), lambda b: _batch_differs(data, b, []), ask, "own")


def _private() -> int:
    """This process's private memory now (0 where it cannot be read)."""
    got = read_memory(os.getpid())
    return got.private if got is not None else 0


def flat_job(
    make: Callable[[list[dict[str, Any]]], Any], seed: int, address: str
) -> dict[str, Any]:
    """On a rank: an epoch of ``make(rows)``, then every sample read in the rank.

    The notebook's witness (``address``) reads the loader's workers after its last
    batch; the dataset is built from rows no one else holds. What the workers yield is
    compared too, so they cannot serve other samples than the rank.
    """
    import torch.distributed as dist

    # Held in locals before the learner's code runs here: rebinding the module's names
    # from make_flat changes nothing below (a second ask for a label is refused).
    epoch, ask, private = (
        _epoch,
        ask_witness(address, dist.get_rank() if dist.is_initialized() else 0),
        _private,
    )
    ask("start")
    n, length = N, LENGTH
    data = tokens(n, length, seed)
    # torch starts its intra-op threads at its first parallel op: here, not in make_flat
    # (the witness counts the rank's threads from its ask "ready" on).
    torch.ones(1 << 18).sum()
    # The loader's SIGCHLD handler, which its first multi-worker epoch sets in the rank for
    # good: set now (as on a warm rank, where own_job ran one), not counted as the learner's.
    _set_SIGCHLD_handler()
    ask("ready")
    ds = make(DictsDataset(data).rows)  # no one else holds these rows
    if ds is None:
        return {"none": True}
    try:
        size = len(ds)
    except TypeError:
        return {"bad": "it has no len(): a map-style dataset needs __len__"}
    if size != n:
        return {"bad": f"it has {size} samples, the list of dicts {n}"}
    ask("built")  # the rank's threads and children now: make_flat's, if any
    seen: list[int] = []
    batch_why: list[str] = []

    def compare(batch: Any) -> None:
        if not batch_why:
            why = _batch_differs(data, batch, seen)
            if why is not None:
                batch_why.append(why)

    failed: Exception | None = None
    try:
        epoch(_Reads(ds, size), compare, ask, "yours")
    except Exception as exc:  # noqa: BLE001  (a wrong sample's message, below, says more)
        failed = exc
    want = DictsDataset(data)
    before = private()
    for i in range(size):
        why = _differs(want[i], ds[i])
        if why is not None:
            return {"bad": f"sample {i} differs: {why}"}
    # Only the wording of a verdict already wrong: the rank's own reads grew it by about the
    # data's size when the dataset builds its array at a first read (in each worker too).
    late = private() - before
    if failed is not None:
        raise failed
    if not batch_why and sorted(seen) != sorted(ORDER):
        batch_why.append("an epoch did not read every index twice, as the loader asked")
    if batch_why:
        return {"bad": f"the workers' batches differ from the rank's samples: {batch_why[0]}"}
    return {"data": n * length * 8, "late": late}


def _growth(own: Witness, witness: Witness, ranks: list[int]) -> dict[int, dict[int, int]]:
    """Each rank's learner-loader workers' private memory beyond the checker's own workers'.

    Read in the notebook's process, from fork to the epoch's end (a forked worker's
    private memory starts at zero: every page is shared with the rank until written),
    less the most a worker of the checker's flat array reached on that rank, in its own
    job (:func:`own_job`), at most :data:`OWN_MOST`.
    """
    out: dict[int, dict[int, int]] = {}
    for rank in ranks:
        mine, yours = own.readings(rank, "own"), witness.readings(rank, "yours")
        if len(mine) < WORKERS or len(yours) < WORKERS:
            raise wrong(
                f"rank {rank}'s loader workers could not be read from the notebook "
                f"({len(mine)} of the checker's, {len(yours)} of yours; {WORKERS} each): the "
                "loader and its measurement are the checker's; your dataset holds the tokens."
            )
        base = max(m.private for m in mine.values())
        if base > OWN_MOST:
            raise wrong(
                f"the checker's own epoch was disturbed: on rank {rank} a worker reading the "
                f"checker's flat array grew by {base / MIB:.1f} MiB, more than such a worker "
                f"can ({OWN_MOST / MIB:.0f} MiB). Code from an earlier check still runs in "
                "these ranks: run the check on fresh ranks (without cluster=), with a "
                "dataset that holds the tokens in one array and leaves the checker's alone."
            )
        out[rank] = {pid: max(0, m.private - base) for pid, m in yours.items()}
    return out


def check_flat(
    make_flat: Callable[[list[dict[str, Any]]], Any],
    *,
    cluster: Cluster | None = None,
    timeout: float = 90.0,
) -> CheckResult:
    """Notebook 19's exercise: same samples as the list of dicts, workers that do not grow.

    Args:
        make_flat: The learner's function (or class) from the rows to a dataset.
        cluster: A warm 2-rank :class:`~ezpz_nb.Cluster`; fresh ranks when None.
        timeout: Seconds for the run (building, comparing, one epoch).
    """
    # Here, not at the top: a rank imports this module for flat_job (see stops.py).
    from ezpz_nb.launcher.torchrun import in_torchrun_env
    from ezpz_nb.workshop.verdicts import judge, run_job, run_learner

    def body() -> str:
        if not callable(make_flat):  # an instance: FlatTokens(rows) instead of FlatTokens
            name = type(make_flat).__name__
            raise wrong(
                f"got an instance of {name}: pass the class itself, check_flat({name}), not "
                f"an instance (check_flat({name}(rows))); the checker builds it from rows of "
                "its own."
            )
        seed, n, length = fresh_seed(), N, LENGTH
        # Two witnesses in this process (the learner's code never runs here): the checker's
        # own epoch first, in a job that carries none of the learner's code, then theirs.
        with Witness({"own": WORKERS}) as own:
            run_job(own_job, seed, own.address, world_size=2, timeout=timeout, cluster=cluster)
        asks = {"ready": 0, "built": 0, "yours": WORKERS}
        with Witness(asks) as witness:
            got = run_learner(
                flat_job, make_flat, seed, witness.address,
                world_size=2, timeout=timeout, cluster=cluster,
            )  # fmt: skip
        outs = [out if isinstance(out, dict) else {} for out in got]
        for rank, out in enumerate(outs):  # every rank: each builds its own dataset
            if out.get("none"):
                raise wrong(
                    f"make_flat returned None on rank {rank}: return the dataset you built."
                )
        for rank, out in enumerate(outs):
            if "bad" in out:
                raise wrong(
                    f"On rank {rank}, {out['bad']}. It must yield what the list of dicts yields."
                )
        faults = own.faults + witness.faults
        if faults:
            raise wrong(
                f"{faults[0]}. The loader, its workers and the measurement are the "
                "checker's: your dataset holds the tokens in one array, and each worker reads "
                "them itself, from the memory it shares with the rank, nothing more."
            )
        data = n * length * 8
        bound = BOUND * data
        # Under torchrun every process is a rank and its own notebook: it reads its own rank.
        ranks = [int(os.environ["RANK"])] if in_torchrun_env() else list(range(len(outs)))
        growth = _growth(own, witness, ranks)
        for rank, grown in growth.items():
            for worker, grew in enumerate(grown[pid] for pid in sorted(grown)):
                if grew >= bound:
                    said = (
                        f"rank {rank}'s worker {worker} grew by {grew / MIB:.1f} MiB over an "
                        "epoch more than a worker reading one flat array (the bound is "
                        f"{bound / MIB:.1f} MiB, {BOUND:.0%} of the data)"
                    )
                    if outs[rank].get("late", 0) >= data / 2:
                        raise wrong(
                            f"{said}: your dataset builds its array at a first read (the "
                            f"rank's own reads grew it by {outs[rank]['late'] / MIB:.1f} MiB, "
                            "about the data's size), so each worker builds its own, from the "
                            "rows' Python objects. Build the array in make_flat (before the "
                            "workers fork), not in each worker."
                        )
                    raise wrong(
                        f"{said}: its samples are still read from Python objects, whose "
                        "reference counts the worker writes. Hold the tokens in one array."
                    )
        worst = max(g for grown in growth.values() for g in grown.values())
        return (
            f"Same {n} samples, and no worker grew by more than {worst / MIB:.1f} MiB over an "
            f"epoch beyond a flat array's worker (bound {bound / MIB:.1f} MiB): nothing in "
            "your storage is written by reading."
        )

    return judge(EXERCISE, body)
