"""What lesson 17's graders run on each rank: the learner's split layers (or sequence-parallel
block) on the course's parts, then (on 2 ranks) torch's DTensor `parallelize_module` on the same
parts. Each rank returns observations (outputs, gradients, the collectives each phase called),
never a verdict.
On 2 ranks the parts are the lesson's (hidden 16, 4 heads); on 3, hidden 12 and 3 heads, so that
every split layer divides by 3 (`part`): a split written for 2 ranks shows there.
"""
import torch
import torch.distributed as dist

from ...topics.from_scratch import sequence_parallel as course_sp, tensor_parallel as course_tp
from ...topics.from_scratch.transformer_parts import make_part
from ...topics.traffic import count_traffic
from ..engine.call_watch import calls_of

SEQUENCE, BATCH, HIDDEN = 6, 2, 16
LAYERS = {"mlp": ("fc1", "fc2"), "attention": ("qkv", "out")}  # (column-parallel, row-parallel)
SP_PARAMETERS = ("norm.weight", "norm.bias", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias")
COURSE_TP = (course_tp.ColumnParallelLinear.__init__, course_tp.RowParallelLinear.__init__,
             course_tp.CopyToParallel.backward, course_tp.ReduceFromParallel.forward)
COURSE_SP = (course_sp.SequenceParallelMLP.forward, course_sp.GatherSequence.forward,
             course_sp.ScatterSequence.forward)
COURSE_CLASSES = (course_sp.SequenceParallelMLP, course_tp.ColumnParallelLinear,
                  course_tp.RowParallelLinear)


def course_bases(*classes) -> list:
    """The course's classes that any of the learner's `classes` inherits from, by name: a class
    built on them is not the learner's own, whichever of its methods it rewrites."""
    return [f"{base.__module__}.{base.__qualname__}" for cls in classes for base in COURSE_CLASSES
            if isinstance(cls, type) and issubclass(cls, base)]


def hidden(world_size: int) -> int:
    return HIDDEN if world_size == 2 else 12


def part(kind: str, world_size: int):
    """The course's part for `world_size` ranks, the same in every process: the lesson's on 2;
    on 3, hidden 12 (fc1's 48 features) and 3 heads of 4 (make_part's 4 heads do not split in 3)."""
    if world_size == 2:
        return make_part(kind)
    return make_part(kind, hidden=hidden(world_size), **({"heads": world_size} if kind == "attention" else {}))


def inputs(data_seed: int, world_size: int = 2) -> tuple:
    """The whole sequence's input and the gradient that flows back into the output."""
    draw = torch.Generator().manual_seed(data_seed)
    shape = (SEQUENCE, BATCH, hidden(world_size))
    return torch.randn(*shape, generator=draw), torch.randn(*shape, generator=draw)


def _step(module, x, grad_out, *grads):
    """Forward and backward, each counted; the output, x's gradient, the named gradients."""
    x = x.clone().requires_grad_()
    with count_traffic() as forward:
        out = module(x)
    with count_traffic() as backward:
        out.backward(grad_out)
    return dict(out=out.detach(), x_grad=x.grad, grads=[grad() for grad in grads],
                forward=list(forward.collectives), backward=list(backward.collectives),
                forward_bytes=dict(forward.collective_bytes),
                backward_bytes=dict(backward.collective_bytes))


def _grad(module, name):
    def read():
        param = getattr(module, name, None)
        if not isinstance(param, torch.Tensor) or param.grad is None:
            return None
        grad = param.grad.detach()
        return grad if type(grad) is torch.Tensor else f"a {type(grad).__name__}"  # plain data only
    return read


def torch_tensors(module) -> list:
    """The parameters of `module` (the learner's split layers) that are torch's DTensors: layers
    handed to torch's parallelize_module rather than split by hand."""
    return [name for name, param in module.named_parameters() if type(param).__name__ == "DTensor"]


# -- tensor parallel ---------------------------------------------------------------------------------
def tp_on_rank(column, row, data_seed: int, with_torch: bool = True) -> dict:
    if course_bases(column, row):
        return {"course_bases": course_bases(column, row)}
    world_size = dist.get_world_size()
    x, grad_out = inputs(data_seed, world_size)
    mine = {}
    with calls_of(*COURSE_TP) as library_calls:
        for kind, (first, second) in LAYERS.items():
            whole = part(kind, world_size)
            split = course_tp.split_mlp(whole, column, row) if kind == "mlp" else \
                course_tp.split_attention(whole, column, row)
            layers = [getattr(split, first), getattr(split, second)]
            if torch_tensors(split):
                return {"torch_tensors": torch_tensors(split)}
            mine[kind] = _step(split, x, grad_out, *(_grad(layer, name) for layer in layers
                                                    for name in ("weight", "bias")))
            mine[kind]["views"] = [f"{layer_name}.{name}" for layer_name, layer in zip(
                (first, second), layers) for name in ("weight", "bias")
                if _holds_more(getattr(layer, name, None))]
    if library_calls:
        return {"library_calls": library_calls}
    torch_runs = {kind: _dtensor_tp(kind, x, grad_out) for kind in LAYERS} if with_torch else None
    return dict(mine=mine, torch=torch_runs)


def _holds_more(tensor) -> bool:
    """Whether `tensor` is a view into a larger storage (a slice of the whole layer's weight)."""
    return isinstance(tensor, torch.Tensor) and \
        tensor.untyped_storage().nbytes() > tensor.numel() * tensor.element_size()


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (dist.get_world_size(),))


