"""ezpz_nb.verify's evaluation and steps modes, on real gloo ranks (one warm 3-rank Cluster).

Guards the rule that an evaluation loader's repeated or dropped sample is a violation (not
"expected" as in a training check), and that each rule answers pass, fail or "not judged".
"""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from _batches import Stream
from torch.utils.data import DataLoader, DistributedSampler, Subset

import ezpz_nb as ez
from ezpz_nb.data import SteppedLoader, WeightedShard
from ezpz_nb.verify import ContractViolation, Verdict, VerifyError, check_eval, check_steps

N = 10  # over 3 replicas: shares 4, 3, 3, and padding to 4 each repeats two samples


class Indexed(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"index": i, "x": torch.tensor(float(i))}


class Keyed(Indexed):
    def __getitem__(self, i: int) -> dict:
        return {"__key__": f"doc-{i:03d}", "x": torch.tensor(float(i))}


def padded(layout):
    s = DistributedSampler(
        Indexed(), num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=False
    )
    return DataLoader(Indexed(), batch_size=2, sampler=s)


def dropped(layout):
    s = DistributedSampler(
        Indexed(), num_replicas=layout.dp_size, rank=layout.dp_rank, shuffle=False, drop_last=True
    )
    return DataLoader(Indexed(), batch_size=2, sampler=s)


def weighted(layout):
    return DataLoader(WeightedShard(Indexed(), layout.dp_rank, layout.dp_size), batch_size=2)


def uneven(layout):
    shard = Subset(Indexed(), range(layout.dp_rank, N, layout.dp_size))
    return DataLoader(shard, batch_size=1)


def keyed_uneven(layout):
    return DataLoader(Subset(Keyed(), range(layout.dp_rank, N, layout.dp_size)), batch_size=1)


def stepped(layout):
    return SteppedLoader(Indexed(), 2, layout.dp_rank, layout.dp_size, steps=8, seed=1)


def everyone_everything(layout):
    """Every rank streams the whole dataset: each epoch deals each sample three times."""
    loader = SteppedLoader(Indexed(), 2, 0, 1, steps=8, seed=1)
    return loader


def no_epochs(layout):
    return (
        {"index": b["index"]}
        for b in SteppedLoader(Indexed(), 2, layout.dp_rank, layout.dp_size, steps=8)
    )


def endless_plain(layout):
    return itertools.cycle(list(uneven(layout)))


def everything_cycled(layout):
    """Every rank cycles the whole dataset, no epoch field: its order repeats every N samples."""
    return itertools.cycle([{"index": torch.tensor([i])} for i in range(N)])


def stream_stepped(layout):
    return SteppedLoader(Stream(), 2, layout.dp_rank, layout.dp_size, steps=8)


@pytest.fixture(scope="module")
def cluster():
    with ez.Cluster(world_size=3, timeout=60) as c:
        yield c


def test_eval_mode_fails_padding_and_drop_last_and_passes_weight_zero(cluster):
    """Guards the issue's demand: DistributedSampler's padding (a sample counted twice) and
    drop_last (a sample never counted) fail the eval mode at the first place at fault, while
    padding with weight 0 passes both rules."""
    r = check_eval(padded, "dp=3", cluster=cluster)
    assert (
        r.judgement("counted_once").verdict == "fail"
        and r.judgement("equal_steps").verdict == "pass"
    )
    assert "counted again" in r.rules[0].reason and r.rules[0].sample == "0", r.table()
    # indices padded to 12 repeat 0 and 1: rank 1 holds 1, 4, 7, 0 (0 at its step 1)
    assert (r.rules[0].rank, r.rules[0].step) == (1, 1), r.table()
    with pytest.raises(ContractViolation):
        r.raise_for_violations()
    r = check_eval(dropped, "dp=3", cluster=cluster)
    assert r.judgement("counted_once").verdict == "fail" and "never counted (first: 9)" in r.table()
    r = check_eval(weighted, "dp=3", cluster=cluster)
    assert not r.failed and r.judgement("counted_once").verdict == "pass", r.table()
    assert r.judgement("equal_steps").verdict == "pass" and r.steps == {0: 2, 1: 2, 2: 2}


class _Scaled(torch.utils.data.Dataset):
    """WeightedShard's deal, each weight multiplied: by 1/N for every sample (normalised, so
    the weighted sum is the mean itself), or for samples under 5 only."""

    def __init__(self, layout, every: bool) -> None:
        self.ws, self.every = WeightedShard(Indexed(), layout.dp_rank, layout.dp_size), every

    def __len__(self) -> int:
        return len(self.ws)

    def __getitem__(self, k: int) -> dict:
        x = dict(self.ws[k])
        if self.every or int(x["index"]) < 5:
            x["weight"] = float(x["weight"]) / N
        return x


