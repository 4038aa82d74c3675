"""The unsplit pieces of a transformer layer that lesson 17 splits across ranks: an MLP, a causal
attention whose heads sit side by side in one fused projection, and a LayerNorm-MLP block.

Activations are (sequence, batch, hidden), Megatron-LM's order: the sequence is dim 0, so a
sequence shard is a contiguous slice and all_gather/reduce_scatter of flat tensors join or split it.
"""
import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, hidden: int = 16, expansion: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(hidden, expansion * hidden)
        self.fc2 = nn.Linear(expansion * hidden, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Attention(nn.Module):
    """Causal self-attention. `qkv`'s output is laid out head by head ([q k v] of head 0, then of
    head 1...), so a contiguous slice of its rows holds whole heads: split it, split the heads."""

    def __init__(self, hidden: int = 16, heads: int = 4):
        super().__init__()
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        seq, batch, _ = x.shape
        # -1: however many heads this rank holds (all of them in one process)
        q, k, v = self.qkv(x).view(seq, batch, -1, 3 * self.head_dim).permute(1, 2, 0, 3).chunk(3, -1)
        heads = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(heads.permute(2, 0, 1, 3).reshape(seq, batch, -1))


class Block(nn.Module):
    """x + dropout(MLP(LayerNorm(x))): the part of a transformer layer sequence parallelism wraps."""

    def __init__(self, hidden: int = 16, dropout: float = 0.0):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.dropout(self.mlp(self.norm(x)))


def make_part(kind: str, seed: int = 0, hidden: int = 16, **options) -> nn.Module:
    """The same weights in every process that asks with the same seed; `options` go to the part
    (e.g. heads= for the attention)."""
    torch.manual_seed(seed)
    return {"mlp": MLP, "attention": Attention, "block": Block}[kind](hidden, **options)
