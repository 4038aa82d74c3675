"""Lesson 20's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.checks import lesson20
from course_lib.topics.from_scratch import tensor_parallel as course_tp, two_d

from . import answer, wrong_answer


# -- mesh groups -----------------------------------------------------------------------------------
def _groups(rows, columns):
    """Every row and every column made a group, on every rank; the two this rank is in."""
    rank, kept = dist.get_rank(), []
    for lists in (rows, columns):
        for ranks in lists:
            group = dist.new_group(ranks)
            if rank in ranks:
                kept.append(group)
    return tuple(kept)


def groups_by_arithmetic(dp_size, tp_size):
    world = dp_size * tp_size
    return _groups([list(range(i * tp_size, (i + 1) * tp_size)) for i in range(dp_size)],
                   [list(range(j, world, tp_size)) for j in range(tp_size)])


def groups_by_enumeration(dp_size, tp_size):
    """torch's new_subgroups_by_enumeration: the lists are still yours."""
    grid = [[i * tp_size + j for j in range(tp_size)] for i in range(dp_size)]
    tp_group, _ = dist.new_subgroups_by_enumeration(grid, backend="gloo")
    dp_group, _ = dist.new_subgroups_by_enumeration([list(c) for c in zip(*grid)], backend="gloo")
    return tp_group, dp_group


def groups_column_major(dp_size, tp_size):
    """rank = tp_index * dp_size + dp_index: Fortran's order, not init_device_mesh's."""
    world = dp_size * tp_size
    return _groups([list(range(i, world, dp_size)) for i in range(dp_size)],
                   [list(range(j * dp_size, (j + 1) * dp_size)) for j in range(tp_size)])


def groups_swapped(dp_size, tp_size):
    tp_group, dp_group = groups_by_arithmetic(dp_size, tp_size)
    return dp_group, tp_group


def groups_for_two_wide(dp_size, tp_size):
    """Written for the notebook's TP size of 2: pairs of ranks, even and odd ranks."""
    world = dp_size * tp_size
    return _groups([[r, r + 1] for r in range(0, world, 2)], [list(range(0, world, 2)), list(range(1, world, 2))])


def groups_from_init_device_mesh(dp_size, tp_size):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
    return mesh["tp"].get_group(), mesh["dp"].get_group()


def groups_from_device_mesh(dp_size, tp_size):
    """DeviceMesh's constructor, on the row-major grid: the library, under another name."""
    from torch.distributed.device_mesh import DeviceMesh

    grid = torch.arange(dp_size * tp_size).view(dp_size, tp_size)
    mesh = DeviceMesh("cpu", grid, mesh_dim_names=("dp", "tp"))
    return mesh["tp"].get_group(), mesh["dp"].get_group()


def rows_of(batch, dp_group):
    return batch.chunk(dist.get_world_size(dp_group))[dist.get_rank(dp_group)]


def rows_by_narrow(batch, dp_group):
    share = len(batch) // dist.get_world_size(dp_group)
    return batch.narrow(0, dist.get_rank(dp_group) * share, share)


def rows_per_rank(batch, dp_group):
    """Each rank its own slice: TP ranks of one DP group get different rows."""
    return batch.chunk(dist.get_world_size())[dist.get_rank()]


def rows_whole(batch, dp_group):
    """Every rank the whole batch: DP ranks get the same rows."""
    return batch


def rows_by_global_rank_modulo(batch, dp_group):
    """The DP size right, the index the global rank's: DP ranks of a 2x3 grid share rows."""
    size = dist.get_world_size(dp_group)
    return batch.chunk(size)[dist.get_rank() % size]


# -- parallelize -----------------------------------------------------------------------------------
def _fully_shard(model, mesh, per_block=True):
    from torch.distributed.fsdp import fully_shard

    if per_block:
        for block in model:
            fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _with_layers(model, column, row, fsdp_mesh, per_block=True):
    for block in model:
        block.mlp.fc1, block.mlp.fc2 = column(block.mlp.fc1), row(block.mlp.fc2)
    return _fully_shard(model, fsdp_mesh, per_block)


def course_layers(model, mesh):
    tp = mesh["tp"].get_group()
    return _with_layers(model, partial(course_tp.ColumnParallelLinear, group=tp),
                        partial(course_tp.RowParallelLinear, group=tp), mesh["dp"])


class _Sum(torch.autograd.Function):
    """All-reduce over `group` in forward (in_forward=True), else in backward."""

    @staticmethod
    def forward(ctx, x, group, in_forward):
        ctx.group, ctx.in_forward = group, in_forward
        if in_forward:
            x = x.clone()
            dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        if not ctx.in_forward:
            grad = grad.clone()
            dist.all_reduce(grad, group=ctx.group)
        return grad, None, None


class Column(nn.Module):
    def __init__(self, linear, group, dim=0, sum_input_grad=True):
        super().__init__()
        size, rank = dist.get_world_size(group), dist.get_rank(group)
        self.group, self.sum_input_grad = group, sum_input_grad
        self.weight = nn.Parameter(linear.weight.detach().chunk(size, dim)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(size)[rank].clone())

    def forward(self, x):
        x = _Sum.apply(x, self.group, False) if self.sum_input_grad else x
        return F.linear(x, self.weight, self.bias)


