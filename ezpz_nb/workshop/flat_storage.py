"""Notebook 19's exercise: make a list-of-dicts dataset flat, same samples, workers that stay small.

The learner writes ``make_flat(rows)``: given the rows of a
:class:`~ezpz_nb.workshop.storages.DictsDataset` (``{"index": i, "tokens":
[int, ...]}``), return a dataset that yields exactly what ``DictsDataset`` yields
(``{"index", "input_ids", "labels"}``, int64, in index order) and whose forked
DataLoader workers write less than :data:`BOUND` of the data on the pages that hold
its storage over an epoch, holding the tokens in one array (or a few, and offsets). Any such
storage that reading does not write passes: one numpy array, one tensor, a
memory-mapped file, one ``bytes`` blob; one Python object per token does not, nor a
``bytes`` or a pickle per row (each row a Python object with a reference count,
its tokens on the pages the count is written to: the loader has each worker read
every sample, see :data:`.flat_epoch.ORDER`), nor an array per row, however it is
read (:mod:`.flat_held`: not one array).

What it checks, on 2 real ranks of its own, started for the check and closed after it
(never the notebook's warm ranks, where code an earlier cell left, a monkeypatch of torch's
worker loop, of the checker's modules or of ``gc``, could raise the baseline or lower
what is measured; under torchrun, the torchrun ranks), with fresh tokens drawn in the rank
from a seed no frame or global holds while the learner's code runs (so a dataset can only
be built from the rows: the checker's answers are digests); its loader and comparisons are
:mod:`.flat_epoch`, its rows :mod:`.flat_rows`:

* an epoch of the checker's own flat array, in a job that carries none of the learner's
  code (a class attribute's ``__reduce__`` runs at unpickling), then one of the learner's
  dataset, built from rows the rank alone holds; 2 forked workers each. At each epoch's
  end, its workers alive and idle, the notebook's process reads their private memory
  (:mod:`.witness`), which counts from zero at the fork, and the pages each holds alone
  (:mod:`.flat_pages`): those of them that hold what the dataset references (the pages of
  its objects and buffers, the rank's walk of it, :func:`.flat_held.holdings`) are what
  reading the learner's storage wrote, at most :data:`BOUND` of the data: a dataset that
  still reads the rows (wrapping them, converting per sample, building a private array at
  some read) writes them, ``gc.freeze()`` or not. What a library's allocator writes on
  the free room of the rank's heap as it reads (a ``datasets`` table: 4.3-4.7 MiB a
  worker, none of it its buffers' pages) is not the storage's; the private memory in all,
  less the checker's worker's (at most :data:`OWN_MOST`), is held under :data:`ALL_MOST`
  of the data (under :data:`BOUND` where the pages cannot be read: not Linux). No slot,
  frame or memory reader in the rank decides the readings, and an ask from a worker is
  refused;
* that the workers read the storage themselves (counts the witness reads in ``/proc``):
  no thread in the rank besides the loader's, no new signal handler, no process of the
  learner's (a manager of the rows), no child of a worker, alive or reaped;
* every batch the workers yield against the tokens, and every index once; then every
  sample, read in the rank, against the list of dicts' own (keys, dtype, values);
* what the dataset holds once ``make_flat`` returned and the checker let go of the rows
  (:meth:`.flat_rows.Given.kept`): no row alive, the rows' ints not referenced, under
  :data:`.flat_rows.BLOCKS_MOST` Python objects a token of what ``make_flat`` made. Reads that
  write nothing (values read from the ints' memory with ctypes, ``gc.freeze()``, a row kept
  for its index only) leave the workers' pages shared, yet the rows cost their memory and
  every worker's collector walks them: judged after the growth, so a dataset that fails
  both hears why its workers grew;
* where the dataset keeps the tokens (:func:`.flat_held.holdings`, walked in the rank after
  every read): in one or a few buffers it references, not in a buffer per row (an array,
  a ``bytes``, a ``str`` per row, read through ``ctypes`` so that nothing is written), nor
  in none it references (a reference leaked, a global of a library's module): runs of the
  rows' tokens, taken before ``make_flat`` ran, must be in its large buffers; and samples
  read in a forked copy of the rank with those buffers' tokens replaced by zeros must not
  come out right (:mod:`.flat_protect`: else they are read from memory the dataset does not
  reference).

Margins, measured offline on 2 loaded cores (fresh tokens per draw, rows of 256 tokens),
a worker's reading beyond the checker's own worker's (7.6-8.3 MiB), against the 2.0 MiB
bound: over 230 draws of the notebook's solution at most 0.86 MiB (median 0.02). Since
each worker reads every sample (:data:`.flat_epoch.ORDER`), over 14-15 draws each: the
solution 0.0-0.4 MiB, a tensor in shared memory 0.0-0.2, a memory map 0.0-0.5, an
``array.array`` 0.2-0.4, int32 widened per read 0.2-0.6, an array per row 0.0; a pickle
per row 3.4-3.7 MiB (1.7x the bound), a ``bytes`` per row 8.2-8.5, the rows kept
32.6-32.9, an array built in each worker 40.2-40.6: no verdict wrong. (Rows of 4096-8192
tokens were dropped: a right answer copying a 32-64 KiB row per read grew 2-5 MiB on some
draws, its heap's doing.)
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data._utils.signal_handling import _set_SIGCHLD_handler

from ezpz_nb.ledger.memory import MIB, read_memory
from ezpz_nb.workshop.flat_epoch import LENGTH, ORDER, WORKERS, N, Reads, batch_differs, differs
from ezpz_nb.workshop.flat_epoch import run_epoch as _epoch  # flat_job holds it (see there)
from ezpz_nb.workshop.flat_held import holdings
from ezpz_nb.workshop.flat_judge import judge_held
from ezpz_nb.workshop.flat_pages import PAGE
from ezpz_nb.workshop.flat_protect import protect_and_read
from ezpz_nb.workshop.flat_rows import digests, given_rows, judge_kept
from ezpz_nb.workshop.stops import fresh_seed, wrong
from ezpz_nb.workshop.storages import ArrayDataset, tokens
from ezpz_nb.workshop.witness import Witness, ask_witness

if TYPE_CHECKING:
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.workshop.verdicts import CheckResult

__all__ = ["ALL_MOST", "BOUND", "EXERCISE", "OWN_MOST", "check_flat", "flat_job", "own_job"]

EXERCISE = "Flat storage"
#: The most a worker may write on the pages of what the dataset references, as a share of
#: the data's bytes. Measured (issue 45's seventh brief, 4096 rows of 256 tokens, 2 loaded
#: cores): a flat array 0.04 MiB a worker, int32 in 4 chunks 0.06, a pyarrow ``large_list``
#: 0.04, a ``datasets`` table 0.17 (the objects it reads through); a pickle per row 3.4
#: (1.7x the bound), the rows kept 32.9. Where the pages cannot be read, the bound of a
#: worker's private memory in all, as before.
BOUND = 0.25
#: The most a worker's private memory in all may grow beyond the checker's own worker's, as
#: a share of the data's bytes: what reading writes outside the storage's pages (a
#: library's allocator on the rank's heap: a ``datasets`` table 4.3-4.7 MiB, 0.6 of the
#: data) is the library's, yet a worker growing by the data's size holds a copy of it.
ALL_MOST = 1.0
#: The most a worker of the checker's own flat array may reach (its loader loop, first
#: collate and puts, the pages the rank wrote since the fork): measured 7.6-8.6 MiB on 2
#: loaded cores whatever the storage (7.4-8.4 over 92 workers of 23 own epochs, warm and
#: fresh ranks, issue 45's fourth trial), so 12 MiB leaves room for the heap's moods. The
#: check's ranks are its own, so only code in them (under torchrun, where the ranks are
#: the learner's processes) raises it: a raised baseline would hide a dataset that keeps
#: the rows (~33 MiB a worker), so it is refused, not used.
OWN_MOST = 12 * MIB


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
    expect = digests(data)
    torch.ones(1 << 18).sum()  # torch's intra-op threads, as in flat_job
    _epoch(Reads(ArrayDataset(data), N), lambda b: batch_differs(expect, b, []), ask, "own")


def _private() -> int:
    """This process's private memory now (0 where it cannot be read).

    The heap's free pages are given back first (glibc's ``malloc_trim``): the rows, let go
    of, leave ~40 MiB free in the rank, which a cache filled by the reads below would reuse
    unseen; given back, what the reads keep grows the reading again.
    """
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the reading stays a lower bound
        pass
    got = read_memory(os.getpid())
    return got.private if got is not None else 0


def flat_job(make: Callable[[list[dict[str, Any]]], Any], address: str) -> dict[str, Any]:
    """On a rank: an epoch of ``make(rows)``, then every sample read in the rank.

    The notebook's witness (``address``) reads the loader's workers after its last
    batch; the dataset is built from rows no one else holds, drawn in this rank
    (:func:`.flat_rows.given_rows`): no array of the answers, nor its seed, is in a frame
    or a global here while ``make`` runs, only the rows and digests. Once ``make``
    returned, the rows are let go of and :meth:`.flat_rows.Given.kept` says what the
    dataset holds. What the workers yield is compared too, so they cannot serve other
    samples than the rank.
    """
    import torch.distributed as dist

    # Held in locals before the learner's code runs here: rebinding the module's names
    # from make_flat changes nothing below (a second ask for a label is refused).
    epoch, ask, private, judge_sample, judge_batch, walk, protect = (
        _epoch,
        ask_witness(address, dist.get_rank() if dist.is_initialized() else 0),
        _private,
        differs,
        batch_differs,
        holdings,
        protect_and_read,
    )
    ask("start")
    # torch starts its intra-op threads at its first parallel op: here, not in make_flat
    # (the witness counts the rank's threads from its ask "ready" on).
    torch.ones(1 << 18).sum()
    # The loader's SIGCHLD handler, which its first multi-worker epoch sets in the rank for
    # good: set now (as on a warm rank, where own_job ran one), not counted as the learner's.
    _set_SIGCHLD_handler()
    ask("ready")
    n, order = N, ORDER
    given = given_rows(n, LENGTH)
    held = given.kept  # bound now, as the names above
    try:
        ds = make(given.take())  # the rows in no frame of the checker's: what survives, ds holds
    finally:
        kept = held()
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
    expect = given.expect

    def compare(batch: Any) -> None:
        if not batch_why:
            why = judge_batch(expect, batch, seen)
            if why is not None:
                batch_why.append(why)

    failed: Exception | None = None
    try:
        epoch(Reads(ds, size), compare, ask, "yours")
    except Exception as exc:  # noqa: BLE001  (a wrong sample's message, below, says more)
        failed = exc
    before = private()
    for i in range(size):
        why = judge_sample(i, expect, ds[i])
        if why is not None:
            return {"bad": f"sample {i} differs: {why}"}
    # Only the wording of a verdict already wrong: the rank's own reads grew it by about the
    # data's size when the dataset builds its array at a first read (in each worker too).
    late = private() - before
    if failed is not None:
        raise failed
    if not batch_why and sorted(seen) != sorted(order):
        batch_why.append("an epoch did not read every index twice, as the loader asked")
    if batch_why:
        return {"bad": f"the workers' batches differ from the rank's samples: {batch_why[0]}"}
    # Walked last, once every read is done: nothing it touches is on a worker's pages. Then
    # samples read in a forked copy with the tokens the walk found replaced by zero pages.
    found = walk(ds, n * LENGTH, given.runs)
    spans, at, unprotected = found.pop("spans"), found.pop("at"), found.pop("unprotected")
    read = protect(
        ds, spans, unprotected, lambda i, got: judge_sample(i, expect, got) is None, at=at
    )
    return {"late": late, **kept, "held": found, "protect": read}


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
                f"can ({OWN_MOST / MIB:.0f} MiB). Code of yours ran in these ranks before the "
                "check (under torchrun they are your processes): start them anew and check "
                "a dataset that holds the tokens in one array and leaves the checker's alone."
            )
        out[rank] = {pid: max(0, m.private - base) for pid, m in yours.items()}
    return out


def _on_storage(witness: Witness, outs: list[dict[str, Any]], rank: int) -> dict[int, int | None]:
    """``{worker pid: bytes}`` of what each of ``rank``'s workers wrote on the pages of what
    its dataset references (the rank's walk of it), or ``None`` where they cannot be read."""
    held = outs[rank].get("held")
    pages = held.get("pages") if isinstance(held, dict) else None
    mine = None if pages is None else set(pages)
    return {
        pid: None if mine is None or got is None else len(mine.intersection(got)) * PAGE
        for pid, got in witness.pages(rank, "yours").items()
    }


def _measured(
    make_flat: Callable[..., Any], seed: int, timeout: float
) -> tuple[Witness, Witness, list[Any]]:
    """Both epochs, on 2 ranks started for them and closed after (under torchrun, in place):
    the witness of the checker's own, the witness of the learner's, and the ranks' replies.

    Not the notebook's warm ranks: code of the learner's that ran there in an earlier cell
    (a monkeypatch of torch's worker loop, of this package's modules, of ``gc``) would be
    there still, and could raise the baseline or lower what is measured.
    """
    # Here, not at the top: a rank imports this module (see stops.py).
    from ezpz_nb.launcher import Cluster
    from ezpz_nb.launcher.torchrun import in_torchrun_env
    from ezpz_nb.workshop.verdicts import run_job, run_learner

    ranks = nullcontext(None) if in_torchrun_env() else Cluster(world_size=2, timeout=timeout)
    with ranks as private:
        # Two witnesses in this process (the learner's code never runs here): the checker's
        # own epoch first, in a job that carries none of the learner's code, then theirs.
        with Witness({"own": WORKERS}) as own:
            run_job(own_job, seed, own.address, world_size=2, timeout=timeout, cluster=private)
        with Witness({"ready": 0, "built": 0, "yours": WORKERS}) as witness:
            got = run_learner(
                flat_job, make_flat, witness.address,
                world_size=2, timeout=timeout, cluster=private,
            )  # fmt: skip
    return own, witness, got


def check_flat(
    make_flat: Callable[[list[dict[str, Any]]], Any],
    *,
    cluster: Cluster | None = None,
    timeout: float = 90.0,
) -> CheckResult:
    """Notebook 19's exercise: same samples as the list of dicts, workers that do not grow.

    Args:
        make_flat: The learner's function (or class) from the rows to a dataset.
        cluster: Taken as every checker takes one, and not used: the check runs on 2
            ranks of its own, which no earlier cell reached (see the module); under
            torchrun, on the torchrun ranks.
        timeout: Seconds for the run (building, comparing, one epoch).
    """
    # Here, not at the top: a rank imports this module (see stops.py).
    from ezpz_nb.launcher.torchrun import in_torchrun_env
    from ezpz_nb.workshop.verdicts import judge

    def body() -> str:
        if not callable(make_flat):  # an instance: FlatTokens(rows) instead of FlatTokens
            name = type(make_flat).__name__
            raise wrong(
                f"got an instance of {name}: pass the class itself, check_flat({name}), not "
                f"an instance (check_flat({name}(rows))); the checker builds it from rows of "
                "its own."
            )
        seed, n, length = fresh_seed(), N, LENGTH
        own, witness, got = _measured(make_flat, seed, timeout)
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
        wrote = {rank: _on_storage(witness, outs, rank) for rank in ranks}
        worst_on = 0
        for rank, grown in growth.items():
            for worker, pid in enumerate(sorted(grown)):
                grew, on = grown[pid], wrote[rank].get(pid)
                worst_on = max(worst_on, on or 0)
                if on is None:  # the pages cannot be read: the bound on the growth in all
                    over = grew >= bound
                    where = f"the bound is {bound / MIB:.1f} MiB, {BOUND:.0%} of the data"
                else:
                    over = on >= bound or grew >= ALL_MOST * data
                    where = (
                        f"{on / MIB:.1f} MiB of it on the pages that hold your dataset's "
                        f"storage, copied as the worker wrote them; the bounds are "
                        f"{bound / MIB:.1f} MiB on those pages, {BOUND:.0%} of the data, and "
                        f"{ALL_MOST * data / MIB:.1f} MiB in all"
                    )
                if over:
                    said = (
                        f"rank {rank}'s worker {worker} grew by {grew / MIB:.1f} MiB over an "
                        f"epoch more than a worker reading one flat array ({where})"
                    )
                    if outs[rank].get("late", 0) >= data / 2:
                        raise wrong(
                            f"{said}: your dataset grows as it reads (the rank's own reads "
                            f"grew it by {outs[rank]['late'] / MIB:.1f} MiB, about the data's "
                            "size): an array built at a first read, or values kept as they are "
                            "read (a cache), is built again in each worker, in its own memory. "
                            "Build the array in make_flat (before the workers fork) and read "
                            "from it, keeping nothing per read."
                        )
                    raise wrong(
                        f"{said}: its samples are still read from Python objects, whose "
                        "reference counts the worker writes. Hold the tokens in one array."
                    )
        judge_kept(outs, n * length)
        unjudged = judge_held(outs, n, n * length)
        unjudged = f" {unjudged}" if unjudged else ""
        worst = max(g for grown in growth.values() for g in grown.values())
        readable = all(on is not None for got in wrote.values() for on in got.values())
        if not readable:
            return (
                f"Same {n} samples, and no worker grew by more than {worst / MIB:.1f} MiB over "
                f"an epoch beyond a flat array's worker (bound {bound / MIB:.1f} MiB): nothing "
                f"in your storage is written by reading.{unjudged}"
            )
        return (
            f"Same {n} samples, and no worker wrote more than {worst_on / MIB:.2f} MiB of the "
            f"pages that hold your storage over an epoch (bound {bound / MIB:.1f} MiB): "
            f"nothing in your storage is written by reading.{unjudged}"
        )

    return judge(EXERCISE, body)
