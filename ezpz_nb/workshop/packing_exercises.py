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
batches of document ids, with ``len(batch) * longest <= budget``. Judged on 4 real
ranks: equal step counts, no document twice, at least 85% of the tokens planned, and
batches that fill on average at least 35% of the budget (so one document per batch,
equal counts or not, is turned down). A plan made globally and dealt over DP passes,
and so does a per-replica plan that agrees on the count with ``all_reduce(MIN)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from ezpz_nb.workshop import packing_jobs as jobs
from ezpz_nb.workshop.verdicts import (
    CHECK_TIMEOUT,
    CheckResult,
    each_returned,
    fresh_seed,
    judge,
    run_on_ranks,
    wrong,
)

__all__ = ["check_budget_plan", "check_pack"]

ROW_LEN, DOCS, PER_CALL = 16, 24, 3
LONGEST, BUDGET, PLAN_DOCS = 64, 256, 200


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
    ranks; each rank packs its own 3 at a time with ``fn``.
    """
    seed = fresh_seed()

    def body() -> str:
        docs = jobs.pack_docs(seed, DOCS, ROW_LEN)
        got = run_on_ranks(jobs.job_pack, fn, docs, ROW_LEN, PER_CALL, timeout=timeout)
        each_returned(got, "the packed rows of every call")
        seen: Counter[tuple[int, int]] = Counter()
        rows = 0
        for rank, calls in enumerate(got):
            for c, out in enumerate(calls):
                ids, pos, mask = out["input_ids"], out["position_ids"], out["mask"]
                shape = (len(ids), len(ids[0]) if ids else 0)
                if not ids or shape[1] != ROW_LEN or len(pos) != shape[0] or len(mask) != shape[0]:
                    raise wrong(
                        f"rank {rank}, call {c}: input_ids has shape {shape}, position_ids "
                        f"{len(pos)} rows, mask {len(mask)}: return rows x {ROW_LEN} tensors "
                        f"and a rows x {ROW_LEN} x {ROW_LEN} mask."
                    )
                pad = sum(t == jobs.PAD for row in ids for t in row)
                if pad >= ROW_LEN:
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
            f"4 ranks packed {DOCS} documents ({len(want)} tokens) into {rows} rows "
            f"of {ROW_LEN}: every token once, no attention across documents or to padding."
        )

    return judge("pack", body)


def check_budget_plan(
    fn: Callable[[list[int], int, int, int], list[list[int]]], *, timeout: float = CHECK_TIMEOUT
) -> CheckResult:
    """Notebook 11, exercise 2: ``fn(lengths, dp_rank, dp_size, budget)`` plans equal step counts.

    200 documents of fresh random lengths (2 to 64 tokens), a budget of 256 padded
    tokens, 4 DP ranks; each step of the plan ends in an all-reduce over all ranks.
    """
    seed = fresh_seed()

    def body() -> str:
        lengths = jobs.budget_lengths(seed, PLAN_DOCS, LONGEST, BUDGET, 4)
        got = run_on_ranks(jobs.job_budget_plan, fn, lengths, BUDGET, timeout=timeout)
        each_returned(got, "this replica's list of batches")
        counts = [len(plan) for plan, _ in got]
        if len(set(counts)) > 1:
            raise wrong(
                f"the replicas planned {counts} batches: after {min(counts)} steps the "
                "longer ones would wait in the next all-reduce. Plan over all documents "
                "and deal whole batches, or agree on the count."
            )
        if any(steps != counts[0] for _, steps in got):
            raise wrong("the ranks did not take one step per planned batch.")
        ids = Counter(i for plan, _ in got for batch in plan for i in batch)
        for rank, (plan, _) in enumerate(got):
            for s, batch in enumerate(plan):
                if not batch:
                    raise wrong(f"rank {rank}, step {s}: an empty batch trains on nothing.")
                bad = [i for i in batch if not 0 <= i < len(lengths)]
                if bad:
                    raise wrong(f"rank {rank}, step {s}: {bad[0]} is not a document id.")
                cost = len(batch) * max(lengths[i] for i in batch)
                if cost > BUDGET:
                    raise wrong(
                        f"rank {rank}, step {s}: {len(batch)} documents padded to the longest, "
                        f"{max(lengths[i] for i in batch)}, make {cost} tokens > budget {BUDGET}."
                    )
        twice = [i for i, n in ids.items() if n > 1]
        if twice:
            raise wrong(f"document {twice[0]} is planned {ids[twice[0]]} times in one epoch.")
        planned = sum(lengths[i] for i in ids)
        if planned < 0.85 * sum(lengths):
            raise wrong(
                f"only {planned} of {sum(lengths)} tokens are planned this epoch: drop at most "
                "a few batches to make the counts equal, not a large share of the data."
            )
        fill = planned / (BUDGET * sum(counts))
        if fill < 0.35:
            raise wrong(
                f"the batches use {fill:.0%} of the budget on average: put as many documents "
                "in a batch as the budget allows (sorting by length keeps padding low)."
            )
        return (
            f"every replica took {counts[0]} steps; {planned / sum(lengths):.0%} of the tokens "
            f"planned, each document at most once; batches fill {fill:.0%} of the budget."
        )

    return judge("budget_plan", body)
