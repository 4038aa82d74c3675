"""DDP (overlap, buckets), ZeRO-1 and FSDP built from hooks and collectives, short enough to read.

    ddp          DDPFromScratch: an all-reduce per gradient, or per bucket, launched in backward  (lesson 15)
    buckets      grouping gradients in reverse registration order up to bucket_cap_mb
    zero         ShardedOptimizer: ZeRO-1, each rank keeps the optimizer state of its share
    flat_parameters  FlatParameters: a module's parameters as views of one flat buffer, freed and refilled
    fsdp_unit    FSDPUnit: one unit with FSDP2's hooks and a prefetch, on FlatParameters   (lesson 16)
    fsdp         FSDPFromScratch: any module, unit by unit (tied weights, frozen parts, a compute dtype)
    events       what each wrapper did and when (`wrapper.events`), for graders and timelines
    transformer_parts  the unsplit MLP, attention (heads side by side) and LayerNorm block of lesson 17
    tensor_parallel    column- and row-parallel Linear, their autograd pair, an MLP and attention split   (lesson 17)
    sequence_parallel  all-gather / reduce-scatter around them, LayerNorm on the sequence shard
    pipeline     Stage: a rank's part of the model, joined to its neighbours by isend/recv   (lesson 18)
    pipeline_schedules  GPipe and 1F1B orders, played out on paper (a hang or a mix-up named)
    pipeline_drawing    each rank's forwards and backwards, on paper or measured
    checkpointing  Checkpoint: keep a block's input, recompute the rest in backward, dropout alike   (lesson 19)
    mixed_precision_unit  MixedPrecisionUnit: the FSDP unit in bf16, fp32 master weights and reduce-scatter
    two_d        FSDP x TP on a 2-D mesh: the groups by hand, lesson 17's layers inside fully_shard   (lesson 20)
"""
from .ddp import DDPFromScratch
from .events import Event
from .fsdp import FSDPFromScratch
from .zero import ShardedOptimizer

__all__ = ["DDPFromScratch", "ShardedOptimizer", "FSDPFromScratch", "Event"]
