"""The planner's small run: a few transformer layers split with lesson 17's tensor parallelism,
trained one Adam step inside a rank, and what the rank holds counted by memory.py's meters, to
hold planning.plan_memory's estimate against (lesson 21).

Each layer is x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)), the shape the planner
counts (12 h^2 + 13 h parameters); a final LayerNorm ends the stack. No embedding: the input is a
(sequence, batch, hidden) tensor of activations.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from .from_scratch.tensor_parallel import split_attention, split_mlp
from .from_scratch.transformer_parts import MLP, Attention
from .memory import measure_training_step
from .planning import TransformerShape


class Layer(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(hidden), Attention(hidden, heads)
        self.norm2, self.mlp = nn.LayerNorm(hidden), MLP(hidden)

    def forward(self, x):
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Stack(nn.Module):
    """The layers and a final LayerNorm; `checkpointing` keeps only each layer's input."""

    def __init__(self, shape: TransformerShape, checkpointing: bool = False, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.layers = nn.ModuleList(Layer(shape.hidden, shape.heads) for _ in range(shape.layers))
        self.norm = nn.LayerNorm(shape.hidden)
        self.checkpointing = checkpointing

    def split(self):
        """Each layer's attention and MLP split over every rank (lesson 17)."""
        for layer in self.layers:
            layer.attention, layer.mlp = split_attention(layer.attention), split_mlp(layer.mlp)
        return self

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpointing else layer(x)
        return self.norm(x)


def small_shape(layers: int = 2, hidden: int = 64, heads: int = 4, seq_len: int = 32) -> TransformerShape:
    """A stack small enough for a CPU: no vocabulary, no learned positions."""
    return TransformerShape(layers, hidden, heads, vocab=0, positions=0, seq_len=seq_len)


def measure_on_rank(shape: TransformerShape, micro_batch: int, checkpointing: bool = False) -> dict:
    """Inside a rank: the stack split over every rank, one Adam step in fp32; this rank's bytes of
    parameters, gradients, optimizer state and saved activations, as a plain dict."""
    model = Stack(shape, checkpointing)
    if dist.is_initialized():
        model.split()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(shape.seq_len, micro_batch, shape.hidden, generator=torch.Generator().manual_seed(1))
    measured = measure_training_step(model, optimizer, x, None, loss_fn=lambda output, _: output.pow(2).mean())
    return {part.replace(" ", "_"): value for part, value in measured.parts().items()}
