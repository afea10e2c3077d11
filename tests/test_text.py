"""ezpz_nb.text: the stdlib corpus, its token cache, padding, packing and token-budget plans.

Properties only, never text: the stdlib differs between Python versions. Multi-rank
tests start 4 real gloo ranks with ``ez.launch`` and assert on what the ranks did.
"""

from __future__ import annotations

import pickle
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

import ezpz_nb as ez
from ezpz_nb.data.groups import make_layout
from ezpz_nb.ledger import Ledger, record
from ezpz_nb.text import (
    PackedRows,
    PadCollate,
    TextError,
    build_corpus,
    check_documents,
    document_mask,
    pack_rows,
    packed_batch,
    plan_then_shard,
    shard_then_plan,
    split_pieces,
    stdlib_corpus,
    stdlib_documents,
    train_tokenizer,
)
from ezpz_nb.text.model import TinyLM

ROW, BUDGET = 256, 1024


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return stdlib_corpus(tmp_path_factory.mktemp("text"))[0]


@pytest.fixture(scope="module")
def pieces(corpus):
    return split_pieces(corpus, ROW)


def lengths_of(pieces):
    return [e - s for _, s, e in pieces]


# --------------------------------------------------------------- single process


def test_corpus_is_deterministic_varied_and_ends_each_document_with_eos(corpus, tmp_path):
    """Guards the corpus being a real, varied text set chosen the same way every time: two
    builds give equal tokens, lengths span short to thousands, every document ends in EOS."""
    again = stdlib_corpus(tmp_path)[0]
    assert corpus.names == again.names and np.array_equal(corpus.tokens, again.tokens)
    assert corpus.num_docs >= 32
    assert corpus.lengths.min() < 300 and corpus.lengths.max() > 2000
    ends = corpus.tokens[corpus.offsets[1:] - 1]
    assert (ends == corpus.eos_id).all()
    assert (corpus.tokens[: corpus.num_tokens] < corpus.vocab_size).all()


def test_corpus_pickles_without_its_tokens(corpus):
    """Guards "one copy, not one per rank": what goes to a rank is the path and the offsets
    (a few KB), and the tokens it maps there are the same."""
    _ = corpus.tokens  # mapped here
    blob = pickle.dumps(corpus)
    assert len(blob) < 16_000 < corpus.tokens.nbytes
    back = pickle.loads(blob)
    assert isinstance(back.tokens, np.memmap) and np.array_equal(back.doc(3), corpus.doc(3))


def test_bpe_is_shorter_than_bytes_and_both_round_trip():
    """Guards the tokenizer fallback: bytes work without `tokenizers` and say so; the BPE
    (when installed) is shorter and decodes back to the text."""
    docs = stdlib_documents(16)
    raw = train_tokenizer(docs, kind="bytes")
    assert raw.kind == "bytes" and raw.decode(raw.encode([docs[0].text])[0]) == docs[0].text
    pytest.importorskip("tokenizers")
    bpe = train_tokenizer(docs, 512, kind="bpe")
    assert bpe.kind == "bpe" and bpe.vocab_size == 512 and "BPE" in bpe.note
    b, r = bpe.encode([docs[1].text])[0], raw.encode([docs[1].text])[0]
    assert len(b) * 2 < len(r) and bpe.decode(b) == docs[1].text


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda c, t: stdlib_documents(root=t), "at least 8"),
        (lambda c, t: build_corpus([], train_tokenizer([], kind="bytes"), t / "x"), "no documents"),
        (lambda c, t: split_pieces(c, 1), "at least 2"),
        (lambda c, t: split_pieces(c, 64, overflow="reject"), "overflow='split'"),
        (lambda c, t: PackedRows(c, 1), "at least 2"),
        (lambda c, t: plan_then_shard([10, 300], 2, 200), "smaller than one row"),
        (lambda c, t: shard_then_plan([10, 20], 0, 2, 5), "at least 20"),
        (lambda c, t: train_tokenizer([], 100, kind="bpe"), "258"),
    ],
)
def test_bad_input_says_what_to_do(corpus, tmp_path, call, words):
    """Guards the errors raised before any rank starts: an empty folder, no documents, a row
    below 2 tokens, a too-long document with overflow='reject', a budget below one row."""
    if "258" in words:
        pytest.importorskip("tokenizers")
    with pytest.raises(TextError, match=words) as err:
        call(corpus, tmp_path)
    assert isinstance(err.value, ez.EzpzError)


