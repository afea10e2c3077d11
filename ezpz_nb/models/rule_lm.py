"""The capstone's model and data: a tiny decoder, and sequences that follow one rule.

Used by the walkthroughs (:mod:`ezpz_nb.examples.capstone`, ``dcp_resume``), the
workshop's checkers (notebooks 08 and 15) and the tests, so it lives here rather than
in a walkthrough script.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from ezpz_nb.data.distributed import splitmix64

__all__ = ["SEQ", "VOCAB", "Attention", "Block", "CapstoneLM", "RuleTokenDataset"]

VOCAB = 32
SEQ = 16


class RuleTokenDataset(Dataset):
    """Sequences that follow one rule, ``next = (5 * token + 3) % vocab``, from a random start.

    Uniform random tokens carry no signal (every model's loss stays at
    ``ln vocab``); here the next token is a function of the current one, so the
    loss falls as the model learns the rule. Sample ``i`` depends only on
    ``(seed, i)``, the same on every rank, like ``RandomTokenDataset``.

    Items are ``{"input_ids", "labels", "index"}`` as in ``RandomTokenDataset``.
    """

    def __init__(
        self,
        vocab_size: int = VOCAB,
        seq_length: int = SEQ,
        *,
        num_samples: int = 256,
        seed: int = 0,
    ) -> None:
        self.vocab_size, self.seq_length = vocab_size, seq_length
        self.num_samples, self.seed = num_samples, seed

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, i: int) -> dict[str, Any]:
        if not 0 <= i < self.num_samples:
            raise IndexError(f"sample {i} out of range for {self.num_samples} samples")
        start = splitmix64((self.seed << 40) ^ i) % self.vocab_size
        tokens = [start]
        for _ in range(self.seq_length):
            tokens.append((5 * tokens[-1] + 3) % self.vocab_size)
        t = torch.tensor(tokens)
        return {"input_ids": t[:-1], "labels": t[1:], "index": i}


class Attention(nn.Module):
    """Causal self-attention; under TP each rank holds ``heads / tp`` of the heads."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1, not the head count: after ColwiseParallel a rank holds only its heads.
        q, k, v = (
            w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv)
        )
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Block(nn.Module):
    """Pre-norm transformer block: attention, then an MLP, each with a residual."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.w1, self.w2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.w2(F.gelu(self.w1(self.norm2(x))))


class CapstoneLM(nn.Module):
    """Token + position embeddings, ``layers`` blocks, a final norm and an output head."""

    def __init__(
        self, vocab: int = VOCAB, seq: int = SEQ, dim: int = 32, heads: int = 4, layers: int = 2
    ) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
