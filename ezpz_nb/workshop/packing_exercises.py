"""Checkers for notebook 11's exercises: a packing collate, and a token-budget plan for DP.

Exercise 1 of notebook 11, ``pack(docs, row_len)``: pack a list of 1-D token tensors into rows of
``row_len`` and return ``input_ids``, ``position_ids`` and ``mask`` (``rows x L x L``,
True where a query may attend to a key), padding with ``0``. Judged on 4 real ranks,
each packing its share of documents: no token attends to another document or to a
later token; every earlier token of its own document in the row is visible; position
ids count within each document's segment (from 0, or from the token's offset in the
document when a document continues from the previous row: both are accepted); less
than one row of padding per call; and, over the epoch, every token of every
document in exactly one row on exactly one rank.

Exercise 2, ``plan_batches(lengths, dp_rank, dp_size, budget)``: this DP replica's
batches of document ids, with ``len(batch) * longest <= budget``. Each check draws two
cases (the DP size, the budget, the number and lengths of documents; the second about
three times the first's batches), each run on real ranks: equal step counts, no
document twice, no more tokens left out than :func:`_allowed_drop` (what agreeing on the
smallest count drops, with a margin), and batches as full (:data:`FILL`) and padding
within :data:`EXCESS_PAD` of a plan sorted by length over the same documents (so one
document per batch, and unsorted fixed-size batches, are turned down). A plan made globally and dealt over DP passes, and so does a per-replica plan
that agrees on the count with ``all_reduce(MIN)``; a count fixed in advance cannot
fit both cases.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Any

from ezpz_nb.text.plan import budget_batches, shard_then_plan
from ezpz_nb.workshop import packing_jobs as jobs
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    each_returned,
    fresh_seed,
    judge,
    run_learner,
    wrong,
)

__all__ = ["check_budget_plan", "check_pack"]

DOCS, PER_CALL = 24, 3
#: Row lengths a packing check draws from: an answer cannot fit a fixed one.
ROW_LENS = (8, 12, 16, 20, 24)
#: Padding share a plan may have beyond a plan sorted by length over the same documents.
#: Measured over 1000 drawn cases: a per-replica sorted plan (fix 2) up to 0.11 beyond,
#: unsorted batches of ``budget // longest`` documents at least 0.19.
EXCESS_PAD = 0.15
#: Share of the budget a plan must fill, as a fraction of what a sorted plan over the
#: same documents fills (one document per batch: about a third; fix 2: at least 0.75).
FILL = 0.6


def _check_row(
    rank: int, c: int, r: int, ids: list[int], pos: list[int], mask: list[list[int]]
) -> list[tuple[int, int]]:
    """Raise a verdict for the first thing wrong in one packed row; return its tokens."""
    where = f"rank {rank}, call {c}, row {r}"
    toks = [jobs.decode_token(t) for t in ids]
    seg = [0] * len(ids)  # a segment: a run of one document's consecutive tokens
    for i in range(1, len(ids)):
        a, b = toks[i - 1], toks[i]
        same = a[0] >= 0 and a[0] == b[0]
        if same and b[1] != a[1] + 1:
            raise wrong(f"{where}: document {b[0]}'s tokens are not in order at position {i}.")
        seg[i] = seg[i - 1] + (0 if a[0] == b[0] else 1)  # a run of padding: one segment too
    for i, t in enumerate(toks):
        if t[0] < 0:
            continue
        first = next(j for j in range(i + 1) if seg[j] == seg[i])
        if pos[i] - pos[first] != i - first or pos[first] not in (0, toks[first][1]):
            raise wrong(
                f"{where}: token {i} (document {t[0]}) has position id {pos[i]}; position "
                "ids count 0, 1, 2... from where each document starts in the row."
            )
        for j in range(len(ids)):
            allowed = bool(mask[i][j])
            want = j <= i and seg[j] == seg[i]
            if allowed and not want:
                what = (
                    "padding"
                    if toks[j][0] < 0
                    else "a later token"
                    if j > i
                    else f"document {toks[j][0]}"
                )
                raise wrong(
                    f"{where}: token {i} (document {t[0]}) may attend to token {j}, {what}. "
                    "Each token may see only the earlier tokens of its own document."
                )
            if want and not allowed:
                raise wrong(
                    f"{where}: token {i} (document {t[0]}) may not attend to token {j}, an "
                    "earlier token of its own document: the mask hides too much."
                )
    return [t for t in toks if t[0] >= 0]


def check_pack(
    fn: Callable[[list[Any], int], dict[str, Any]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 11, exercise 1: ``fn(docs, row_len)`` packs documents without attention across them.

    24 documents of fresh random lengths (some three rows long) are dealt over 4
    ranks; each rank packs its own 3 at a time with ``fn``, at two row lengths drawn anew
    (one per call, in turn).
    """
    seed = fresh_seed()

    def body() -> str:
        # Two row lengths, call by call: a length written into the answer fits neither.
        row_lens = random.Random(seed).sample(ROW_LENS, 2)
        docs = jobs.pack_docs(seed, DOCS, max(row_lens))
        got = run_learner(jobs.job_pack, fn, docs, row_lens, PER_CALL, timeout=timeout)
        each_returned(got, "the packed rows of every call")
        seen: Counter[tuple[int, int]] = Counter()
        rows = 0
        for rank, calls in enumerate(got):
            for c, out in enumerate(calls):
                row_len = row_lens[c % len(row_lens)]
                ids, pos, mask = out["input_ids"], out["position_ids"], out["mask"]
                shape = (len(ids), len(ids[0]) if ids else 0)
                if not ids or shape[1] != row_len or len(pos) != shape[0] or len(mask) != shape[0]:
                    raise wrong(
                        f"rank {rank}, call {c}: input_ids has shape {shape}, position_ids "
                        f"{len(pos)} rows, mask {len(mask)}: return rows x {row_len} tensors "
                        f"and a rows x {row_len} x {row_len} mask."
                    )
                pad = sum(t == jobs.PAD for row in ids for t in row)
                if pad >= row_len:
                    raise wrong(
                        f"rank {rank}, call {c}: {pad} padding tokens in {shape[0]} rows. Pack: "
                        "fill each row before starting the next (split a document that does "
                        "not fit), so only the last row of a call is short."
                    )
                for r in range(shape[0]):
                    seen.update(_check_row(rank, c, r, ids[r], pos[r], mask[r]))
                rows += shape[0]
        want = {jobs.decode_token(t) for doc in docs for t in doc}
        twice = [k for k, n in seen.items() if n > 1]
        never = sorted(set(want) - set(seen))
        if twice:
            raise wrong(f"token {twice[0][1]} of document {twice[0][0]} is in two rows.")
        if never:
            d, t = never[0]
            raise wrong(
                f"{len(never)} tokens never made it into a row, e.g. token {t} of document "
                f"{d} ({len(docs[d])} tokens long): keep every token, splitting documents "
                "longer than a row."
            )
        return (
            f"4 ranks packed {DOCS} documents ({len(want)} tokens) into {rows} rows of "
            f"{row_lens[0]} and {row_lens[1]} tokens (call by call): every token once, no "
            "attention across documents or to padding."
        )

    return judge("pack", body)


