"""DDP (overlap, buckets), ZeRO-1 and FSDP built from hooks and collectives, short enough to read.

    ddp          DDPFromScratch: an all-reduce per gradient, or per bucket, launched in backward  (lesson 15)
    buckets      grouping gradients in reverse registration order up to bucket_cap_mb
    zero         ShardedOptimizer: ZeRO-1, each rank keeps the optimizer state of its share
    fsdp         FSDPFromScratch: shards per unit, gathered for its forward and its backward
    events       what each wrapper did and when (`wrapper.events`), for graders and timelines
"""
from .ddp import DDPFromScratch
from .events import Event
from .fsdp import FSDPFromScratch
from .zero import ShardedOptimizer

__all__ = ["DDPFromScratch", "ShardedOptimizer", "FSDPFromScratch", "Event"]
