"""Real text on real ranks: a corpus, a tokenizer, a shared token cache, padding and packing.

The pipeline, each step a function you can read on its own::

    docs = stdlib_documents()                      # the stdlib's .py files, offline
    tok = train_tokenizer(docs)                    # BPE in about a second (bytes without it)
    corpus = build_corpus(docs, tok, "tokens.npy") # tokenized once, memory-mapped by every rank
    pieces = split_pieces(corpus, 256)             # long documents split, never dropped
    plan = plan_then_shard([e - s for _, s, e in pieces], dp_size=2, budget=2048)
    rows = PackedRows(corpus, 256)                 # or pack: full rows, doc_ids, position_ids

:func:`stdlib_corpus` does the first three in one call.
"""

from __future__ import annotations

from pathlib import Path

from ezpz_nb.text.corpus import (
    Document,
    TextError,
    TextTokenizer,
    TokenCorpus,
    build_corpus,
    stdlib_documents,
    train_tokenizer,
)
from ezpz_nb.text.coverage import check_documents
from ezpz_nb.text.pack import (
    IGNORE,
    PackedRows,
    PadCollate,
    Piece,
    check_row_length,
    document_mask,
    pack_rows,
    packed_batch,
    split_pieces,
)
from ezpz_nb.text.plan import budget_batches, check_budget, plan_then_shard, shard_then_plan

__all__ = [
    "IGNORE",
    "Document",
    "PackedRows",
    "PadCollate",
    "Piece",
    "TextError",
    "TextTokenizer",
    "TokenCorpus",
    "budget_batches",
    "build_corpus",
    "check_documents",
    "check_budget",
    "check_row_length",
    "document_mask",
    "pack_rows",
    "packed_batch",
    "plan_then_shard",
    "shard_then_plan",
    "split_pieces",
    "stdlib_corpus",
    "stdlib_documents",
    "train_tokenizer",
]


def stdlib_corpus(
    folder: str | Path, *, max_docs: int = 64, vocab_size: int = 512, kind: str = "auto"
) -> tuple[TokenCorpus, TextTokenizer]:
    """The stdlib corpus tokenized into ``folder/tokens.npy``, with its tokenizer.

    Args:
        folder: Where the cache file goes (a temporary folder in the notebooks).
        max_docs: Documents to take (see :func:`stdlib_documents`).
        vocab_size: BPE vocabulary size.
        kind: ``"auto"`` (BPE if HF ``tokenizers`` is installed, else bytes),
            ``"bpe"`` or ``"bytes"``.

    Raises:
        TextError: Too few documents found, or an impossible tokenizer request.
    """
    docs = stdlib_documents(max_docs)
    tok = train_tokenizer(docs, vocab_size, kind=kind)
    return build_corpus(docs, tok, Path(folder) / "tokens.npy"), tok
