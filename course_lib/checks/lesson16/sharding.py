"""Running a learner's ZeRO-1 optimizer and gather on ranks, and watching what each rank holds
(lesson 16; the FSDP unit's are in unit.py).

ZeRO-1: every rank trains TiedNet (lesson 15's model: a tied weight, a frozen layer, a buffer)
under torch's DDP with the learner's ShardedOptimizer(local_class: AdamW on 2 ranks, Adam on 3,
so that a class written in shows), then with torch's
ZeroRedundancyOptimizer on the same shards; it returns its weights after each step and the
parameters its local optimizer holds state for.

Gather: every rank gathers shards whose values say whose they are and where, and returns them as
they are after the call.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.utils import parameters_to_vector

from ..engine.gradient_sync import TiedNet, batches, one_process, train_on_shards

STEPS, ADAMW = 3, dict(lr=0.05, weight_decay=0.1)
LOCAL_CLASSES = {2: torch.optim.AdamW, 3: torch.optim.Adam}  # Adam's weight decay is not AdamW's


# -- ZeRO-1 ----------------------------------------------------------------------------------------
def one_process_adamw(data_seed: int, steps: int = STEPS, local_class=torch.optim.AdamW) -> list:
    return one_process(steps, optimizer=lambda parameters: local_class(parameters, **ADAMW),
                       data_seed=data_seed)


def zero_on_rank(optimizer_class, data_seed: int, steps: int = STEPS, local_class=torch.optim.AdamW) -> dict:
    """The learner's optimizer trained, then torch's; a call of the course's ShardedOptimizer or
    torch's ZeroRedundancyOptimizer by the learner's comes back as {"library_calls": [names]}."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    from ...topics.from_scratch.zero import ShardedOptimizer
    from ..engine.call_watch import calls_of

    rank, world_size = dist.get_rank(), dist.get_world_size()
    with calls_of(ShardedOptimizer.__init__, ZeroRedundancyOptimizer.__init__) as library_calls:
        weights, owned = _train_zero(lambda params: optimizer_class(params, local_class, **ADAMW),
                                     rank, world_size, steps, data_seed)
    if library_calls:
        return {"library_calls": library_calls}
    torch_weights, _ = _train_zero(lambda params: ZeroRedundancyOptimizer(
        params, optimizer_class=local_class, **ADAMW), rank, world_size, steps, data_seed)
    return dict(weights=weights, owned=owned, torch_zero=torch_weights)


def _train_zero(make_optimizer, rank, world_size, steps, data_seed):
    model = TiedNet(seed=0)
    names = {param: name for name, param in model.named_parameters()}
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = make_optimizer([p for p in ddp.parameters() if p.requires_grad])
    weights = train_on_shards(ddp, optimizer, batches(steps, data_seed), rank, world_size,
                              lambda: parameters_to_vector(model.parameters()).detach().clone())
    local = getattr(optimizer, "local_optimizer", getattr(optimizer, "optim", None))
    if local is None:
        return weights, None
    owned = {names.get(param, "a tensor not in the model"): sum(
        value.numel() * value.element_size() for value in state.values() if torch.is_tensor(value))
        for param, state in local.state.items() if state}
    return weights, owned


# -- gather ----------------------------------------------------------------------------------------
def shard_for(rank: int, numel: int, dtype=torch.float32, base: int = 0) -> torch.Tensor:
    """A shard whose values say whose it is and where: rank r's element i is base + 100 r + i."""
    return (base + 100 * rank + torch.arange(numel)).to(dtype)


GATHER_CASES = ((5, torch.float32), (1, torch.float32), (4, torch.float64))  # (numel, dtype)


def gather_on_rank(gather_full, base: int = 0, cases=GATHER_CASES) -> dict:
    """What gather_full returned for each case, and the shard it was given as it is after the call
    (a copy; "freed" when its memory is gone): the caller's shard is the unit's parameters."""
    rank, gathered, after = dist.get_rank(), [], []
    for numel, dtype in cases:
        shard = shard_for(rank, numel, dtype, base)
        gathered.append(gather_full(shard))
        after.append(shard.clone() if shard.untyped_storage().nbytes() >= shard.nbytes else "freed")
    return {"gathered": gathered, "shards_after": after}
