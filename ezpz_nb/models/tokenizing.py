"""Documents made and tokenized on every read: data whose loading costs real CPU work.

Used by notebook 12's walkthrough (:mod:`ezpz_nb.examples.throughput`) and its
straggler exercise (:mod:`ezpz_nb.workshop.throughput`).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch.utils.data import Dataset

__all__ = ["VOCAB_SIZE", "TokenizingDataset", "tokenize"]

_SYLLABLES = ("ka", "to", "ri", "mu", "sen", "da", "lo", "pra", "ve", "nix", "qu", "est", "ion")
# Every syllable and every pair of them: a greedy longest-match tokenizer's vocabulary.
_VOCAB: dict[str, int] = {}
for _a in _SYLLABLES:
    _VOCAB.setdefault(_a, len(_VOCAB))
    for _b in _SYLLABLES:
        _VOCAB.setdefault(_a + _b, len(_VOCAB))
VOCAB_SIZE = len(_VOCAB)


def tokenize(text: str) -> list[int]:
    """Greedy longest match against the vocabulary: real CPU work, a few us a word."""
    out = []
    for word in text.split():
        j = 0
        while j < len(word):
            for n in range(min(6, len(word) - j), 0, -1):
                tok = _VOCAB.get(word[j : j + n])
                if tok is not None:
                    out.append(tok)
                    j += n
                    break
            else:
                out.append(0)
                j += 1
    return out


class TokenizingDataset(Dataset):
    """Documents generated from their index and tokenized on every ``__getitem__``.

    A sample is ``{"input_ids": the first seq_length tokens (0-padded),
    "length": the document's length in tokens, "index": index}``.

    Args:
        num_samples: Number of documents.
        seq_length: Tokens per sample (the document's first ones, padded with 0).
        words: Words per document (about 1 ms of tokenizing per 120 words here).
        heavy_rank: Documents ``i`` with ``i % world == heavy_rank`` are
            ``heavy_factor`` times longer (None: all the same length).
        heavy_factor: How much longer.
        world: The ``world`` of ``heavy_rank``.
    """

    def __init__(
        self,
        num_samples: int = 256,
        seq_length: int = 32,
        words: int = 120,
        heavy_rank: int | None = None,
        heavy_factor: int = 5,
        world: int = 1,
    ) -> None:
        if num_samples < 1 or seq_length < 1 or words < 1 or heavy_factor < 1 or world < 1:
            raise ValueError(
                "num_samples, seq_length, words, heavy_factor and world must be >= 1, got "
                f"{num_samples}, {seq_length}, {words}, {heavy_factor}, {world}"
            )
        self.num_samples, self.seq_length, self.words = num_samples, seq_length, words
        self.heavy_rank, self.heavy_factor, self.world = heavy_rank, heavy_factor, world

    def __len__(self) -> int:
        return self.num_samples

    def words_of(self, index: int) -> int:
        """How many words document ``index`` has."""
        heavy = self.heavy_rank is not None and index % self.world == self.heavy_rank
        return self.words * (self.heavy_factor if heavy else 1)

    def document(self, index: int) -> str:
        """Document ``index``'s text, made from its index (notebook 12's checker serves it)."""
        rng = random.Random(index)
        return " ".join(
            "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
            for _ in range(self.words_of(index))
        )

    def __getitem__(self, index: int) -> dict[str, Any]:
        ids = tokenize(self.document(index))
        length = len(ids)
        ids = ids[: self.seq_length] + [0] * (self.seq_length - length)
        return {"input_ids": torch.tensor(ids), "length": length, "index": index}