class Row(nn.Module):
    def __init__(self, linear, group, split_group=None, bias_before_sum=False):
        super().__init__()
        split_group = group if split_group is None else split_group
        size, rank = dist.get_world_size(split_group), dist.get_rank(split_group)
        self.group, self.bias_before_sum = group, bias_before_sum
        self.weight = nn.Parameter(linear.weight.detach().chunk(size, 1)[rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        if self.bias_before_sum:
            return _Sum.apply(F.linear(x, self.weight, self.bias), self.group, True)
        return _Sum.apply(F.linear(x, self.weight), self.group, True) + self.bias


def own_layers_root_only(model, mesh):
    """Layers of its own, and one fully_shard on the whole model (one FSDP unit)."""
    tp = mesh["tp"].get_group()
    return _with_layers(model, partial(Column, group=tp), partial(Row, group=tp), mesh["dp"], per_block=False)


def tp_on_the_dp_dimension(model, mesh):
    dp = mesh["dp"].get_group()
    return _with_layers(model, partial(course_tp.ColumnParallelLinear, group=dp),
                        partial(course_tp.RowParallelLinear, group=dp), mesh["dp"])


def fully_shard_over_the_world(model, mesh):
    from torch.distributed.device_mesh import init_device_mesh

    tp = mesh["tp"].get_group()
    return _with_layers(model, partial(Column, group=tp), partial(Row, group=tp),
                        init_device_mesh("cpu", (dist.get_world_size(),)))


def fully_shard_over_tp(model, mesh):
    return _with_layers(model, partial(Column, group=mesh["tp"].get_group()),
                        partial(Row, group=mesh["tp"].get_group()), mesh["tp"])


def column_split_by_input_features(model, mesh):
    tp = mesh["tp"].get_group()
    return _with_layers(model, partial(Column, group=tp, dim=1), partial(Row, group=tp), mesh["dp"])


def row_sum_over_the_world(model, mesh):
    tp = mesh["tp"].get_group()
    return _with_layers(model, partial(Column, group=tp), partial(Row, group=None, split_group=tp), mesh["dp"])


def no_sum_of_the_input_gradient(model, mesh):
    tp = mesh["tp"].get_group()
    return _with_layers(model, partial(Column, group=tp, sum_input_grad=False), partial(Row, group=tp),
                        mesh["dp"])


def bias_on_every_rank(model, mesh):
    tp = mesh["tp"].get_group()
    return _with_layers(model, partial(Column, group=tp), partial(Row, group=tp, bias_before_sum=True),
                        mesh["dp"])


def tp_without_fully_shard(model, mesh):
    tp = mesh["tp"].get_group()
    for block in model:
        block.mlp.fc1, block.mlp.fc2 = Column(block.mlp.fc1, tp), Row(block.mlp.fc2, tp)
    return model


def fully_shard_without_tp(model, mesh):
    return _fully_shard(model, mesh["dp"])


def torchs_parallelize_module(model, mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model:
        parallelize_module(block, mesh["tp"], {"mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
    return _fully_shard(model, mesh["dp"])


ALTERNATIVES = {
    lesson20.check_mesh_groups: [
        answer("ranges, new_group for every row and column, narrow", groups_by_arithmetic, rows_by_narrow),
        answer("new_subgroups_by_enumeration", groups_by_enumeration, rows_of),
    ],
    lesson20.check_parallelize: [
        answer("the course's layers with group=, fully_shard per block", course_layers),
        answer("layers of its own, fully_shard on the root only", own_layers_root_only),
    ],
}

WRONG_ANSWERS = {
    lesson20.check_mesh_groups: [
        wrong_answer("column-major groups", groups_column_major, rows_of),
        wrong_answer("the TP and DP groups swapped", groups_swapped, rows_of),
        wrong_answer("groups written for a TP size of 2", groups_for_two_wide, rows_of),
        wrong_answer("init_device_mesh in place of the groups", groups_from_init_device_mesh, rows_of),
        wrong_answer("a DeviceMesh built by its constructor", groups_from_device_mesh, rows_of),
        wrong_answer("the course's own", two_d.mesh_groups, two_d.local_batch),
        wrong_answer("rows per rank: TP ranks see different rows", groups_by_arithmetic, rows_per_rank),
        wrong_answer("the whole batch: DP ranks see the same rows", groups_by_arithmetic, rows_whole),
        wrong_answer("rows by the global rank modulo the DP size", groups_by_arithmetic, rows_by_global_rank_modulo),
    ],
    lesson20.check_parallelize: [
        wrong_answer("TP on the dp dimension", tp_on_the_dp_dimension),
        wrong_answer("fully_shard over the whole world", fully_shard_over_the_world),
        wrong_answer("fully_shard over tp", fully_shard_over_tp),
        wrong_answer("the column layer split by input features", column_split_by_input_features),
        wrong_answer("the row layer's all-reduce over the world", row_sum_over_the_world),
        wrong_answer("no all-reduce of the column layer's input gradient", no_sum_of_the_input_gradient),
        wrong_answer("the row layer's bias added on every rank", bias_on_every_rank),
        wrong_answer("TP without fully_shard", tp_without_fully_shard),
        wrong_answer("fully_shard without TP", fully_shard_without_tp),
        wrong_answer("torch's parallelize_module", torchs_parallelize_module),
        wrong_answer("the course's two_d.parallelize", two_d.parallelize),
    ],
}
