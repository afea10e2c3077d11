"""A real corpus every Python has, a tokenizer trained on it, and a token cache the ranks share.

The documents are the standard library's own ``.py`` sources, one file a document:
no download, nothing copied into the repository, lengths from a few dozen tokens to
many thousands. Their text differs between Python versions, so code and tests rely on
properties (how many, how long), never on content.

Tokens are written once to a ``.npy`` file and opened with ``numpy.load(mmap_mode="r")``
in every process that reads them: the ranks share the page cache instead of each
holding a copy. A :class:`TokenCorpus` pickles as its path and offsets only.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ezpz_nb.errors import EzpzError

__all__ = [
    "Document",
    "TextError",
    "TextTokenizer",
    "TokenCorpus",
    "build_corpus",
    "stdlib_documents",
    "train_tokenizer",
]

#: Fewest documents a run can shard over several replicas and still teach anything.
MIN_DOCS = 8


class TextError(EzpzError, ValueError):
    """A text pipeline was asked for something it cannot do (raised before any rank starts)."""


@dataclass(frozen=True)
class Document:
    """One document: ``name`` (its path under the stdlib) and its ``text``."""

    name: str
    text: str


def stdlib_documents(
    max_docs: int = 64,
    *,
    max_bytes: int = 16_000,
    root: str | Path | None = None,
    min_docs: int = MIN_DOCS,
) -> list[Document]:
    """The standard library's top-level ``.py`` files as documents, chosen deterministically.

    Files of at most ``max_bytes`` are sorted by name and ``max_docs`` of them are taken
    evenly spaced over that list, so short and long files both come in whatever the
    Python version.

    Args:
        max_docs: How many documents at most.
        max_bytes: Skip files larger than this (keeps tokenizing to about a second).
        root: Where to look; default ``sysconfig.get_paths()["stdlib"]``.
        min_docs: Fewer documents than this is an error.

    Raises:
        TextError: Fewer than ``min_docs`` files found (an install that ships only
            ``.pyc``, a wrong ``root``): says where it looked and what to pass.
    """
    where = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p for p in where.glob("*.py") if p.is_file() and 0 < p.stat().st_size <= max_bytes
    )
    if len(files) < max(min_docs, 1):
        raise TextError(
            f"found {len(files)} .py files of at most {max_bytes} bytes in {where}; "
            f"a corpus needs at least {min_docs}. Pass root= a folder of .py files "
            "(e.g. a source checkout) or raise max_bytes."
        )
    take = min(max_docs, len(files))
    picks = sorted({round(i * (len(files) - 1) / max(take - 1, 1)) for i in range(take)})
    return [
        Document(files[i].name, files[i].read_text(encoding="utf-8", errors="replace"))
        for i in picks
    ]


class TextTokenizer:
    """A tokenizer with an end-of-document id: byte-level BPE (HF ``tokenizers``) or raw bytes.

    Attributes:
        kind: ``"bpe"`` or ``"bytes"``.
        vocab_size: Number of ids, the EOS id included.
        eos_id: The id appended after every document.
        note: One sentence for the learner: which tokenizer this is and why.
    """

    def __init__(self, kind: str, vocab_size: int, eos_id: int, note: str, bpe: Any = None):
        self.kind, self.vocab_size, self.eos_id, self.note = kind, vocab_size, eos_id, note
        self._bpe = bpe

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text (no EOS: :func:`build_corpus` adds it)."""
        if self._bpe is None:
            return [list(t.encode("utf-8")) for t in texts]
        return [e.ids for e in self._bpe.encode_batch(list(texts))]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (EOS dropped)."""
        keep = [int(i) for i in ids if int(i) != self.eos_id]
        if self._bpe is None:
            return bytes(keep).decode("utf-8", errors="replace")
        return str(self._bpe.decode(keep))


def train_tokenizer(
    docs: Sequence[Document], vocab_size: int = 512, *, kind: str = "auto"
) -> TextTokenizer:
    """Train a small byte-level BPE on ``docs`` (about a second), or fall back to bytes.

    Args:
        docs: The training text.
        vocab_size: BPE vocabulary size (EOS included); at least 258.
        kind: ``"bpe"`` (requires ``tokenizers``), ``"bytes"``, or ``"auto"``: BPE when
            ``tokenizers`` is installed, else bytes, saying so in ``note``.

    Raises:
        TextError: Unknown ``kind``, a vocabulary too small for byte-level BPE, or
            ``kind="bpe"`` without the ``tokenizers`` package.
    """
    if kind not in ("auto", "bpe", "bytes"):
        raise TextError(f"kind={kind!r}: use 'auto', 'bpe' or 'bytes'")
    if kind != "bytes":
        try:
            import tokenizers
        except ModuleNotFoundError:
            if kind == "bpe":
                raise TextError(
                    "kind='bpe' needs HF tokenizers: pip install 'ezpz_nb[notebook]' "
                    "(or tokenizers), or pass kind='bytes'"
                ) from None
        else:
            return _train_bpe(tokenizers, docs, vocab_size)
    return TextTokenizer(
        "bytes",
        257,
        256,
        "bytes: every UTF-8 byte is a token (HF `tokenizers` is not installed; "
        "pip install tokenizers for a BPE about 3x shorter)"
        if kind == "auto"
        else "bytes: every UTF-8 byte is a token",
    )


def _train_bpe(tokenizers: Any, docs: Sequence[Document], vocab_size: int) -> TextTokenizer:
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if vocab_size < 258:
        raise TextError(f"vocab_size={vocab_size}: byte-level BPE needs at least 258 ids")
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([d.text for d in docs], trainer=trainer)
    eos = bpe.token_to_id("<eos>")
    return TextTokenizer(
        "bpe",
        bpe.get_vocab_size(),
        eos,
        f"byte-level BPE, {bpe.get_vocab_size()} ids, trained here on the corpus",
        bpe,
    )


@dataclass
class TokenCorpus:
    """Tokenized documents in one memory-mapped file, shared by every process that opens it.

    Document ``i`` is ``tokens[offsets[i]:offsets[i + 1]]``; each ends with ``eos_id``.
    Pickling sends the path and the offsets (a few KB), never the tokens.

    Attributes:
        path: The ``.npy`` file of all tokens (uint16 or int32).
        offsets: ``num_docs + 1`` start offsets (int64).
        eos_id: The end-of-document id.
        vocab_size: Number of token ids.
        names: Each document's name.
    """

    path: Path
    offsets: np.ndarray
    eos_id: int
    vocab_size: int
    names: tuple[str, ...]
    _tokens: np.ndarray | None = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(vars(self))
        state["_tokens"] = None  # each process maps the file itself
        return state

    @property
    def tokens(self) -> np.ndarray:
        """All tokens, memory-mapped read-only (opened on first use in each process)."""
        if self._tokens is None:
            self._tokens = np.load(self.path, mmap_mode="r")
        return self._tokens

    @property
    def num_docs(self) -> int:
        """Number of documents."""
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per document, EOS included."""
        return np.diff(self.offsets)

    @property
    def num_tokens(self) -> int:
        """Tokens in the whole corpus."""
        return int(self.offsets[-1])

    def doc(self, i: int) -> np.ndarray:
        """Document ``i``'s tokens (a read-only view into the map, EOS last)."""
        return self.tokens[self.offsets[i] : self.offsets[i + 1]]


def build_corpus(
    docs: Sequence[Document], tokenizer: TextTokenizer, path: str | Path
) -> TokenCorpus:
    """Tokenize ``docs`` once, append EOS to each, write ``path`` (``.npy``) and map it.

    Raises:
        TextError: No documents, or a document that tokenizes to nothing.
    """
    if not docs:
        raise TextError("no documents to tokenize: pass at least one (see stdlib_documents)")
    ids = tokenizer.encode([d.text for d in docs])
    empty = [d.name for d, t in zip(docs, ids, strict=True) if not t]
    if empty:
        raise TextError(f"documents with no tokens: {empty[:3]}; drop empty documents first")
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32
    lengths = np.array([len(t) + 1 for t in ids], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.empty(int(offsets[-1]), dtype=dtype)
    for start, t in zip(offsets[:-1], ids, strict=True):
        flat[start : start + len(t)] = t
        flat[start + len(t)] = tokenizer.eos_id
    out = Path(path)
    if out.suffix != ".npy":  # numpy.save would append it anyway
        out = out.with_name(out.name + ".npy")
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, flat)
    return TokenCorpus(
        out, offsets, tokenizer.eos_id, tokenizer.vocab_size, tuple(d.name for d in docs)
    )