def test_split_pieces_covers_every_token_once(corpus, pieces):
    """Guards "split, never drop": long documents become consecutive pieces of at most the
    row length that tile each document exactly."""
    assert max(lengths_of(pieces)) == ROW
    by_doc = {}
    for doc, s, e in pieces:
        by_doc.setdefault(doc, []).append((s, e))
    for doc, spans in by_doc.items():
        assert spans[0][0] == 0 and spans[-1][1] == corpus.lengths[doc]
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert split_pieces(corpus, int(corpus.lengths.max()), overflow="reject") == [
        (d, 0, int(n)) for d, n in enumerate(corpus.lengths)
    ]


def test_padding_counts_real_and_pad_tokens(corpus, pieces):
    """Guards the pad-cost numbers: real + pad = rows x longest, labels ignore padding."""
    ids = [0, 1, 2, 3]
    b = PadCollate(corpus, pieces)(ids)
    lens = [lengths_of(pieces)[i] for i in ids]
    assert b["input_ids"].shape == (4, max(lens))
    assert int(b["real_tokens"]) == sum(lens) == int(b["attention_mask"].sum())
    assert int(b["pad_tokens"]) == 4 * max(lens) - sum(lens)
    assert ((b["labels"] != -100).sum(1) == torch.tensor(lens) - 1).all()


def test_packing_fills_rows_and_restarts_positions(corpus, pieces):
    """Guards packing: full rows (only the last may be short), every token in exactly one row,
    position ids 0.. at every piece, labels never across a document boundary."""
    rows = pack_rows(pieces[:40], 100)
    assert all(sum(e - s for _, s, e in r) == 100 for r in rows[:-1])
    seen = Counter((d, t) for r in rows for d, s, e in r for t in range(s, e))
    assert set(seen.values()) == {1} and len(seen) == sum(lengths_of(pieces[:40]))
    b = packed_batch(corpus, rows, 100)
    docs, pos, lab = b["doc_ids"], b["position_ids"], b["labels"]
    starts = torch.ones_like(docs, dtype=torch.bool)
    starts[:, 1:] = docs[:, 1:] != docs[:, :-1]
    real = docs >= 0
    assert (pos[starts & real] == 0).all() and (pos[~starts & real] > 0).all()
    last_of_piece = torch.ones_like(starts)
    last_of_piece[:, :-1] = starts[:, 1:]
    assert (lab[last_of_piece] == -100).all()
    keep = ~last_of_piece & real
    assert torch.equal(lab[:, :-1][keep[:, :-1]], b["input_ids"][:, 1:][keep[:, :-1]])


def test_document_mask_keeps_other_documents_out_of_the_logits(corpus, pieces):
    """Guards the leak and its fix: changing document A (same length) leaves document B's
    logits bit-identical with the block-diagonal mask, and changes them without it."""
    n = min(100, int(corpus.lengths[:2].min()))
    b = packed_batch(corpus, [[(0, 0, n), (1, 0, n)]], 300)
    docs = b["doc_ids"][0]
    a_id, b_id = 0, 1
    changed = b["input_ids"].clone()
    changed[0, docs == a_id] = (changed[0, docs == a_id] + 7) % corpus.vocab_size
    model = TinyLM(corpus.vocab_size, 300)
    in_b = docs == b_id
    with torch.no_grad():
        for masked in (True, False):
            pos = b["position_ids"] if masked else None
            mask = document_mask(b["doc_ids"]) if masked else None
            before = model(b["input_ids"], pos, mask)[0, in_b]
            after = model(changed, pos, mask)[0, in_b]
            assert torch.equal(before, after) is masked