def _padding(plan: list[list[int]], lengths: list[int]) -> float:
    """Share of a plan's padded tokens that are padding."""
    padded = sum(len(b) * max(lengths[i] for i in b) for b in plan)
    return 1 - sum(lengths[i] for b in plan for i in b) / max(padded, 1)


def _allowed_drop(lengths: list[int], dp: int, budget: int) -> float:
    """Tokens a plan may leave out: 15% of all, or twice what agreeing on MIN drops, if more.

    Agreeing on the smallest count (fix 2) has no bound of its own: a replica with many
    more batches than the others drops them all. The margin (twice, plus one budget per
    replica) covers a per-replica plan sharded another way than the library's.
    """
    own = [shard_then_plan(lengths, r, dp, budget) for r in range(dp)]
    fewest = min(len(p) for p in own)
    dropped = sum(lengths[i] for p in own for b in p[fewest:] for i in b)
    return max(0.15 * sum(lengths), 2 * dropped + dp * budget)


def _judge_plan(got: list[Any], lengths: list[int], dp: int, budget: int, case: str) -> str:
    """Stop at the first fault of one drawn case's plans; what they achieved otherwise."""
    counts = [len(plan) for plan, _ in got]
    if len(set(counts)) > 1:
        raise wrong(
            f"{case}: the replicas planned {counts} batches: after {min(counts)} steps the "
            "longer ones would wait in the next all-reduce. Plan over all documents "
            "and deal whole batches, or agree on the count."
        )
    if any(steps != counts[0] for _, steps in got):
        raise wrong(f"{case}: the ranks did not take one step per planned batch.")
    ids = Counter(i for plan, _ in got for batch in plan for i in batch)
    for rank, (plan, _) in enumerate(got):
        for s, batch in enumerate(plan):
            if not batch:
                raise wrong(f"{case}, rank {rank}, step {s}: an empty batch trains on nothing.")
            bad = [i for i in batch if not 0 <= i < len(lengths)]
            if bad:
                raise wrong(f"{case}, rank {rank}, step {s}: {bad[0]} is not a document id.")
            cost = len(batch) * max(lengths[i] for i in batch)
            if cost > budget:
                raise wrong(
                    f"{case}, rank {rank}, step {s}: {len(batch)} documents padded to the "
                    f"longest, {max(lengths[i] for i in batch)}, make {cost} tokens > budget "
                    f"{budget}."
                )
    twice = [i for i, n in ids.items() if n > 1]
    if twice:
        raise wrong(f"{case}: document {twice[0]} is planned {ids[twice[0]]} times in one epoch.")
    planned, total = sum(lengths[i] for i in ids), sum(lengths)
    if total - planned > _allowed_drop(lengths, dp, budget):
        raise wrong(
            f"{case}: only {planned} of {total} tokens are planned this epoch: drop at most "
            "what equal counts need (a global plan dealt whole, or each replica's own plan cut "
            "to the smallest count, agreed with all_reduce(MIN)), not a count fixed in advance."
        )
    plans = [batch for plan, _ in got for batch in plan]
    pad, fill = _padding(plans, lengths), planned / (budget * len(plans))
    best = budget_batches(lengths, list(ids), budget)
    sorted_pad, sorted_fill = _padding(best, lengths), planned / (budget * len(best))
    if fill < FILL * sorted_fill:
        raise wrong(
            f"{case}: the batches use {fill:.0%} of the budget on average, where batches sorted "
            f"by length over the same documents use {sorted_fill:.0%}: put as many documents in "
            "a batch as the budget allows."
        )
    if pad > sorted_pad + EXCESS_PAD:
        raise wrong(
            f"{case}: {pad:.0%} of the padded tokens are padding, where batches sorted by "
            f"length over the same documents pad {sorted_pad:.0%}: put documents of similar "
            "length together (sort by length, longest first), as many as the budget allows."
        )
    return f"{counts[0]} steps each, {planned / total:.0%} of the tokens, {pad:.0%} padding"


