"""Planning a model that does not fit one GPU: a transformer's shape and its parameter count, a
parallel recipe (data, tensor and pipeline parallel sizes, ZeRO stage, activation checkpointing,
optimizer offload), and the bytes one GPU holds under it (lesson 21). A model: it leaves out the
CUDA context and the caching allocator's rounding and fragmentation; temporary buffers (a matmul's
workspace, the logits and their softmax, an all-gather's output); the collectives' buffers (NCCL's,
DDP's buckets); the other stages, which hold fewer micro-batches.

Per layer (GPT-style, LayerNorm before attention and MLP, MLP 4h wide): 12 h^2 + 13 h parameters.
Tensor parallelism (lesson 17, Megatron-LM's split) divides the column-parallel weights and biases
and the row-parallel weights by t; the two LayerNorms and the row-parallel biases (6 h) stay whole
on every rank. Stage 0 of a pipeline holds its L / p layers and the embeddings (the word embedding
split over t by vocabulary rows); with one stage it holds the final LayerNorm too.
"""
import dataclasses
from dataclasses import dataclass

from .memory import MemoryBreakdown, estimate_memory

# Megatron-LM's per-layer activations with tensor parallelism and no sequence parallelism
# (Korthikanti et al., 2022, arXiv:2205.05198, eq. 2 without the 5as/h scores: a fused attention
# keeps none): s*b*h*(10 + 24/t) bytes of 16-bit values. 10: the two LayerNorms' inputs, the
# inputs of qkv and fc1 (whole on every TP rank), two dropout masks; 24/t: q, k, v, the attention
# output, fc1's output and gelu's output (this rank's heads and columns only).
WHOLE_ON_EVERY_TP_RANK, SPLIT_OVER_TP = 10, 24

@dataclass(frozen=True)
class TransformerShape:
    layers: int
    hidden: int
    heads: int
    vocab: int       # the word embedding, tied with the output layer
    positions: int   # learned position embeddings (0: rotary, none learned)
    seq_len: int     # tokens of one training sequence

    def layer_parameters(self) -> int:
        h = self.hidden
        return 12 * h * h + 13 * h

    @property
    def parameters(self) -> int:
        h = self.hidden
        return self.layers * self.layer_parameters() + (self.vocab + self.positions) * h + 2 * h


@dataclass(frozen=True)
class ParallelRecipe:
    dp: int
    tp: int
    pp: int
    zero: int = 0              # 0: DDP; 1, 2, 3: ZeRO's stages over the dp ranks
    checkpointing: bool = False
    offload: bool = False      # the optimizer state (master weights included) in CPU memory

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def describe(self) -> str:
        extras = ("+AC" if self.checkpointing else "") + ("+offload" if self.offload else "")
        return f"dp{self.dp} tp{self.tp} pp{self.pp} zero{self.zero}{extras}"


def parameters_per_gpu(shape: TransformerShape, recipe: ParallelRecipe) -> int:
    """Stage 0's parameters on one tensor-parallel rank, before any ZeRO sharding."""
    h, t = shape.hidden, recipe.tp
    replicated = 6 * h                        # 2 LayerNorms (weight, bias), 2 row-parallel biases
    split = shape.layer_parameters() - replicated
    layer = split // t + replicated
    embeddings = shape.vocab * h // t + shape.positions * h
    final_norm = 2 * h if recipe.pp == 1 else 0  # on the last stage
    return shape.layers // recipe.pp * layer + embeddings + final_norm


def layer_activation_bytes(shape: TransformerShape, tp: int, micro_batch: int,
                           value_bytes: int = 2) -> int:
    """One layer's saved activations for one micro-batch on one TP rank."""
    tokens = shape.seq_len * micro_batch * shape.hidden
    return int(tokens * (WHOLE_ON_EVERY_TP_RANK + SPLIT_OVER_TP / tp) * value_bytes / 2)


def activation_bytes_per_gpu(shape: TransformerShape, recipe: ParallelRecipe, micro_batch: int = 1,
                             microbatches: int = 1, value_bytes: int = 2) -> int:
    """Stage 0's activations at their peak. Under 1F1B stage 0 holds min(p, m) micro-batches at
    once (lesson 18); with every layer checkpointed each keeps its input, and one layer at a time
    is recomputed whole during the backward pass."""
    layers = shape.layers // recipe.pp
    in_flight = min(recipe.pp, microbatches)
    full_layer = layer_activation_bytes(shape, recipe.tp, micro_batch, value_bytes)
    if recipe.checkpointing:
        layer_input = shape.seq_len * micro_batch * shape.hidden * value_bytes
        return in_flight * layers * layer_input + full_layer
    return in_flight * layers * full_layer


def plan_memory(shape: TransformerShape, recipe: ParallelRecipe, micro_batch: int = 1,
                microbatches: int = 1, precision: str = "bf16-mixed",
                optimizer: str = "adam") -> MemoryBreakdown:
    """What one GPU (stage 0, the heaviest) holds: model state by lesson 11's memory.estimate_memory
    layout (ZeRO's: bf16-mixed Adam is 2 + 2 + 12 bytes), ZeRO sharding over the dp ranks,
    offload moving the optimizer state off the GPU, and the activations (16-bit unless fp32)."""
    value_bytes = 4 if precision == "fp32" else 2
    activations = activation_bytes_per_gpu(shape, recipe, micro_batch, microbatches, value_bytes)
    held = estimate_memory(parameters_per_gpu(shape, recipe), optimizer, precision,
                           f"zero{recipe.zero}" if recipe.zero else "ddp", recipe.dp, activations)
    return dataclasses.replace(held, optimizer_state=0) if recipe.offload else held
