"""Memory of ranks and DataLoader workers in the ledger, and ``/dev/shm`` predicted and measured.

Memory figures are counts of pages, not clocks: bounds here come from the data's size.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

import ezpz_nb as ez
from ezpz_nb.cli.probes import check_shm
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.ledger.memory import (
    MIB,
    MemorySample,
    MemorySampler,
    ProcMemory,
    _from_rollup,
    read_memory,
    summarise,
)
from ezpz_nb.shm import PAGE, paged, plan_shm, predict_peak
from ezpz_nb.workshop.shm_fill import ShmConfig, last_error_line, namespace_refusal, small_shm
from ezpz_nb.workshop.storages import measure_workers

ROLLUP = """55d-7ff ---p 00000000 00:00 0      [rollup]
Rss:              228524 kB
Pss:              227024 kB
Shared_Clean:       1712 kB
Shared_Dirty:          8 kB
Private_Clean:     78680 kB
Private_Dirty:    148132 kB
Swap:                 12 kB
"""


def test_rollup_fields_are_summed_as_documented():
    """Guards: private is dirty + swap (not USS, which counts clean file pages a reader
    alone maps: a memory map read by one worker would look like growth)."""
    m = _from_rollup(ROLLUP)
    assert m == ProcMemory(
        rss=228524 * 1024,
        pss=227024 * 1024,
        uss=(78680 + 148132) * 1024,
        private=(148132 + 12) * 1024,
        shared=(1712 + 8) * 1024,
    )


def test_read_memory_of_this_process_and_of_none():
    mine = read_memory()
    assert mine is not None and mine.private > 0 and mine.rss >= mine.private
    assert read_memory(2**22 + 12345) is None  # no such pid: None, not an error


def test_sampler_spends_its_budget_then_waits():
    """Guards: the first reading is always due (the start of a worker's growth), and after
    it a tiny budget keeps the next one from being due: the cost stays bounded."""
    tiny = MemorySampler(budget=1e-9)
    assert tiny.due()  # the first reading is always due
    got = tiny.sample(0, 0, 0, [])
    assert [s.worker for s in got] == [-1] and tiny.readings == 1
    assert not tiny.due()
    with pytest.raises(ValueError, match="share of time"):
        MemorySampler(budget=0)


def test_a_budget_of_one_reads_at_every_step_however_long_a_reading_takes():
    """Guards: memory=1.0 is a count (every step), not a cost: a reading slowed by a loaded
    machine (here one of 200 processes after one of 1) must not make the next step's
    reading skipped, or which steps a figure shows would depend on the load."""
    every = MemorySampler(budget=1.0)
    every.sample(0, 0, 0, [])
    every.sample(0, 0, 1, [(w, os.getpid()) for w in range(200)])
    assert every.due()
    with pytest.raises(ValueError, match="share of time"):
        MemorySampler(budget=0)


@pytest.mark.parametrize(
    ("memory", "error"), [("yes", TypeError), (-1, ValueError), (1.5, ValueError)]
)
def test_record_says_what_memory_takes(memory, error):
    """Guards: record(..., memory="yes") names what memory= takes (True, False or a fraction
    in [0, 1], 1.0 for every step), not float()'s "could not convert string to float"."""
    with pytest.raises(error) as err:
        record([{"index": 0}], memory=memory, publish=False)
    assert "memory= takes True" in str(err.value) and "memory=1.0 reads at every step" in str(
        err.value
    )
    assert record([{"index": 0}], memory=1.0, publish=False).memory_sampler is not None
    assert record([{"index": 0}], memory=0, publish=False).memory_sampler is None


def _s(worker: int, pid: int, step: int, private_mib: int, epoch: int = 0) -> MemorySample:
    mem = ProcMemory(0, 0, 0, private_mib * MIB, 0)
    return MemorySample(0, worker, pid, epoch, step, mem)


def test_summary_per_process_start_peak_end():
    """Guards: a worker of a new epoch (new pid) is its own line, and growth is end - start
    while peak is the largest sample (they differ when memory is given back)."""
    samples = [_s(0, 10, 0, 5), _s(0, 10, 1, 40), _s(0, 10, 2, 30), _s(0, 11, 0, 7, epoch=1)]
    got = summarise(reversed(samples))
    assert [(g.pid, g.start // MIB, g.peak // MIB, g.end // MIB) for g in got] == [
        (10, 5, 40, 30),
        (11, 7, 7, 7),
    ]
    assert got[0].growth == 25 * MIB and got[0].name == "rank 0 worker 0"
    led = Ledger.from_results([Ledger([], memory=samples[:2]), Ledger([], memory=samples[2:])])
    assert len(led.memory) == 4 and "worker 0" in str(led.memory_report())
    assert "record(..., memory=True)" in str(Ledger().memory_report())


def test_a_workers_growth_counts_from_its_first_batch():
    """Guards (stop 58's CI): worker 1 read at step 0, before it made a batch, is still
    starting up (a forked worker writes a few MiB of its parent's pages while it starts): its
    growth counts from its reading at step 1, after its first batch; readings are due at
    every step before the last worker's first batch, whatever the budget."""
    samples = [_s(0, 10, 0, 7), _s(1, 11, 0, 2), _s(1, 11, 1, 7), _s(1, 11, 5, 8)]
    samples += [_s(1, 12, 0, 2, epoch=1), _s(1, 12, 1, 7, epoch=1), _s(1, 12, 2, 8, epoch=1)]
    got = {(g.worker, g.epoch): g for g in summarise(samples)}
    assert got[1, 0].start == 7 * MIB and got[1, 0].growth == MIB and got[1, 0].samples == 2
    assert got[1, 1].growth == MIB  # a new worker of epoch 1 starts at its step 1 too
    assert got[0, 0].samples == 1 and got[0, 0].growth == 0
    lone = summarise([_s(1, 13, 0, 3)])  # read only before its first batch: that reading
    assert lone[0].start == 3 * MIB and lone[0].samples == 1
    tiny = MemorySampler(budget=1e-9)
    tiny.sample(0, 0, 0, [])
    assert tiny.due(1, workers=2) and not tiny.due(2, workers=2)


class _SlowStart(torch.utils.data.Dataset):
    """Worker 1 takes its time over its first sample, then writes 8 MiB it keeps: start-up
    work a reading at step 0 (worker 0's batch) falls before."""

    kept: list[bytearray] = []

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> dict[str, torch.Tensor | int]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1 and not self.kept:
            time.sleep(0.5)
            self.kept.append(bytearray(os.urandom(8 * MIB)))
        return {"index": i, "input_ids": torch.zeros(8, dtype=torch.int64)}


@pytest.mark.system
def test_a_slow_starting_worker_is_not_said_to_grow(short_tmp):
    """Guards: a worker whose start-up outlasts the first batch of another (a busy machine)
    is not charged its start-up: growth under 2 MiB where start-up wrote 8 MiB."""
    got = measure_workers(_SlowStart(), n=256, length=8, folder=short_tmp, batch_size=8)
    growth = {g.worker: g for g in got.ledger.memory_report().growth}
    assert growth[1].peak >= growth[1].start and growth[1].growth < 2 * MIB, growth[1]


def test_shm_prediction_counts_pages_and_the_held_batch():
    assert paged([1, PAGE, PAGE + 1]) == 4 * PAGE
    assert predict_peak(8 * MIB, workers=2, prefetch_factor=2, ranks=2) == 80 * MIB
    assert predict_peak(8 * MIB, workers=0) == 0  # batches made in the rank: no shm
    missing = plan_shm(MIB, workers=1, path="/no/such/shm")
    assert missing.fits is None and "nothing to compare" in str(missing)


@pytest.mark.parametrize("call", [predict_peak, plan_shm])
def test_a_batch_under_one_page_is_refused_saying_the_unit(call):
    """Guards: predict_peak(8, ...) (MiB passed for bytes) is refused, saying bytes not MiB,
    instead of a peak of 80 bytes that "fits" anywhere; plan_shm goes through it too."""
    with pytest.raises(ValueError, match=r"less than one page .* in bytes, not MiB. For 8 MiB"):
        call(8, workers=2, ranks=2)
    assert predict_peak(PAGE, workers=1) == 3 * PAGE


def test_shm_config_refuses_an_unknown_sharing_strategy_where_it_is_made():
    """Guards: ShmConfig(sharing="filesystem") fails in the notebook, naming the strategies,
    before any namespace or rank starts (not as torch's assert cut off inside its output)."""
    with pytest.raises(ValueError) as err:
        ShmConfig("x", sharing="filesystem")
    assert "'file_descriptor' or 'file_system'" in str(err.value)
    assert ShmConfig("x", sharing="file_system").sharing == "file_system"


class _FailsInWorker(torch.utils.data.Dataset):
    def __len__(self):
        return 2

    def __getitem__(self, i):
        raise RuntimeError("unable to allocate shared memory(shm) for file")


def test_a_workers_failure_is_told_with_its_type_once():
    """Guards: a worker's RuntimeError relayed by the DataLoader (its text ends with the
    worker's own "RuntimeError: ..." line) is one "RuntimeError: unable to allocate..."
    line, not "RuntimeError: RuntimeError: ...", in shm_run's error (notebook 19's output)."""
    loader = torch.utils.data.DataLoader(
        _FailsInWorker(), num_workers=1, multiprocessing_context="fork"
    )
    it = iter(loader)
    try:
        with pytest.raises(RuntimeError) as err:
            next(it)
    finally:
        # The traceback keeps the iterator, and with it its worker, alive until a garbage
        # collection: a later test's "no process outlives it" found that worker.
        it._shutdown_workers()
    line = last_error_line(err.value)
    assert line == "RuntimeError: unable to allocate shared memory(shm) for file", line
    assert last_error_line(ValueError("plain")) == "ValueError: plain"


def test_doctor_warns_when_the_loader_does_not_fit():
    """Guards: a loader too big for /dev/shm is a warning with what to do, not a pass."""
    assert check_shm().ok is True
    huge = check_shm(batch_mib=10**7)
    assert huge.ok is None and "does NOT fit" in huge.detail and "--shm-size" in huge.fix
    assert check_shm(path="/no/such/shm").ok is True  # macOS: the prediction only


def test_ranks_record_their_workers_memory(short_tmp):
    """Guards: record(memory=True) on real ranks samples the rank and each of its workers
    (worker ids 0 and 1, pids other than the rank's), and the ledger keeps them per rank."""
    got = ez.launch(
        measure_workers,
        "numpy",
        world_size=2,
        timeout=120,
        n=512,
        length=64,
        folder=short_tmp,
        workers=2,
        batch_size=32,
    )
    led = Ledger.from_results([m.ledger for m in got])
    names = {g.name for g in led.memory_report().growth}
    assert names == {f"rank {r}" + w for r in (0, 1) for w in ("", " worker 0", " worker 1")}
    for m in got:
        pids = {s.pid for s in m.ledger.memory}
        assert len(pids) == 3 and m.steps == 16 and m.data == 512 * 64 * 8


@pytest.mark.system
def test_fork_copies_python_objects_but_not_arrays(short_tmp):
    """Guards the done-when of issue 49 at the benchmark's size (32 MiB of tokens): with
    fork, each list-of-dicts worker grows by at least half the data; numpy and memory-map
    workers by less than 5% of it."""
    n, length = 16384, 256
    data = n * length * 8
    for storage, low, high in (("dicts", 0.5, None), ("numpy", None, 0.05), ("memmap", None, 0.05)):
        got = ez.launch(
            measure_workers,
            storage,
            world_size=2,
            timeout=300,
            n=n,
            length=length,
            folder=short_tmp,
            workers=2,
        )
        growth = [g.growth for m in got for g in m.ledger.memory_report().growth if g.worker >= 0]
        assert len(growth) == 4, storage
        if low is not None:
            assert min(growth) >= low * data, (storage, [g / MIB for g in growth])
        if high is not None:
            assert max(growth) < high * data, (storage, [g / MIB for g in growth])


@pytest.mark.system
@pytest.mark.skipif(namespace_refusal() is not None, reason=str(namespace_refusal()))
def test_small_shm_fails_and_the_fixes_fit_as_predicted():
    """Guards: in a private mount namespace with a 64 MiB /dev/shm (nothing mounted outside),
    a loader predicted at 80 MiB fails in its workers; fewer prefetched batches or fewer
    workers fit; file_system sharing does not help (same bytes); a 256 MiB /dev/shm fits.
    The peak is polled from /dev/shm during each run, and the doctor's prediction is within
    10% of every peak that fit."""
    mounts = open("/proc/self/mounts").read()
    default, prefetch1, one_worker, file_system, larger = small_shm(
        [
            ShmConfig("default"),
            ShmConfig("prefetch 1", prefetch_factor=1),
            ShmConfig("1 worker", workers=1),
            ShmConfig("file_system", sharing="file_system"),
            ShmConfig("larger shm", shm_mib=256),
        ]
    )
    assert open("/proc/self/mounts").read() == mounts  # nothing left mounted here
    assert default.size == 64 * MIB and larger.size == 256 * MIB
    for failed in (default, file_system):
        assert not failed.ok
        assert any("No space left on device" in e or "Bus error" in e for e in failed.errors)
        assert failed.peak <= failed.size
    for fit in (prefetch1, one_worker, larger):
        assert fit.ok and fit.steps == [fit.config.steps] * fit.config.ranks
        c = fit.config
        doctor = plan_shm(
            int(c.batch_mib * MIB),
            workers=c.workers,
            prefetch_factor=c.prefetch_factor,
            ranks=c.ranks,
        )
        assert doctor.peak == fit.predicted
        assert abs(fit.peak - doctor.peak) <= 0.10 * fit.peak, (c.name, fit.peak, doctor.peak)
    assert not os.path.exists("/dev/shm/ezpz-shm")


def test_figure_draws_each_worker_and_names_the_largest_growth():
    """Guards: a panel per rank from one ledger, a line per worker plus the rank's, and the
    growth in the title is the largest worker's end - start (what the notebook's text reads)."""
    from ezpz_nb import viz

    samples = [_s(w, 10 + w, step, 5 + step * (w + 1)) for step in range(4) for w in (-1, 0, 1)]
    fig = viz.memory_growth(Ledger([], memory=samples))
    (panel,) = fig.ezpz_data["lines"]
    assert sorted(fig.ezpz_data["lines"][panel]) == ["rank", "worker 0", "worker 1"]
    assert fig.ezpz_data["growth"][panel] == 6.0  # worker 1: 5 + 2 * 3 - 5


def test_figure_says_what_to_pass_and_what_is_missing():
    """Guards: the learner's likely wrong inputs get an error naming the fix (a list of
    ``measure_workers`` results, a rank that took no samples); a ledger without memory
    samples draws a figure saying how to take them, not empty axes."""
    from ezpz_nb import viz

    led = Ledger([], memory=[_s(w, 10 + w, step, 5) for step in range(2) for w in (-1, 0)])
    with pytest.raises(TypeError, match=r"Ledger.from_results\(\[m.ledger for m in got\]\)"):
        viz.memory_growth([led])
    with pytest.raises(TypeError, match=r"got \{name: list\}"):
        viz.memory_growth({"dicts": [led]})
    with pytest.raises(
        ValueError, match="rank=5 took no memory samples here; the ranks that did: 0"
    ):
        viz.memory_growth({"dicts": led}, rank=5)
    empty = viz.memory_growth(Ledger([]))
    assert empty.ezpz_data == {"lines": {}, "growth": {}}
    assert "record(loader, memory=True)" in empty.texts[0].get_text()
