"""A tiny causal language model with one attention layer, to show what a mask changes.

Small enough to run a forward pass per rank in milliseconds on a CPU; its only job is
to make attention's reach visible: with :func:`~ezpz_nb.text.pack.document_mask` a
token's logits depend on its own document only.
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["TinyLM"]


class TinyLM(nn.Module):
    """Token + position embeddings, one attention layer, a residual MLP, a head.

    Args:
        vocab_size: Number of token ids.
        max_len: Largest position id + 1.
        dim: Width.
        seed: Initial weights (same seed, same model on every rank).
    """

    def __init__(self, vocab_size: int, max_len: int, dim: int = 32, seed: int = 0) -> None:
        super().__init__()
        gen = torch.random.fork_rng(devices=[])
        with gen:
            torch.manual_seed(seed)
            self.tok = nn.Embedding(vocab_size, dim)
            self.pos = nn.Embedding(max_len, dim)
            self.qkv = nn.Linear(dim, 3 * dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
            self.head = nn.Linear(dim, vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(rows, L, vocab)``.

        Args:
            input_ids: ``(rows, L)`` token ids.
            position_ids: ``(rows, L)``; default ``0 .. L-1`` on every row.
            mask: ``(rows, L, L)`` bool, True where query may see key; default causal.
        """
        rows, length = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(length).expand(rows, length)
        if mask is None:
            mask = torch.ones(length, length, dtype=torch.bool).tril().expand(rows, -1, -1)
        x = self.tok(input_ids) + self.pos(position_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        # A masked key gets exp(-inf) = 0 exactly: its value adds exact zeros.
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + weights @ v
        x = x + self.mlp(x)
        return self.head(x)