def test_plans_count_steps_as_described(pieces):
    """Guards the two plans: per-replica planning gives unequal step counts on this corpus;
    the global plan gives equal counts, each piece at most once, and drops fewer than
    dp_size batches; balance keeps each step's real tokens closer."""
    lengths = lengths_of(pieces)
    local = [len(shard_then_plan(lengths, r, 4, BUDGET)) for r in range(4)]
    assert len(set(local)) > 1
    for balance in (False, True):
        plan = plan_then_shard(lengths, 4, BUDGET, balance=balance)
        assert len({len(p) for p in plan}) == 1
        ids = [i for p in plan for b in p for i in b]
        assert len(ids) == len(set(ids)) and len(set(range(len(lengths))) - set(ids)) < 4 * 4
        assert all(len(b) * max(lengths[i] for i in b) <= BUDGET for p in plan for b in p)

    def spread(plan):
        return sum(
            np.ptp([sum(lengths[i] for i in p[s]) for p in plan]) for s in range(len(plan[0]))
        )

    assert spread(plan_then_shard(lengths, 4, BUDGET, balance=True)) < spread(
        plan_then_shard(lengths, 4, BUDGET)
    )


# --------------------------------------------------------------- real ranks


def budget_epoch(corpus, pieces, plan_kind):
    layout = make_layout()
    lengths = [e - s for _, s, e in pieces]
    if plan_kind == "local":
        batches = shard_then_plan(lengths, layout.dp_rank, layout.dp_size, BUDGET)
    else:
        batches = plan_then_shard(lengths, layout.dp_size, BUDGET)[layout.dp_rank]
    loader = DataLoader(
        range(len(pieces)), batch_sampler=batches, collate_fn=PadCollate(corpus, pieces)
    )
    steps = record(loader, layout)
    for batch in steps:
        tokens = batch["real_tokens"].float()
        dist.all_reduce(tokens, group=layout.dp_group)  # stands in for the gradient all-reduce
    return steps.ledger()


def test_ranks_planning_their_own_budget_batches_hang_and_the_global_plan_does_not(corpus, pieces):
    """Guards the step-alignment hang from real data: per-replica token-budget plans give
    ranks different step counts and the longer ones wait in all_reduce (bounded, HangError,
    the ledger shows the counts); the global plan runs clean with equal counts."""
    expected = [len(shard_then_plan(lengths_of(pieces), r, 4, BUDGET)) for r in range(4)]
    with pytest.raises(ez.HangError) as err:
        ez.launch(budget_epoch, corpus, pieces, "local", world_size=4, timeout=8)
    seen = Ledger.from_events(err.value.events, num_samples=len(pieces))
    fewest = min(expected)
    for r in range(4):
        # The longer ranks took one step more and wait in its all_reduce.
        assert len(seen.steps(r, 0)) == min(expected[r], fewest + 1)
        state = err.value.stacks[r]
        if expected[r] == fewest:
            assert state.state == "finished", state.describe()
        else:
            assert state.call == "all_reduce", state.describe()
    clean = Ledger.from_results(
        ez.launch(budget_epoch, corpus, pieces, "global", world_size=4), num_samples=len(pieces)
    )
    assert len({len(clean.steps(r, 0)) for r in range(4)}) == 1
    assert not {p.kind for p in clean.check()} - {"never_seen"}


def packed_epoch(corpus, row_len):
    layout = make_layout()
    rows = PackedRows(corpus, row_len)
    sampler = DistributedSampler(rows, layout.dp_size, layout.dp_rank, seed=3, drop_last=True)
    seen = []
    for batch in DataLoader(rows, batch_size=4, sampler=sampler, drop_last=True):
        for r in range(len(batch["index"])):
            for d in batch["doc_ids"][r].unique().tolist():
                if d >= 0:
                    seen.append((int(batch["index"][r]), d, int((batch["doc_ids"][r] == d).sum())))
        dist.all_reduce(batch["real_tokens"].sum())
    return seen, len(rows), corpus.tokens.nbytes


