"""ezpz_nb.examples: each walkthrough's worker on real ranks (world 4, tp 2).

The workers are the ones ``torchrun -m ezpz_nb.examples.<name>`` runs; here
they run through ``ez.launch``/``Cluster`` unchanged, and their ledgers are
checked against torch's own ``DistributedSampler``. GPU tests skip without one.
"""

from __future__ import annotations

import inspect
import math
import socket
import typing

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

import ezpz_nb as ez
from ezpz_nb import _dist
from ezpz_nb.data import DataLayoutWarning
from ezpz_nb.data.groups import layout_table
from ezpz_nb.examples import (
    capstone,
    command,
    common,
    dp_sharding,
    step_alignment,
    throughput,
    tp_broadcast,
)
from ezpz_nb.ledger import Ledger

WORLD, TP = 4, 2
DP = WORLD // TP
N, BATCH, SEED = 64, 4, 1337
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(WORLD, timeout=60) as c:
        yield c


def sampler_ids(
    dp_rank: int,
    epoch: int,
    *,
    n: int = N,
    dp: int = DP,
    drop_last: bool = True,
    batch: int = BATCH,
    seed: int = SEED,
) -> list[int]:
    """The ids torch's DistributedSampler + DataLoader batching give a replica in an epoch."""
    s = DistributedSampler(
        list(range(n)), num_replicas=dp, rank=dp_rank, shuffle=True, seed=seed, drop_last=drop_last
    )
    s.set_epoch(epoch)
    ids = list(s)
    full = len(ids) // batch * batch if drop_last else len(ids)
    return ids[:full]


def kinds(ledger: Ledger) -> set[str]:
    return {p.kind for p in ledger.check()}


def assert_matches_sampler(ledger: Ledger, epochs: int, *, set_epoch: bool = True) -> None:
    for rank, dp_rank, _ in layout_table(WORLD, TP):
        for e in range(epochs):
            want = sampler_ids(dp_rank, e if set_epoch else 0)
            assert ledger.sample_ids(rank, e) == want, f"rank {rank} epoch {e}"


def assert_tp_peers_identical(ledger: Ledger) -> None:
    by_step: dict[tuple[int, int, int], set[str]] = {}
    for r in ledger.records:
        by_step.setdefault((r.epoch, r.dp_rank, r.step), set()).add(r.digest)
    assert by_step and all(len(d) == 1 for d in by_step.values())


# ------------------------------------------------------------------ dp_sharding


def test_dp_sharding_matches_distributed_sampler_and_writes_one_file_per_rank(cluster, tmp_path):
    """Guards ezpz pitfall 2 (docs/ezpz_pitfalls.md) (sharding over the world) and the per-rank ledger files that
    a torchrun run leaves for plotting."""
    stale = tmp_path / "rank7.jsonl"  # from an imagined earlier 8-rank run
    stale.write_text("{}\n")
    ledger = Ledger.from_results(
        cluster.run(dp_sharding.run, tp_size=TP, epochs=2, out=str(tmp_path))
    )
    assert ledger.ok, ledger.summary()
    assert ledger.ranks() == list(range(WORLD))
    assert_matches_sampler(ledger, 2)
    assert_tp_peers_identical(ledger)
    assert ledger.sample_ids(0, 0) != ledger.sample_ids(0, 1)  # set_epoch reshuffled
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank{r}.jsonl" for r in range(WORLD)]
    loaded = Ledger.load(tmp_path)
    assert set(loaded.records) == set(ledger.records)
    assert loaded.num_samples == N


def test_dp_sharding_without_set_epoch_repeats_the_first_order(cluster):
    ledger = Ledger.from_results(
        cluster.run(dp_sharding.run, tp_size=TP, epochs=2, set_epoch=False)
    )
    assert ledger.epochs() == [0, 1]
    assert_matches_sampler(ledger, 2, set_epoch=False)


def test_dp_sharding_over_the_world_is_flagged_as_tp_mismatch(cluster):
    """Guards: sharding over the world is caught twice, by the warning the ranks relay to
    the caller (at the launching line) and by the ledger's TP check."""
    with pytest.warns(DataLayoutWarning, match="on rank 0:"):
        ledger = Ledger.from_results(
            cluster.run(dp_sharding.run, tp_size=TP, epochs=1, shard_over="world")
        )
    assert kinds(ledger) == {"tp_mismatch"}


def test_dp_sharding_padding_shows_duplicates(cluster):
    ledger = Ledger.from_results(
        cluster.run(
            dp_sharding.run, tp_size=TP, epochs=1, num_samples=11, batch_size=2, drop_last=False
        )
    )
    assert kinds(ledger) == {"dp_duplicate"}
    for rank, dp_rank, _ in layout_table(WORLD, TP):
        assert ledger.sample_ids(rank, 0) == sampler_ids(dp_rank, 0, n=11, batch=2, drop_last=False)


