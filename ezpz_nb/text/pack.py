"""From documents to batches: padded batches, packed rows, and the masks that keep documents apart.

A *piece* is ``(doc, start, end)``: tokens ``start:end`` of one document. Documents
longer than the row length are **split** into pieces of at most the row length by
:func:`split_pieces` (``overflow="reject"`` raises instead); every later step works on
pieces, so no token is ever dropped or duplicated by the plan.

Two ways to batch pieces:

* **padded** (:class:`PadCollate`): one piece per row, padded to the longest in the
  batch; ``real_tokens`` / ``pad_tokens`` say what the padding cost.
* **packed** (:func:`pack_rows`, :class:`PackedRows`): pieces concatenated in order
  and cut into rows of exactly ``row_len`` tokens (a piece that does not fit continues
  in the next row), so nothing is padded except the epoch's last row. Each row carries
  ``doc_ids`` per token and ``position_ids`` that restart at every piece;
  :func:`document_mask` turns ``doc_ids`` into the block-diagonal causal mask that stops
  a token attending to another document.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from ezpz_nb.text.corpus import TextError, TokenCorpus

__all__ = [
    "IGNORE",
    "PackedRows",
    "PadCollate",
    "Piece",
    "check_row_length",
    "document_mask",
    "pack_rows",
    "packed_batch",
    "split_pieces",
]

#: A piece of a document: ``(doc, start, end)`` token offsets within it.
Piece = tuple[int, int, int]
#: Label of a position with nothing to predict (torch's cross-entropy ``ignore_index``).
IGNORE = -100


def check_row_length(row_len: object) -> int:
    """Return ``row_len`` if it is an int of at least 2, else raise :class:`TextError`.

    A row of one token has no next token to predict.
    """
    if isinstance(row_len, bool) or not isinstance(row_len, int) or row_len < 2:
        raise TextError(
            f"row length {row_len!r}: use an int of at least 2 (a row needs a token and "
            "the next one to predict)"
        )
    return row_len


def split_pieces(corpus: TokenCorpus, max_len: int, *, overflow: str = "split") -> list[Piece]:
    """Every document as pieces of at most ``max_len`` tokens, in document order.

    Args:
        corpus: The tokenized documents.
        max_len: Most tokens in a piece (the row length).
        overflow: ``"split"`` cuts a longer document into consecutive pieces (each
            attends only to itself, its position ids restart at 0); ``"reject"``
            raises instead.

    Raises:
        TextError: ``max_len`` below 2, an unknown ``overflow``, or with
            ``"reject"`` a document longer than ``max_len`` (named, with its length).
    """
    check_row_length(max_len)
    if overflow not in ("split", "reject"):
        raise TextError(f"overflow={overflow!r}: use 'split' or 'reject'")
    lengths = corpus.lengths
    if overflow == "reject" and (over := np.flatnonzero(lengths > max_len)).size:
        i = int(over[0])
        raise TextError(
            f"{over.size} documents are longer than the row length {max_len}, e.g. "
            f"{corpus.names[i]} ({int(lengths[i])} tokens): raise the row length, or "
            "pass overflow='split' to cut them into pieces"
        )
    return [
        (doc, start, min(start + max_len, int(n)))
        for doc, n in enumerate(lengths)
        for start in range(0, int(n), max_len)
    ]


def _labels(tokens: torch.Tensor) -> torch.Tensor:
    """Next token of each position within one piece; the last has nothing to predict."""
    out = torch.full_like(tokens, IGNORE)
    out[:-1] = tokens[1:]
    return out


class PadCollate:
    """Collate piece ids into one padded batch: a row per piece, padded to the longest.

    Returns ``input_ids``, ``labels`` (``IGNORE`` on padding and on each piece's last
    token), ``attention_mask`` (1 real, 0 pad), ``index`` (the piece ids, which the
    ledger records), ``real_tokens`` and ``pad_tokens`` (scalars for the batch).
    """

    def __init__(self, corpus: TokenCorpus, pieces: Sequence[Piece]) -> None:
        self.corpus, self.pieces = corpus, list(pieces)

    def __call__(self, ids: Sequence[int]) -> dict[str, torch.Tensor]:
        toks = []
        for i in ids:
            doc, start, end = self.pieces[int(i)]
            toks.append(torch.from_numpy(self.corpus.doc(doc)[start:end].astype(np.int64)))
        width = max(len(t) for t in toks)
        input_ids = torch.full((len(toks), width), self.corpus.eos_id, dtype=torch.int64)
        labels = torch.full_like(input_ids, IGNORE)
        mask = torch.zeros_like(input_ids)
        for r, t in enumerate(toks):
            input_ids[r, : len(t)] = t
            labels[r, : len(t)] = _labels(t)
            mask[r, : len(t)] = 1
        real = int(mask.sum())
        return {
            "input_ids": input_ids,
            "labels": labels,
            "attention_mask": mask,
            "index": torch.tensor([int(i) for i in ids]),
            "real_tokens": torch.tensor(real),
            "pad_tokens": torch.tensor(mask.numel() - real),
        }


def pack_rows(pieces: Sequence[Piece], row_len: int) -> list[list[Piece]]:
    """Cut the concatenation of ``pieces`` (in the order given) into rows of ``row_len``.

    A piece that does not fit in what is left of a row is split there and continues
    at the start of the next row; consecutive pieces of one document that meet in a
    row become one segment. Every token of every piece lands in exactly one row; only
    the last row may be short.
    """
    check_row_length(row_len)
    rows: list[list[Piece]] = [[]]
    room = row_len
    for doc, start, end in pieces:
        while start < end:
            if room == 0:
                rows.append([])
                room = row_len
            take = min(room, end - start)
            row = rows[-1]
            if row and row[-1][0] == doc and row[-1][2] == start:
                # The next piece of the same document: one segment, so that positions
                # and the mask (both keyed on the document) agree.
                row[-1] = (doc, row[-1][1], start + take)
            else:
                row.append((doc, start, start + take))
            start += take
            room -= take
    return [r for r in rows if r]


def packed_batch(
    corpus: TokenCorpus, rows: Sequence[Sequence[Piece]], row_len: int
) -> dict[str, torch.Tensor]:
    """Tensors of packed ``rows``, each ``row_len`` wide.

    Returns ``input_ids``, ``labels`` (within each piece only), ``position_ids``
    (0, 1, ... from each piece's start), ``doc_ids`` (the document of each token, -1
    on padding), ``real_tokens`` and ``pad_tokens``.
    """
    n = len(rows)
    input_ids = torch.full((n, row_len), corpus.eos_id, dtype=torch.int64)
    labels = torch.full_like(input_ids, IGNORE)
    position_ids = torch.zeros_like(input_ids)
    doc_ids = torch.full_like(input_ids, -1)
    for r, row in enumerate(rows):
        at = 0
        for doc, start, end in row:
            t = torch.from_numpy(corpus.doc(doc)[start:end].astype(np.int64))
            input_ids[r, at : at + len(t)] = t
            labels[r, at : at + len(t)] = _labels(t)
            position_ids[r, at : at + len(t)] = torch.arange(len(t))
            doc_ids[r, at : at + len(t)] = doc
            at += len(t)
    real = int((doc_ids >= 0).sum())
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids,
        "doc_ids": doc_ids,
        "real_tokens": torch.tensor(real),
        "pad_tokens": torch.tensor(doc_ids.numel() - real),
    }


def document_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Block-diagonal causal mask of packed rows: query ``i`` may see key ``j <= i`` of its document.

    Args:
        doc_ids: ``(rows, L)`` document of each token (padding, -1, sees only padding).

    Returns:
        ``(rows, L, L)`` bool, True where attention is allowed.
    """
    length = doc_ids.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return causal & (doc_ids.unsqueeze(-1) == doc_ids.unsqueeze(-2))


