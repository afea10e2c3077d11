"""Trial 8's dodges of verify (issue 45): the same data on every replica under sharded ids in
every shape a batch leaf takes, a resume state that is a digest of a position kept
elsewhere, noise levels in a field named ``step``; and right answers whose data repeats.

The loaders are in ``_verify_stamped.py``; the checks share one warm 2-rank cluster (a
resume's resumed parts start fresh ranks by design). The twin rule's chance bound is also
tried on many honest shards without ranks, at dp 2 to 8.
"""

from __future__ import annotations

import tempfile
from typing import Any

import _verify_stamped as S
import numpy as np
import pytest
import torch
from _said import said

from ezpz_nb.data import SteppedLoader
from ezpz_nb.verify import check_contract, check_eval, check_resume, check_steps
from ezpz_nb.verify.batches import is_batch_tag
from ezpz_nb.verify.contents import first_twin
from ezpz_nb.verify.samples import SEP, sample_contents

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("form", ["text", "lists", "flat", "records", "tagged", "dup"])
def test_the_same_data_under_sharded_ids_fails_in_every_shape(form, two):
    """Two draws of each: raw text, rows collated to Python lists, a flattened row cut by
    position ids, a list of sample records, a per-replica tag beside the tokens, one row
    repeated inside each replica's epoch.

    Guards: contents read only from tensors of one row a sample, whole samples compared
    (a tag hides the tokens), and the twin rule switched off by any repeat in a replica.
    """
    for seed in (0, 1):
        rep = check_contract(S.stamped(form, seed), "dp=2", epochs=2, shuffle=True, cluster=two)
        assert rep.rule_verdicts()["dp_disjoint"] == "fail", rep.table()
        assert "same bytes under other ids" in said(rep, "dp_disjoint"), rep.table()


@pytest.mark.parametrize("kind", ["dups", "constant", "padding"])
def test_data_that_truly_repeats_passes(kind, two):
    """A dataset with three pairs of equal rows, one whose samples are all alike, one with
    zero padding rows, each sharded by a DistributedSampler: no rule fails, on two seeds."""
    for seed in (0, 1):
        rep = check_contract(S.repeating(kind, seed), "dp=2", epochs=2, shuffle=True,
                             cluster=two)  # fmt: skip
        assert not rep.failed and rep.ok, rep.table()


def test_eval_fails_the_same_text_under_shard_ids_and_passes_repeats(two):
    """check_eval reads text too; the dataset with duplicate rows passes it."""

    def make(stamp: bool) -> Any:
        def factory(layout: Any) -> Any:
            ids = list(range(layout.dp_rank, S.N, layout.dp_size))
            rows = range(len(ids)) if stamp else ids
            return [{"text": [S.text(j) for j in rows], "index": torch.tensor(ids),
                     "weight": torch.ones(len(ids))}]  # fmt: skip

        return factory

    bad = check_eval(make(True), "dp=2", num_samples=S.N, cluster=two)
    got = bad.judgement("counted_once")
    assert got.verdict == "fail" and "same bytes under other ids" in got.reason, bad.table()
    assert check_eval(make(False), "dp=2", num_samples=S.N, cluster=two).ok


def test_steps_fail_the_same_rows_with_a_repeat_and_pass_shards(two):
    """check_steps: the same rows on every replica under SteppedLoader's ids, reads 0 and 1
    one row (the repeat that switched the rule off), fail; the honest SteppedLoader passes."""
    rep = check_steps(lambda layout: S.StampedSteps(layout, 12), "dp=2", steps=12, cluster=two)
    got = rep.judgement("balanced_coverage")
    assert got.verdict == "fail" and "same bytes under other ids" in got.reason, rep.table()
    honest = check_steps(
        lambda layout: SteppedLoader(S.Rows(), S.B, layout.dp_rank, layout.dp_size, steps=12),
        "dp=2", steps=12, cluster=two,
    )  # fmt: skip
    assert honest.ok, honest.table()