# ----------------------------------------------------------------- tp_broadcast


@pytest.mark.parametrize("mode", ["tensor", "pickle"])
def test_tp_broadcast_peers_receive_the_leaders_batches(cluster, mode):
    ledger = Ledger.from_results(cluster.run(tp_broadcast.run, tp_size=TP, epochs=2, mode=mode))
    assert ledger.ok, ledger.summary()
    assert_matches_sampler(ledger, 2)
    assert_tp_peers_identical(ledger)
    assert {(r.tp_rank, r.source) for r in ledger.records} == {(0, "loaded"), (1, "received")}


def test_tp_broadcast_fixes_rank_seeded_data(cluster):
    """Guards ezpz pitfall 1 (docs/ezpz_pitfalls.md): tokens seeded by rank differ between TP peers unless the
    leader's batch is broadcast."""
    alone = Ledger.from_results(
        cluster.run(tp_broadcast.run, tp_size=TP, epochs=1, rank_seeded=True, broadcast=False)
    )
    assert kinds(alone) == {"tp_mismatch"}
    sent = Ledger.from_results(
        cluster.run(tp_broadcast.run, tp_size=TP, epochs=1, rank_seeded=True, broadcast=True)
    )
    assert sent.ok, sent.summary()


# --------------------------------------------------------------- step_alignment


def hand_made_steps(dp_rank: int, n: int = 65, dp: int = DP, batch: int = BATCH) -> int:
    return math.ceil(len(range(dp_rank, n, dp)) / batch)


def test_step_alignment_sampler_and_guard_keep_every_rank_in_step(cluster):
    sampler = Ledger.from_results(cluster.run(step_alignment.run, tp_size=TP))
    guarded = Ledger.from_results(
        cluster.run(step_alignment.run, tp_size=TP, uneven=True, guard=True)
    )
    assert "step_mismatch" not in kinds(sampler) | kinds(guarded)
    fewest = min(hand_made_steps(d) for d in range(DP))
    assert {len(guarded.steps(r, 0)) for r in range(WORLD)} == {fewest}
    # The guard keeps ranks in step by skipping the longer shards' extra batches.
    assert fewest < max(hand_made_steps(d) for d in range(DP))
    assert kinds(guarded) == {"never_seen"}


def test_step_alignment_uneven_raises_on_the_waiting_ranks_instead_of_hanging():
    with pytest.raises(ez.RankError) as info:
        ez.launch(
            step_alignment.run,
            world_size=WORLD,
            timeout=60,
            tp_size=TP,
            uneven=True,
            step_timeout=2.0,
        )
    err = info.value
    longest = max(hand_made_steps(d) for d in range(DP))
    waiting = {r for r, d, _ in layout_table(WORLD, TP) if hand_made_steps(d) == longest}
    assert set(err.failures) == waiting
    # Once one waiting rank raises, the launcher stops the others after a short grace;
    # on a busy machine a rank can be stopped (empty traceback) before its own timeout.
    raised = [f for f in err.failures.values() if f.kind != "stopped"]
    assert raised and all("StepTimeoutError" in f.traceback for f in raised)
    assert "fewer steps" in str(err)
    partial = Ledger.from_events(err.events)
    assert "step_mismatch" in kinds(partial)


# ------------------------------------------------------------------- capstone

CAPSTONE = {"num_samples": 64, "batch_size": 8, "epochs": 2}  # 4 steps per epoch


def capstone_curve(ledger: Ledger) -> torch.Tensor:
    return torch.tensor([loss for _, _, loss in ledger.losses()])


@pytest.fixture(scope="module")
def capstone_reference() -> torch.Tensor:
    return torch.tensor(capstone.reference_losses(dp_size=DP, **CAPSTONE))


@pytest.mark.parametrize("reduce", ["avg", "sum", "auto"])
def test_capstone_fsdp2_x_tp_losses_match_one_process(cluster, capstone_reference, reduce):
    """Guards the capstone's claim: FSDP2 over dp x TP over tp, fed by the TP broadcast,
    trains exactly like one process on the same global batches, whichever way FSDP2
    reduces the gradients (pytorch#162338: gloo's AVG was reported to sum)."""
    ledger = Ledger.from_results(cluster.run(capstone.run, tp_size=TP, reduce=reduce, **CAPSTONE))
    assert ledger.ok, ledger.summary()
    assert_matches_sampler(ledger, 2)  # batches of 8 from the DP sampler, as the reference
    assert all(ledger.losses(r) == ledger.losses(0) for r in range(WORLD))
    torch.testing.assert_close(capstone_curve(ledger), capstone_reference, rtol=1e-4, atol=1e-5)
    assert capstone_reference[-1] < 0.7 * capstone_reference[0]  # the rule is being learnt