def _full(tensor):
    """A plain tensor: a DTensor's whole value; an AsyncCollectiveTensor waited for (any op does)."""
    if tensor is None:
        return None
    tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return tensor.detach().clone()


def _dtensor_tp(kind, x, grad_out):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    first, second = LAYERS[kind]
    split = parallelize_module(part(kind, dist.get_world_size()), _mesh(),
                               {first: ColwiseParallel(), second: RowwiseParallel()})
    x = x.clone().requires_grad_()
    out = split(x)
    out.backward(grad_out)
    return dict(out=_full(out), x_grad=_full(x.grad),
                grads=[_full(getattr(getattr(split, layer), name).grad) for layer in (first, second)
                       for name in ("weight", "bias")])


# -- sequence parallel -------------------------------------------------------------------------------
def sp_on_rank(sp_class, data_seed: int, with_torch: bool = True) -> dict:
    if course_bases(sp_class):
        return {"course_bases": course_bases(sp_class)}
    rank, world_size = dist.get_rank(), dist.get_world_size()
    x, grad_out = (t.chunk(world_size)[rank].clone() for t in inputs(data_seed, world_size))
    with calls_of(*COURSE_SP) as library_calls:
        block = sp_class(part("block", world_size))
        if torch_tensors(block):
            return {"torch_tensors": torch_tensors(block)}
        names = [name.split(".") for name in SP_PARAMETERS]
        read = [_grad(getattr(block, n[0], None), n[1]) if len(n) == 2 else _grad(block, n[0])
                for n in names]
        seen = _step(block, x, grad_out)
        with count_traffic() as sync:
            block.finish_gradient_sync()
        seen.update(grads=[grad() for grad in read], sync=list(sync.collectives))
    if library_calls:
        return {"library_calls": library_calls}
    return dict(mine=seen, torch=_dtensor_sp(x, grad_out) if with_torch else None)


def _dtensor_sp(x_shard, grad_out):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    block = parallelize_module(part("block", dist.get_world_size()), _mesh(), {
        "norm": SequenceParallel(sequence_dim=0), "mlp.fc1": ColwiseParallel(input_layouts=Shard(0)),
        "mlp.fc2": RowwiseParallel(output_layouts=Shard(0))})
    x_shard = x_shard.clone().requires_grad_()
    out = block(x_shard)
    out.backward(grad_out)
    params = (block.norm.weight, block.norm.bias, block.mlp.fc1.weight, block.mlp.fc1.bias,
              block.mlp.fc2.weight, block.mlp.fc2.bias)
    return dict(out=_full(out), x_grad=_full(x_shard.grad), grads=[_full(p.grad) for p in params])