def test_normalised_weights_pass_and_weights_scaled_for_some_samples_fail(cluster):
    """Guards the tenth trial's right answer (weights of 1/N, pads 0: a uniform scale leaves the
    weighted mean exact), and that a scale on some samples only is still a miscount."""
    r = check_eval(
        lambda lay: DataLoader(_Scaled(lay, True), batch_size=2),
        "dp=3",
        num_samples=N,
        cluster=cluster,
    )
    got = r.judgement("counted_once")
    assert got.verdict == "pass" and "a uniform scale" in got.reason, r.table()
    r = check_eval(
        lambda lay: DataLoader(_Scaled(lay, False), batch_size=2),
        "dp=3",
        num_samples=N,
        cluster=cluster,
    )
    assert r.judgement("counted_once").verdict == "fail" and "in all" in r.table(), r.table()


class _Unshared(torch.utils.data.Dataset):
    """The tenth trial's dodges: no sharding. ``how``: every rank everything at 1/dp; every
    rank everything, weight 1 on rank ``i % dp`` only; or the set twice dealt, each at 0.5."""

    def __init__(self, layout, how: str) -> None:
        r, d = layout.dp_rank, layout.dp_size
        if how == "twice":
            self.items = [(i % N, 0.5) for i in range(2 * N)][r::d]
        else:
            mask = how == "mask"
            self.items = [(i, (1.0 if i % d == r else 0.0) if mask else 1 / d) for i in range(N)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> dict:
        i, w = self.items[k]
        return {"index": i, "x": torch.tensor(float(i)), "weight": w}


@pytest.mark.parametrize("how", ["split", "mask", "twice"])
def test_replicas_that_do_not_share_the_work_out_fail(how, cluster):
    """Guards the tenth trial's three passes of check_eval: exact weights, yet every rank
    evaluated everything (or the set twice): counted_once bounds the deliveries."""
    r = check_eval(
        lambda lay: DataLoader(_Unshared(lay, how), batch_size=2),
        "dp=3",
        num_samples=N,
        cluster=cluster,
    )
    got = r.judgement("counted_once")
    assert got.verdict == "fail" and "deliveries" in got.reason and "repeat" in got.reason, (
        r.table()
    )


def test_eval_mode_uneven_shards_are_exact_but_unequal(cluster):
    """Guards the equal-steps rule's three answers: uneven shards count each sample once, fail
    equal steps when the eval step makes a collective (FSDP), and leave it "not asked" (with
    why, no obstacle to a PASS) when the user says it makes none; hashed keys without a
    length leave drops not judged."""
    r = check_eval(uneven, "dp=3", cluster=cluster)
    assert (
        r.judgement("counted_once").verdict == "pass"
        and r.judgement("equal_steps").verdict == "fail"
    )
    assert r.rules[1].rank == 1 and r.rules[1].step == 3, r.table()
    r = check_eval(uneven, "dp=3", collective_step=False, cluster=cluster)
    assert r.judgement("equal_steps").verdict == "not asked" and "collective_step=False" in str(r)
    # Turned off by the user, not missing evidence: a PASS, the rule shown beside it.
    assert not r.failed and r.outcome is Verdict.PASS and r.verdict == "pass", r.table()
    said = " ".join(r.table().split())  # the table breaks lines between words
    assert (
        "eval, over range(10) (the dataset the ranks' Subsets are cut from): PASS; not asked: "
        "equal_steps" in said
    )
    d = json.loads(r.to_json())
    assert d["verdict"] == "pass" and d["rules"][1]["verdict"] == "not asked"
    assert r.raise_for_violations(strict=True) is r
    r = check_eval(keyed_uneven, "dp=3", collective_step=False, cluster=cluster)
    assert r.judgement("counted_once").verdict == "not judged" and "num_samples=" in str(r), (
        r.table()
    )


def test_steps_mode_judges_steps_and_balanced_epochs(cluster):
    """Guards the steps mode for endless loaders: SteppedLoader passes; a finite shard runs out
    (fail at its rank and step); every rank streaming everything deals a sample to two ranks in
    one epoch (fail); batches without an epoch field leave coverage not judged."""
    r = check_steps(stepped, "dp=3", steps=8, cluster=cluster)
    assert not r.failed and r.judgement("balanced_coverage").verdict == "pass", r.table()
    r = check_steps(uneven, "dp=3", steps=5, cluster=cluster)
    assert r.judgement("steps").verdict == "fail" and r.rules[0].rank == 1 and r.rules[0].step == 3
    r = check_steps(everyone_everything, "dp=3", steps=8, cluster=cluster)
    assert r.judgement("balanced_coverage").verdict == "fail" and "again to rank 1" in str(r), (
        r.table()
    )
    r = check_steps(no_epochs, "dp=3", steps=8, cluster=cluster)
    cov = r.judgement("balanced_coverage")
    assert r.judgement("steps").verdict == "pass" and cov.verdict == "not judged", r.table()
    assert "no epoch length was declared" in cov.reason and "num_samples=N" in cov.reason
    r = check_steps(endless_plain, "dp=3", steps=6, num_samples=N, cluster=cluster)
    assert r.judgement("steps").verdict == "pass" and r.steps == {0: 6, 1: 6, 2: 6}


def zigzag(layout):
    """Each rank's share forward, then backward, endlessly, no epoch field: every epoch deals
    each sample once, yet the order repeats only every two epochs."""
    mine = list(range(layout.dp_rank, N, layout.dp_size))
    return ({"index": torch.tensor([i])} for i in itertools.cycle(mine + mine[::-1]))


def test_steps_mode_judges_streams_and_epochs_only_where_declared(cluster):
    """Guards the steps mode on streams: SteppedLoader over an IterableDataset (no length)
    passes both rules; without an epoch field the epochs are cut from the declared
    num_samples (each replica's share of it), so a round-robin cycle passes (shares 4, 3, 3),
    a zigzag order (a period of two epochs) passes, and every rank cycling everything fails
    (a sample on two ranks in one epoch); with no length declared, coverage is not judged.

    Guards: the shortest repeat of the order taken as the epoch ("shares overlap" for a
    zigzag, issue 44)."""
    r = check_steps(stream_stepped, "dp=3", steps=8, num_samples=N, cluster=cluster)
    assert r.ok and r.judgement("balanced_coverage").verdict == "pass", r.table()
    r = check_steps(endless_plain, "dp=3", steps=8, num_samples=N, cluster=cluster)
    cov = r.judgement("balanced_coverage")
    assert cov.verdict == "pass" and "epoch 0: [4, 3, 3]" in cov.reason, r.table()
    assert "declared num_samples=10" in cov.reason
    r = check_steps(zigzag, "dp=3", steps=16, num_samples=N, cluster=cluster)
    assert r.ok and "3 epoch(s) ended" in r.judgement("balanced_coverage").reason, r.table()
    r = check_steps(everything_cycled, "dp=3", steps=20, num_samples=N, cluster=cluster)
    cov = r.judgement("balanced_coverage")
    assert cov.verdict == "fail" and "again to rank 1" in cov.reason, r.table()
    for loader in (zigzag, endless_plain):
        r = check_steps(loader, "dp=3", steps=16, cluster=cluster)
        cov = r.judgement("balanced_coverage")
        assert cov.verdict == "not judged" and "pass num_samples=N" in cov.reason, r.table()


def test_bad_arguments_are_refused_before_any_rank():
    """Guards: bad input gets VerifyError saying what to pass, before a process starts."""
    with pytest.raises(VerifyError, match="steps must be a positive int"):
        check_steps(stepped, "dp=3", steps=0)
    with pytest.raises(VerifyError, match="make_loader must be a function"):
        check_eval(42, "dp=3")
    with pytest.raises(VerifyError, match="num_samples must be a positive int"):
        check_eval(padded, "dp=3", num_samples=-1)


def one_weight_per_batch(layout):
    return ({"index": torch.tensor([i, i + 1]), "weight": 1.0} for i in range(0, N, 2))


def test_a_weight_per_batch_not_per_sample_is_refused(cluster):
    """Guards a silent misjudgement: a batch's single weight read as one sample's; the check
    names the batch and asks for one weight per sample."""
    with pytest.raises(VerifyError, match="batch 0 holds 2 samples but 1 'weight' values"):
        check_eval(one_weight_per_batch, "dp=3", cluster=cluster)


def test_tp_peers_share_their_replicas_samples():
    """Guards the eval mode under TP: TP peers hold the same samples, so only one rank per
    replica counts; weight-0 padding on dp=2,tp=2 passes rather than counting everything twice."""
    r = check_eval(weighted, "dp=2,tp=2")
    assert not r.failed and r.judgement("counted_once").verdict == "pass", r.table()
    assert r.steps == {0: 3, 1: 3, 2: 3, 3: 3}