def _avg_probe_cases() -> tuple[bool, bool, bool]:
    """On a rank: the probe's answer, the truth found another way (all_gather the
    inputs and average here), and the probe's answer on a backend whose AVG sums."""
    n, me = dist.get_world_size(), dist.get_rank()
    x = torch.arange(n, dtype=torch.float32) * (me + 1) + me  # differs by rank and slot
    parts = [torch.empty_like(x) for _ in range(n)]
    dist.all_gather(parts, x)
    out = torch.empty(1)
    dist.reduce_scatter_tensor(out, x, op=dist.ReduceOp.AVG)
    truth = math.isclose(out.item(), torch.stack(parts).mean(0)[me].item(), rel_tol=1e-6)
    probe = capstone.avg_reduces_correctly()
    names = [k for k in ("reduce_scatter_single", "reduce_scatter_tensor") if hasattr(dist, k)]
    real = {k: getattr(dist, k) for k in names}

    def summing(k):  # pytorch#162338: gloo's AVG was reported to sum
        return lambda out, inp, op=None, **kw: real[k](out, inp, op=dist.ReduceOp.SUM, **kw)

    try:
        for k in names:
            setattr(dist, k, summing(k))
        fooled = capstone.avg_reduces_correctly()
    finally:
        for k in names:
            setattr(dist, k, real[k])
    return probe, truth, fooled


def test_capstone_avg_probe_tells_an_average_from_a_sum(cluster):
    """Guards the probe behind ``reduce="auto"``: on every rank it says what the backend's
    AVG really does (checked with another collective), and says False for one that sums:
    a probe that always answers the same fails one of the two."""
    got = cluster.run(_avg_probe_cases)
    assert len(set(got)) == 1, got  # every rank takes the same path
    probe, truth, fooled = got[0]
    assert probe == truth and fooled is False, got


def test_capstone_broken_data_leaves_the_reference_and_the_ledger_says_why(
    cluster, capstone_reference
):
    seeded = Ledger.from_results(
        cluster.run(capstone.run, tp_size=TP, rank_seeded=True, broadcast=False, **CAPSTONE)
    )
    assert kinds(seeded) == {"tp_mismatch"}
    assert (capstone_curve(seeded) - capstone_reference).abs().max() > 0.01
    same = Ledger.from_results(cluster.run(capstone.run, tp_size=TP, set_epoch=False, **CAPSTONE))
    assert_matches_sampler(same, 2, set_epoch=False)
    gap = (capstone_curve(same) - capstone_reference).abs()
    assert gap[:4].max() < 1e-5 and gap[4:].max() > 0.01  # parts where epoch 1 starts


def test_capstone_rule_dataset_is_the_same_everywhere_and_follows_its_rule():
    a, b = capstone.RuleTokenDataset(num_samples=8), capstone.RuleTokenDataset(num_samples=8)
    for i in range(8):
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"]) and a[i]["index"] == i
        assert ((5 * a[i]["input_ids"] + 3) % capstone.VOCAB).tolist() == a[i]["labels"].tolist()
    assert len({a[i]["input_ids"][0].item() for i in range(8)}) > 1  # random starts
    with pytest.raises(IndexError):
        a[8]


# ---------------------------------------------------- the command line


@pytest.mark.parametrize(
    "example", [dp_sharding, tp_broadcast, step_alignment, capstone, throughput]
)
def test_command_line_is_the_workers_signature(example):
    """Guards defaults declared twice (the worker's and its parser's, which drifted apart
    before): every parameter of run() is an option with run()'s default and its help
    from the docstring, and the launch options come on top. A parameter that takes
    code (capstone's shard_model, a notebook's function) has no option."""
    parser = command.parser_for(example.run, example.__doc__)
    hints = typing.get_type_hints(example.run)
    params = {
        k: p
        for k, p in inspect.signature(example.run).parameters.items()
        if "Callable" not in str(hints.get(k))
    }
    got = vars(parser.parse_args([]))
    assert {k: got[k] for k in params} == {k: p.default for k, p in params.items()}
    assert set(got) - set(params) == {"backend", "timeout", "check"}
    helps = {a.dest: a.help for a in parser._actions}
    assert all(helps[k] and ":class:" not in helps[k] for k in params), helps


def test_command_line_types_optional_numbers():
    """Guards `--heavy-rank 1` arriving as the string "1" (an `int | None` option)."""
    parser = command.parser_for(throughput.run, throughput.__doc__)
    args = parser.parse_args(["--heavy-rank", "1", "--prefetch-factor", "4", "--out", "d"])
    assert (args.heavy_rank, args.prefetch_factor, args.out) == (1, 4, "d")
    assert parser.parse_args([]).heavy_rank is None