def test_packed_rows_on_four_ranks_share_the_cache_and_split_every_token_once(corpus):
    """Guards packing on real ranks: the ranks read the same memory-mapped tokens, take equal
    steps, hold disjoint rows, and the rows' tokens sum to the corpus (less dropped rows)."""
    results = ez.launch(packed_epoch, corpus, ROW, world_size=4)
    per_rank = [r[0] for r in results]
    rows = [{row for row, _, _ in seen} for seen in per_rank]
    assert len({len(r) for r in rows}) == 1
    assert sum(len(r) for r in rows) == len(set().union(*rows))
    n_rows = results[0][1]
    tokens = sum(n for seen in per_rank for _, _, n in seen)
    assert corpus.num_tokens - tokens < (n_rows % 16 + 1) * ROW
    assert {r[2] for r in results} == {corpus.tokens.nbytes}


def recorded_text(corpus, pieces, path):
    """One rank's ledger file of padded budget batches, then of packed rows (epoch 1)."""
    layout = make_layout()
    plan = plan_then_shard(lengths_of(pieces), layout.dp_size, BUDGET)[layout.dp_rank]
    padded = DataLoader(
        range(len(pieces)), batch_sampler=plan, collate_fn=PadCollate(corpus, pieces)
    )
    rows = PackedRows(corpus, ROW)
    sampler = DistributedSampler(rows, layout.dp_size, layout.dp_rank, drop_last=True)
    packed = DataLoader(rows, batch_size=4, sampler=sampler, drop_last=True)
    seen = []
    with record(padded, layout, path=f"{path}/rank{layout.rank}.jsonl", epoch=0) as rec:
        for batch in rec:
            seen.append((int(batch["real_tokens"]), int(batch["pad_tokens"]), ()))
        rec.loader = packed
        for batch in rec:
            docs = tuple(
                tuple(dict.fromkeys(d for d in row.tolist() if d >= 0)) for row in batch["doc_ids"]
            )
            seen.append((int(batch["real_tokens"].sum()), int(batch["pad_tokens"].sum()), docs))
    return seen


def test_ledger_v4_keeps_token_counts_and_documents_per_row(corpus, pieces, tmp_path):
    """Guards ledger format 4: the ranks' files give back each step's real and pad tokens and,
    for packed rows, the documents of each row; a version 3 file of the same steps loads with
    the defaults (-1, -1, no rows); figures read the counts from the ledger."""
    from ezpz_nb import viz
    from ezpz_nb.ledger import codec

    seen = ez.launch(recorded_text, corpus, pieces, str(tmp_path), world_size=4)
    ledger = Ledger.load(tmp_path)
    for r in range(4):
        steps = ledger.steps(r, 0) + ledger.steps(r, 1)
        assert [(s.real_tokens, s.pad_tokens, s.row_docs) for s in steps] == seen[r]
        assert all(s.row_docs == () for s in ledger.steps(r, 0))
        assert all(len(s.row_docs) == 4 for s in ledger.steps(r, 1))
    assert codec.decode((tmp_path / "rank0.jsonl").read_text()).version == codec.VERSION >= 4
    fig = viz.token_counts(ledger, epoch=0)
    assert fig.ezpz_data["real"][2].tolist() == [
        a for a, _, _ in seen[2][: len(ledger.steps(2, 0))]
    ]
    old = (
        (tmp_path / "rank0.jsonl")
        .read_text()
        .replace(f'"ezpz_nb_ledger": {codec.VERSION}', '"ezpz_nb_ledger": 3')
    )
    old = "\n".join(
        line.split(', "real_tokens"')[0] + "}" if '"kind": "step"' in line else line
        for line in old.splitlines()
    )
    v3 = codec.decode(old + "\n")
    assert v3.version == 3 and {(r.real_tokens, r.pad_tokens, r.row_docs) for r in v3.records} == {
        (-1, -1, ())
    }
    with pytest.raises(ValueError, match="no token counts"):
        viz.token_counts(Ledger(v3.records))