@pytest.mark.parametrize(
    ("kind", "verdict", "words"),
    [
        (S.DigestInFile, "not judged", "wrote files"),
        (S.DigestByShell, "not judged", "os.system"),
        (S.DigestInMemory, "fail", "resumed loader failed"),
        (S.NoiseSteps, "fail", "step"),
        (S.CountedSteps, "pass", ""),
        (S.Position, "pass", ""),
    ],
)
def test_a_resume_is_judged_by_what_the_state_carries(kind, verdict, words, two):
    """A digest of the position (the same when asked twice) with the position in a file is
    not judged, naming the file (or the command that wrote it); with the position in the warm rank's memory it fails (the
    resumed part runs on fresh ranks); per-sample noise in a field named 'step' fails; a
    batch counter named 'step' and an honest state pass.

    Guards: resumed parts on the warm ranks, no watch of the loader's file writes, fields
    skipped by their name.
    """
    with tempfile.TemporaryDirectory() as d:

        class Factory(kind):
            folder = d

        rep = check_resume(Factory, "dp=2", epochs=2, scenarios=("mid-epoch",),
                           shuffle=True, cluster=two)  # fmt: skip
    assert rep.rule_verdicts()["resume"] == verdict, rep.table()
    assert words in " ".join(rep.table().split()), rep.table()
    if kind is S.DigestInFile:
        assert d in " ".join(rep.table().split()), rep.table()


def test_batch_tags_are_judged_by_their_values_not_their_names():
    """A field named step/epoch/worker_id is left out of the content only when it holds one
    integer for the whole batch."""
    assert is_batch_tag("step", 3) and is_batch_tag("worker_id", torch.full((4,), 1))
    assert not is_batch_tag("step", torch.tensor([5, 912, 33]))  # noise levels a sample
    assert not is_batch_tag("step", torch.rand(3, 6)) and not is_batch_tag("step", 0.5)
    assert not is_batch_tag("x", 3)


def test_sample_contents_reads_every_shape_alike():
    """The same three samples as a tensor, Python lists, text, records, a packed row cut by
    cu_seqlens and a flattened row cut by position ids: one digest of input_ids each."""
    rows = [S.tokens(j) for j in range(3)]
    shapes = [
        {"input_ids": torch.stack(rows)},
        {"input_ids": [r.tolist() for r in rows]},
        {"input_ids": np.stack([r.numpy() for r in rows])},
        {"input_ids": torch.cat(rows), "cu_seqlens": torch.tensor([0, 6, 12, 18])},
        {"input_ids": torch.cat(rows).unsqueeze(0),
         "position_ids": torch.arange(6).repeat(3).unsqueeze(0)},
    ]  # fmt: skip
    digests = [sample_contents(b, "index", 3) for b in shapes]
    for got in digests:
        assert len(got) == 3 and len(set(got)) == 3, got
        assert [d.split(":")[0] for d in got] == ["/input_ids"] * 3, got
    assert len({tuple(g) for g in digests}) == 1, digests
    records = sample_contents(
        [{"input_ids": r, "index": i} for i, r in enumerate(rows)], "index", 3
    )
    texts = sample_contents({"text": [S.text(j) for j in range(3)]}, "index", 3)
    assert len(set(records)) == 3 and len(set(texts)) == 3
    assert sample_contents({"label": torch.tensor([1, 2, 3])}, "index", 3) == []


def _reads(content: list[Any], d: int, epochs: int, rng: Any, stamp: bool) -> list[Any]:
    """Synthetic reads of a shuffled shard (``stamp``: replica position k holds content k)."""
    out = []
    for e in range(epochs):
        perm = rng.permutation(len(content))
        for r in range(d):
            for k, i in enumerate(perm[r::d]):
                c = content[k] if stamp else content[i]
                out.append((f"/x:{c}{SEP}/tag:{r}", int(i), r, r, e, k))
    return out


def test_twins_blame_the_same_data_under_sharded_ids_never_a_dataset_s_repeats():
    """20 shuffles each at dp 2, 4 and 8: a few duplicate rows, padding rows, constant
    features, ten classes of one-hot labels never blamed; the same data under sharded ids
    blamed always, also with one row repeated in each replica or a per-replica tag."""
    rng = np.random.default_rng(0)
    for d, n in [(2, 24), (4, 40), (8, 64)]:
        base = list(range(n))
        honest = {
            "dups": [{5: 2, 11: 7, 20: 13}.get(i, i) for i in base],
            "padding": [i if i < n - d else -1 for i in base],
            "constant": [0] * n,
            "classes": [i % 10 for i in base],
        }
        for _ in range(20):
            for name, content in honest.items():
                assert first_twin(_reads(content, d, 2, rng, False)) is None, (name, d)
            assert first_twin(_reads(base, d, 2, rng, True)) is not None, d
            dup = [0 if i == 1 else i for i in base]
            assert first_twin(_reads(dup, d, 1, rng, True)) is not None, d
