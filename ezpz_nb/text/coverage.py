"""Did every token of every document reach exactly one rank this epoch? :func:`check_documents`.

The ledger records which packed rows each rank held (``sample_ids``) and the documents
in each row (``row_docs``, format 4). With the :class:`~ezpz_nb.text.PackedRows` the run
used, each row id maps back to its pieces, so the check counts tokens, not rows: a
document split over three rows is whole when its three pieces were seen once each.
"""

from __future__ import annotations

from collections import Counter

from ezpz_nb.ledger import Ledger, Problem
from ezpz_nb.text.pack import PackedRows

__all__ = ["check_documents"]


def check_documents(ledger: Ledger, rows: PackedRows, epoch: int = 0) -> list[Problem]:
    """Documents of ``rows`` that some rank saw twice, or no rank saw, in ``epoch``.

    Args:
        ledger: The run's ledger (every rank's steps of ``epoch``).
        rows: The packed dataset the ranks loaded (same corpus, row length, seed).
        epoch: The epoch to check.

    Returns:
        ``doc_duplicate`` (tokens of a document held twice: the same row on two DP
        replicas, or a row read twice; TP and CP peers share their replica's rows) and ``doc_never_seen`` (documents with tokens in
        no row held), with the document ids in ``samples``; empty when every token
        of every document was held exactly once.

    Raises:
        ValueError: A recorded row does not hold the documents ``rows`` says it does
            (the ledger is of another corpus, row length or seed).
    """
    held: Counter[tuple[int, int]] = Counter()  # (doc, token offset) -> times held
    where: dict[int, tuple[int, int]] = {}  # doc -> (rank, step) where first held
    for rec in ledger.records:
        if rec.epoch != epoch or rec.tp_rank or rec.cp_rank:
            continue  # TP and CP peers hold their replica's rows: count each replica once
        for k, row in enumerate(rec.sample_ids):
            pieces = rows.rows[row]
            docs = tuple(dict.fromkeys(d for d, _, _ in pieces))
            if rec.row_docs and rec.row_docs[k] != docs:
                raise ValueError(
                    f"rank {rec.rank} step {rec.step}: row {row} held documents "
                    f"{rec.row_docs[k]}, but these rows say {docs}: pass the PackedRows the "
                    "run used (same corpus, row length and seed)"
                )
            for doc, start, end in pieces:
                held.update((doc, t) for t in range(start, end))
                where.setdefault(doc, (rec.rank, rec.step))
    lengths = rows.corpus.lengths
    twice = sorted({d for (d, _), n in held.items() if n > 1})
    seen_tokens = Counter(d for d, _ in held)
    never = sorted(d for d in range(rows.corpus.num_docs) if seen_tokens[d] < lengths[d])
    problems = []
    if twice:
        rank, step = where[twice[0]]
        problems.append(
            Problem(
                "doc_duplicate",
                f"Epoch {epoch}: {len(twice)} document(s) had tokens held twice, e.g. "
                f"{rows.corpus.names[twice[0]]}: a row went to two ranks (sharded over the "
                "world instead of DP?) or was read twice.",
                epoch,
                samples=tuple(twice),
                first=(rank, step, twice[0]),
            )
        )
    if never:
        problems.append(
            Problem(
                "doc_never_seen",
                f"Epoch {epoch}: {len(never)} document(s) had tokens in no row held, e.g. "
                f"{rows.corpus.names[never[0]]}: rows dropped (drop_last, a trimmed "
                "count) or never loaded.",
                epoch,
                samples=tuple(never),
            )
        )
    return problems