def test_packed_example_on_ranks_writes_sound_ledgers_with_documents(tmp_path):
    """Guards the torchrun walkthrough's worker under ez.launch: every packed row seen once,
    equal steps, TP peers holding the leader's bytes, token counts and documents per row in
    the files, a loss per step, and the cache it was given left in place."""
    from ezpz_nb.examples import packed

    out, cache = tmp_path / "ledger", tmp_path / "cache"
    ez.launch(
        packed.run, tp_size=2, row_len=128, max_docs=16, out=str(out), cache=str(cache),
        world_size=4, timeout=120,
    )  # fmt: skip
    ledger = Ledger.load(out)
    assert ledger.ok, ledger.summary()
    assert len({len(ledger.steps(r, 0)) for r in range(4)}) == 1
    for leader, peer in ((0, 1), (2, 3)):
        assert [s.digest for s in ledger.steps(leader, 0)] == [
            s.digest for s in ledger.steps(peer, 0)
        ]
    for rec in ledger.records:
        assert rec.real_tokens + rec.pad_tokens == len(rec.sample_ids) * 128
        assert len(rec.row_docs) == len(rec.sample_ids) and all(rec.row_docs)
        assert rec.loss is not None
    assert (cache / "tokens.npy").exists()
    # Token by token: every document's tokens held once, but for the rows left out to
    # divide over the 2 DP replicas (multiple_of); a row held twice is a duplicate.
    again = stdlib_corpus(tmp_path / "again", max_docs=16)[0]
    full = PackedRows(again, 128)
    kept = PackedRows(again, 128, multiple_of=2)
    left_out = {d for row in full.rows[len(kept) :] for d, _, _ in row}
    found = {p.kind: set(p.samples) for p in check_documents(ledger, kept)}
    assert found == ({"doc_never_seen": left_out} if left_out else {})
    twice = Ledger([*ledger.records, replace(ledger.records[0], rank=9, dp_rank=7, tp_rank=0)])
    assert "doc_duplicate" in {p.kind for p in check_documents(twice, kept)}
    cut = [r for r in ledger.records if not (r.dp_rank == 0 and r.step == 0)]  # a step lost
    lost = {d for row in ledger.steps(0, 0)[0].sample_ids for d, _, _ in kept.rows[row]}
    found = {p.kind: set(p.samples) for p in check_documents(Ledger(cut), kept)}
    assert found["doc_never_seen"] >= lost and "doc_duplicate" not in found
    with pytest.raises(ValueError, match="same corpus, row length and seed"):
        check_documents(ledger, PackedRows(again, 128, seed=1))


@pytest.mark.system
def test_packed_example_under_torchrun_exits_0_and_its_ledgers_pass(tmp_path):
    """Guards the packed pipeline running unchanged under torchrun: exit 0 with --check, one
    ledger file per rank with documents per row, and no temporary token cache left behind."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    cmd += ["-m", "ezpz_nb.examples.packed", "--tp-size", "2", "--out", str(tmp_path / "l")]
    proc = subprocess.run(cmd + ["--check"], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "All checks passed." in proc.stdout
    ledger = Ledger.load(tmp_path / "l")
    assert ledger.ok and all(rec.row_docs for rec in ledger.records)
    assert not list(tmp_path.glob("ezpz_nb_text_*"))


@pytest.mark.system
def test_packing_benchmark_prints_its_table():
    """Guards benchmarks/packing.py running to its tables: both collates and both model steps
    measured with a positive rate, and the PSS of 4 ranks (no time or size is asserted: they
    are the script's output)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "benchmarks/packing.py"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    speed = proc.stdout.split("| what | tokens per call")[1]
    rows = [line for line in speed.splitlines()[2:] if line.startswith("| ")]
    assert len(rows) == 4, proc.stdout  # two collates, two model steps
    for row in rows:
        rate = row.strip("|").split("|")[3].strip().replace(",", "")
        assert float(rate) > 0, row
    memory = proc.stdout.split("| rank | reading the shared map")[1].split("\n\n")[0]
    assert len([line for line in memory.splitlines()[2:] if line.startswith("| ")]) == 4