class PackedRows(Dataset):
    """The corpus packed into rows of ``row_len``: a map-style dataset of rows.

    The documents are shuffled once (``seed``), split into pieces, and packed with
    :func:`pack_rows`; shard the rows with a ``DistributedSampler`` and every replica
    gets the same number of full rows. Each item is :func:`packed_batch` of one row
    (row dimension dropped) plus ``index``, the row id.

    ``multiple_of=dp_size`` keeps only a multiple of ``dp_size`` rows, so that a
    ``DistributedSampler`` has nothing to pad or drop and the ledger's "never seen"
    check counts the rows that exist: the last ``len % dp_size`` rows (fewer than
    ``dp_size`` rows of tokens) are left out, and ``dropped_tokens`` says how many.

    Raises:
        TextError: ``row_len`` below 2, ``multiple_of`` below 1 or above the number of
            rows, or ``overflow="reject"`` with a longer document.
    """

    def __init__(
        self,
        corpus: TokenCorpus,
        row_len: int,
        *,
        seed: int = 0,
        overflow: str = "split",
        multiple_of: int = 1,
    ) -> None:
        self.corpus, self.row_len = corpus, check_row_length(row_len)
        order = np.random.default_rng(seed).permutation(corpus.num_docs)
        pieces = split_pieces(corpus, row_len, overflow=overflow)
        by_doc: dict[int, list[Piece]] = {}
        for p in pieces:
            by_doc.setdefault(p[0], []).append(p)
        rows = pack_rows([p for d in order for p in by_doc[int(d)]], row_len)
        if not 1 <= multiple_of <= len(rows):
            raise TextError(
                f"multiple_of={multiple_of} with {len(rows)} rows: use 1 to {len(rows)} "
                "(more documents, or shorter rows, give more rows)"
            )
        keep = len(rows) - len(rows) % multiple_of
        self.rows = rows[:keep]
        self.dropped_tokens = sum(e - s for row in rows[keep:] for _, s, e in row)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        batch = packed_batch(self.corpus, [self.rows[i]], self.row_len)
        out = {k: v[0] if v.dim() else v for k, v in batch.items()}
        out["index"] = torch.tensor(i)
        return out
