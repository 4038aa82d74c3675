"""What lesson 19's graders run on each rank: the learner's Checkpoint on the course's dropout
blocks, and the learner's mixed-precision FSDP unit beside torch's fully_shard with a
MixedPrecisionPolicy. Each rank returns observations (gradients, saved-tensor counts, dtypes, bytes
handed to collectives), never a verdict.
"""
import torch
import torch.distributed as dist
import torch.utils.checkpoint
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from ...topics.from_scratch import checkpointing as course_checkpointing
from ...topics.from_scratch.checkpointing import blocks, run_blocks
from ...topics.from_scratch.fsdp_unit import shard_units
from ...topics.from_scratch.mixed_precision_unit import MixedPrecisionUnit as CourseUnit
from ...topics.memory import SavedActivations
from ...topics.traffic import _COLLECTIVE_OF_OPERATOR
from ..engine.call_watch import calls_of

BLOCKS, WIDTH, ROWS, DROPOUT = 3, 8, 6, 0.5
TORCH_CHECKPOINTS = (torch.utils.checkpoint.CheckpointFunction.forward,
                     torch.utils.checkpoint._checkpoint_without_reentrant_generator,
                     course_checkpointing.Checkpoint.forward)
IN, HIDDEN, STEPS, LR = 16, 32, 12, 0.02


# -- exercise 1: checkpointing ----------------------------------------------------------------------
def checkpoint_inputs(data_seed: int, rank: int):
    """This rank's batch, and the seed of its dropout."""
    draw = torch.Generator().manual_seed(data_seed + rank)
    return torch.randn(ROWS, WIDTH, generator=draw), data_seed + 100 + rank


def checkpoint_step(model_seed: int, data_seed: int, rank: int, checkpoint=None) -> dict:
    """One forward and backward of the blocks, each through `checkpoint` (None: not checkpointed),
    with dropout on; the gradients, how many tensors autograd kept, and the next random number."""
    model = blocks(BLOCKS, WIDTH, DROPOUT, seed=model_seed)
    x, dropout_seed = checkpoint_inputs(data_seed, rank)
    x.requires_grad_()
    torch.manual_seed(dropout_seed)
    with SavedActivations(model) as saved:
        out = run_blocks(model, x, checkpoint)
        kept = len(saved.tensors())
    out.pow(2).sum().backward()
    return dict(grads=[p.grad.clone() if p.grad is not None else None for p in model.parameters()],
                x_grad=None if x.grad is None else x.grad.clone(), saved=kept,
                after=torch.rand(4))  # the global random state after backward, as a draw from it


def checkpoint_on_rank(Checkpoint, model_seed: int, data_seed: int) -> dict:
    rank = dist.get_rank()
    with calls_of(*TORCH_CHECKPOINTS) as library_calls:
        mine = checkpoint_step(model_seed, data_seed, rank, lambda block, x: Checkpoint.apply(block, x))
    if library_calls:
        course = course_checkpointing.Checkpoint.forward.__qualname__  # torch's is CheckpointFunction.forward
        return {"library_calls": ["the course's Checkpoint" if name == course else
                                  "torch.utils.checkpoint" for name in library_calls]}
    for grad in mine["grads"]:  # data parallel: the ranks' gradients averaged, by the course's code
        if grad is not None:
            dist.all_reduce(grad)
            grad /= dist.get_world_size()
    reentrant = checkpoint_step(model_seed, data_seed, rank, lambda block, x: torch.utils.checkpoint.checkpoint(
        block, x, use_reentrant=True))
    return dict(mine=mine, torch_saved=reentrant["saved"])


# -- exercise 2: mixed-precision FSDP -----------------------------------------------------------------
def mlp(model_seed: int) -> nn.Sequential:
    torch.manual_seed(model_seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, IN))


def fsdp_batch(data_seed: int, rank: int):
    draw = torch.Generator().manual_seed(data_seed + rank)
    return torch.randn(8, IN, generator=draw), torch.randn(8, IN, generator=draw)


def loss_fn(output, target):
    return (output.float() - target).pow(2).mean()


def _train(model, parameters, x, y, observe=None) -> list:
    optimizer = torch.optim.SGD(parameters, lr=LR)
    losses = []
    for step in range(STEPS):
        output = model(x)
        loss = loss_fn(output, y)
        loss.backward()
        if observe is not None and step == 0:
            observe(output)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


class CollectiveDtypes(TorchDispatchMode):
    """{collective: sorted dtype names of the tensors handed to it} on this thread (traffic.py's
    operator names)."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            name = _COLLECTIVE_OF_OPERATOR.get(func.name().split("::", 1)[1])
            if name is not None:
                dtypes = {str(t.dtype).replace("torch.", "") for t in tree_leaves(args) if torch.is_tensor(t)}
                self.seen[name] = sorted(set(self.seen.get(name, [])) | dtypes)
        return func(*args, **(kwargs or {}))


def fsdp_on_rank(Unit, model_seed: int, data_seed: int) -> dict:
    if isinstance(Unit, type) and issubclass(Unit, CourseUnit):
        return {"library_calls": ["a subclass of the course's MixedPrecisionUnit"]}
    with calls_of(CourseUnit.__init__, CourseUnit.unshard, CourseUnit.post_backward) as library_calls:
        seen = beside_fully_shard(Unit, model_seed, data_seed)
    if library_calls:
        return {"library_calls": [f"the course's MixedPrecisionUnit.{library_calls[0].split('.')[-1]}"]}
    return seen


def beside_fully_shard(Unit, model_seed: int, data_seed: int) -> dict:
    """12 steps of `Unit` on this rank's batch, then of torch's fully_shard on the same."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    rank = dist.get_rank()
    x, y = fsdp_batch(data_seed, rank)
    model, seen = mlp(model_seed), {}
    units = shard_units(model, Unit)
    shards = [unit.shard for unit in units]
    with CollectiveDtypes() as collectives:
        losses = _train(model, shards, x, y, observe=lambda output: seen.update(
            output_dtype=output.dtype, grad_dtypes=[s.grad.dtype if s.grad is not None else None for s in shards]))
    mine = dict(losses=losses, shards=[s.detach().float().clone() for s in shards],
                shard_dtypes=[s.dtype for s in shards], collectives=collectives.seen, **seen)
    reference = mlp(model_seed)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in (reference[0], reference[2]):
        fully_shard(layer, mp_policy=policy)
    fully_shard(reference, mp_policy=policy)
    torch_losses = _train(reference, list(reference.parameters()), x, y)
    full = [p.full_tensor().detach().reshape(-1) for p in reference.parameters()]
    return dict(mine=mine, torch=dict(losses=torch_losses, full=full))