def check_budget_plan(
    fn: Callable[[list[int], int, int, int], list[list[int]]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 11, exercise 2: ``fn(lengths, dp_rank, dp_size, budget)`` plans equal step counts.

    Two cases drawn per check, the second with about three times the batches: the DP
    size (2 to 4), a budget (2 to 6 times the longest document), 160 to 240 documents
    (three times as many in the second) of 2 to the longest tokens. Each step of the
    plan ends in an all-reduce over all ranks.
    """
    seed = fresh_seed()

    def body() -> str:
        rng = random.Random(seed)
        said = []
        for scale in (1, 3):
            dp = rng.choice((2, 3, 4))
            longest = rng.choice((32, 48, 64))
            budget = longest * rng.choice((2, 3, 4, 6))
            n = scale * rng.randint(160, 240)
            lengths = jobs.budget_lengths(rng.randrange(2**31), n, longest, budget, dp)
            case = f"{n} documents, budget {budget}, dp {dp}"
            got = run_learner(
                jobs.job_budget_plan, fn, lengths, budget, world_size=dp, timeout=timeout
            )
            each_returned(got, "this replica's list of batches")
            said.append(f"{case}: {_judge_plan(got, lengths, dp, budget, case)}")
        return (
            "every replica took as many steps, each document at most once, little left out "
            "and little padding (" + "; ".join(said) + ")."
        )

    return judge("budget_plan", body)