def test_command_line_flips_switches_and_refuses_what_run_refuses(capsys):
    parser = command.parser_for(capstone.run, capstone.__doc__)
    args = parser.parse_args(["--no-set-epoch", "--reduce", "sum", "--lr", "0.5", "--out", "d"])
    assert (args.set_epoch, args.reduce, args.lr, args.out) == (False, "sum", 0.5, "d")
    with pytest.raises(SystemExit):
        parser.parse_args(["--reduce", "mean"])
    assert "invalid choice: 'mean'" in capsys.readouterr().err


# ---------------------------------------------------- ensure_distributed, backend


def test_ensure_distributed_does_nothing_inside_a_launched_rank(cluster):
    def probe():
        return common.ensure_distributed(), dist.get_world_size(), str(common.device())

    assert cluster.run(probe) == [(False, WORLD, "cpu")] * WORLD


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_process_torchrun_env(monkeypatch):
    """The environment torchrun gives a world of one process, and cleanup after."""
    for k, v in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }.items():
        monkeypatch.setenv(k, v)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_main_joins_torchrun_env_runs_and_leaves(one_process_torchrun_env, tmp_path, capsys):
    assert not dist.is_initialized()
    status = tp_broadcast.main(["--tp-size", "1", "--out", str(tmp_path), "--check"])
    assert status == 0
    assert not dist.is_initialized()  # it created the group, so it destroyed it
    # ...and freed every group object, so no gloo thread is left to abort the exit
    # (make_layout's cache used to keep them all alive until interpreter teardown).
    assert _dist._gloo_worker_threads() == 0
    assert "All checks passed." in capsys.readouterr().out
    ledger = Ledger.load(tmp_path)
    assert ledger.ok and ledger.ranks() == [0]
    assert [i for e in (0, 1) for i in sorted(ledger.sample_ids(0, e))] == list(range(N)) * 2


def test_ensure_distributed_joins_once(one_process_torchrun_env):
    assert common.ensure_distributed() is True
    assert dist.get_world_size() == 1 and dist.get_backend() == "gloo"
    assert common.ensure_distributed() is False


def test_run_in_place_gives_launchs_result_list(one_process_torchrun_env):
    assert common.in_torchrun_env()
    assert common.run_in_place(lambda x: (dist.get_rank(), x), 7) == [(0, 7)]


def test_ensure_distributed_without_torchrun_env_says_what_to_do(monkeypatch):
    for k in common.TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    assert not common.in_torchrun_env()
    with pytest.raises(RuntimeError, match="torchrun"):
        common.ensure_distributed()


def test_main_outside_torchrun_is_a_usage_error_not_a_traceback(monkeypatch, capsys):
    for k in common.TORCHRUN_VARS:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit) as info:
        dp_sharding.main([])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "torchrun" in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_nccl_without_gpu_is_a_clear_error_before_init(one_process_torchrun_env):
    with pytest.raises(ValueError, match="--backend gloo"):
        common.ensure_distributed("nccl")
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="backend must be one of"):
        common.check_backend("mpi")


# ------------------------------------------------------------------------ GPUs


def _gpu_world() -> tuple[int, int]:
    world = min(WORLD, torch.cuda.device_count())
    return world, (TP if world % TP == 0 else 1)


@needs_gpu
@pytest.mark.parametrize("example", [dp_sharding, tp_broadcast, step_alignment, capstone])
def test_examples_on_nccl_one_gpu_per_rank(example):
    world, tp = _gpu_world()
    ledger = Ledger.from_results(
        ez.launch(example.run, world_size=world, timeout=120, backend="nccl", tp_size=tp)
    )
    assert ledger.ranks() == list(range(world))
    assert "step_mismatch" not in kinds(ledger) and "tp_mismatch" not in kinds(ledger)


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (NCCL: one per rank)"
)
def test_nccl_tp_broadcast_delivers_cuda_tensors_on_each_peers_gpu():
    def worker():
        from ezpz_nb.data import get_random_dataset_fsdp_tp
        from ezpz_nb.data.groups import make_layout
        from ezpz_nb.ledger import batch_digest

        layout = make_layout(2)
        dl = get_random_dataset_fsdp_tp(
            BATCH,
            common.VOCAB_SIZE,
            common.SEQ_LENGTH,
            dp_group=layout.dp_group,
            tp_group=layout.tp_group,
            broadcast_within_tp=True,
            num_samples=32,
        )["dataloader"]
        return [(str(b["input_ids"].device), batch_digest(b)) for b in dl]

    leader, peer = ez.launch(worker, world_size=2, timeout=120, backend="nccl")
    assert [d for _, d in leader] == [d for _, d in peer]
    assert {dev for dev, _ in peer} == {"cuda:1"}
