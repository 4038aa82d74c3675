"""Lesson 17's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from course_lib.checks import lesson17
from course_lib.topics.from_scratch import sequence_parallel as course_sp, tensor_parallel as course_tp

from . import answer, wrong_answer

GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _slice(tensor, dim):
    return nn.Parameter(tensor.detach().chunk(dist.get_world_size(), dim)[dist.get_rank()].clone())


# -- tensor parallel: a functional column layer, a row layer of the solution's shape; parts swappable ---
class Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnMatmul(torch.autograd.Function):
    """The column layer's whole matmul as one Function with its own backward: dL/dx summed over
    the ranks (each rank's columns give a part of it), the weight and bias gradients local."""

    @staticmethod
    def forward(ctx, x, weight, bias, sum_input_grad):
        ctx.save_for_backward(x, weight)
        ctx.sum_input_grad = sum_input_grad
        return torch.addmm(bias, x.reshape(-1, x.shape[-1]), weight.t()).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        flat_grad, flat_x = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
        x_grad = (flat_grad @ weight).view_as(x)
        if ctx.sum_input_grad:
            dist.all_reduce(x_grad)
        return x_grad, flat_grad.t() @ flat_x, flat_grad.sum(0), None


def _my_rows(tensor):
    """This rank's contiguous rows, picked with index_select from a table of row indices."""
    rows = torch.arange(len(tensor)).view(dist.get_world_size(), -1)[dist.get_rank()]
    return tensor.detach().index_select(0, rows)


def Column(linear, sum_input_grad=True, rows_of=_my_rows):
    """A functional layer, no class of its own: a bare Module holding this rank's rows of weight
    and bias, its forward one call of ColumnMatmul (the matmul and its backward in one Function)."""
    layer = nn.Module()
    layer.weight, layer.bias = nn.Parameter(rows_of(linear.weight)), nn.Parameter(rows_of(linear.bias))
    layer.forward = lambda x: ColumnMatmul.apply(x, layer.weight, layer.bias, sum_input_grad)
    return layer


class Row(nn.Module):
    reduce, dim = Reduce, 1

    def __init__(self, linear):
        super().__init__()
        self.weight, self.bias = _slice(linear.weight, self.dim), nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return self.reduce.apply(F.linear(x, self.weight)) + self.bias


# alternatives
class ColumnWithAHook(nn.Module):
    """Identity forward as a view; a gradient hook all-reduces dL/dx; weights cut with narrow."""

    def __init__(self, linear):
        super().__init__()
        rows = linear.out_features // dist.get_world_size()
        start = dist.get_rank() * rows
        self.weight = nn.Parameter(linear.weight.detach().narrow(0, start, rows).clone())
        self.bias = nn.Parameter(linear.bias.detach().narrow(0, start, rows).clone())

    def forward(self, x):
        x = x.view_as(x)
        if x.requires_grad:
            x.register_hook(lambda grad: _all_reduced(grad))
        return x @ self.weight.T + self.bias


def _all_reduced(grad):
    grad = grad.clone()
    dist.all_reduce(grad)
    return grad


class CopyAllReducingInPlace(torch.autograd.Function):
    """Megatron-LM's _CopyToModelParallelRegion (megatron/core/tensor_parallel/mappings.py): the
    gradient autograd hands to backward is all-reduced in place and returned. Right here: only the
    column matmul reads this Function's output, and its backward makes that gradient afresh, so no
    other gradient shares the tensor. (It would be wrong where the output also fed an op whose
    backward passes the gradient on as it is, such as `other_branch + copy`.)"""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        dist.all_reduce(grad)
        return grad


class ColumnLikeMegatron(nn.Module):
    def __init__(self, linear):
        super().__init__()
        self.weight, self.bias = _slice(linear.weight, 0), _slice(linear.bias, 0)

    def forward(self, x):
        return F.linear(CopyAllReducingInPlace.apply(x), self.weight, self.bias)


class RowWithInPlaceAllReduce(nn.Module):
    """An in-place all-reduce of the matmul's result: autograd does not see it, and passes dL/dy
    through unchanged, which is what the row layer's backward must do."""

    def __init__(self, linear):
        super().__init__()
        columns = linear.in_features // dist.get_world_size()
        self.weight = nn.Parameter(linear.weight.detach()[:, dist.get_rank() * columns:][:, :columns].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        partial = x @ self.weight.T
        dist.all_reduce(partial)
        return partial + self.bias


# wrong answers
class ColumnKeepingViews(nn.Module):
    """Right values, but each slice a view of the whole layer's weight: every rank keeps it all."""

    def __init__(self, linear):
        super().__init__()
        rank, world_size = dist.get_rank(), dist.get_world_size()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, 0)[rank])
        self.bias = nn.Parameter(linear.bias.detach().chunk(world_size, 0)[rank])

    def forward(self, x):
        return F.linear(Copy.apply(x), self.weight, self.bias)


# the column layer's dL/dx not summed over the ranks: identity both ways
ColumnWithoutBackwardAllReduce = partial(Column, sum_input_grad=False)


class ReduceInBackwardToo(Reduce):
    @staticmethod
    def backward(ctx, grad):
        return Copy.backward(ctx, grad)


class RowReducingItsBackwardToo(Row):
    reduce = ReduceInBackwardToo


class RowWithoutAllReduce(Row):
    def forward(self, x):
        return F.linear(x, self.weight) + self.bias


class RowAddingBiasBeforeTheSum(Row):
    def forward(self, x):
        return self.reduce.apply(F.linear(x, self.weight, self.bias))


def _input_columns(tensor):
    """The last dim's block: weight's columns (its input features), the shapes no longer fit x."""
    return tensor.detach().chunk(dist.get_world_size(), -1)[dist.get_rank()].clone()


def _dealt_rows(tensor):
    """Rows dealt like cards (rank r: r, r+2, ...): the row layer's contiguous columns no longer
    match the activations this rank holds."""
    return tensor.detach()[dist.get_rank()::dist.get_world_size()].clone()


ColumnSplitByInputs = partial(Column, rows_of=_input_columns)
ColumnDealtRowByRow = partial(Column, rows_of=_dealt_rows)


class CoursesColumn(course_tp.ColumnParallelLinear):
    pass


class ColumnInHalves(nn.Module):
    """The notebook's 2 ranks written in: chunk(2), whatever the world size."""

    def __init__(self, linear):
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(2, 0)[dist.get_rank()].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(2, 0)[dist.get_rank()].clone())

    def forward(self, x):
        return F.linear(Copy.apply(x), self.weight, self.bias)


class RowOfHalfTheColumns(Row):
    """linear.in_features // 2 columns a rank: the notebook's 2 ranks written in."""

    def __init__(self, linear):
        nn.Module.__init__(self)
        columns = linear.in_features // 2
        self.weight = nn.Parameter(linear.weight.detach()[:, dist.get_rank() * columns:][:, :columns].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())


class RowWithTorchsDifferentiableAllReduce(Row):
    """torch.distributed.nn.functional.all_reduce in place of ReduceFromParallel: differentiable,
    but its backward all-reduces the gradient again (_AllReduce.backward), where the row layer's
    must pass it through."""

    def forward(self, x):
        from torch.distributed.nn.functional import all_reduce
        return all_reduce(F.linear(x, self.weight)) + self.bias


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (dist.get_world_size(),))


class ColumnByTorchsColwiseParallel(nn.Module):
    """torch's own tensor parallelism inside: parallelize_module on a copy of the layer."""

    def __init__(self, linear):
        super().__init__()
        import copy
        from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
        self.inner = parallelize_module(copy.deepcopy(linear), _mesh(), ColwiseParallel())
        self.weight, self.bias = self.inner.weight, self.inner.bias

    def forward(self, x):
        return self.inner(x)


# -- sequence parallel ---------------------------------------------------------------------------
class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return list_gather(x)

    @staticmethod
    def backward(ctx, grad):
        return list_scatter(grad)


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return list_scatter(x)

    @staticmethod
    def backward(ctx, grad):
        return list_gather(grad)


def list_gather(x):  # all_gather into a list, then torch.cat
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def list_scatter(x):
    out = torch.empty_like(x.chunk(dist.get_world_size())[0])
    dist.reduce_scatter(out, [part.contiguous() for part in x.chunk(dist.get_world_size())])
    return out


class SPWithListCollectives(nn.Module):
    """Written whole: all_gather/reduce_scatter of lists; one all-reduce per replicated parameter."""
    gather, scatter, copy = Gather, Scatter, None

    def __init__(self, block):
        super().__init__()
        fc1, fc2 = block.mlp.fc1, block.mlp.fc2
        width = fc1.out_features // dist.get_world_size()
        mine = slice(dist.get_rank() * width, (dist.get_rank() + 1) * width)
        self.norm, self.dropout = block.norm, block.dropout  # on every rank, on its shard
        self.fc1_weight = nn.Parameter(fc1.weight.detach()[mine].clone())
        self.fc1_bias = nn.Parameter(fc1.bias.detach()[mine].clone())
        self.fc2_weight = nn.Parameter(fc2.weight.detach()[:, mine].clone())
        self.fc2_bias = fc2.bias  # on every rank, added after the reduce-scatter

    def forward(self, x_shard):
        h = self.norm(x_shard)
        h = self.copy.apply(h) if self.copy else h
        h = F.gelu(F.linear(self.gather.apply(h), self.fc1_weight, self.fc1_bias))
        return x_shard + self.dropout(self.scatter.apply(F.linear(h, self.fc2_weight)) + self.fc2_bias)

    def finish_gradient_sync(self):
        for param in [*self.norm.parameters(), self.fc2_bias]:
            dist.all_reduce(param.grad)


class FlatGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        full = x.new_empty((x.shape[0] * dist.get_world_size(), *x.shape[1:]))
        GATHER(full, x.contiguous())
        return full

    @staticmethod
    def backward(ctx, grad):
        return FlatScatter.forward(ctx, grad)


class FlatScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.new_empty((x.shape[0] // dist.get_world_size(), *x.shape[1:]))
        SCATTER(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        return FlatGather.forward(ctx, grad)


class SPWithOneFlatSync(SPWithListCollectives):
    """Flat collectives; the replicated gradients summed in one all-reduce of their concatenation."""
    gather, scatter = FlatGather, FlatScatter

    def finish_gradient_sync(self):
        grads = [p.grad for p in (*self.norm.parameters(), self.fc2_bias)]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(part.view_as(grad))


# wrong answers
class SPAllReducingTwice(SPWithListCollectives):
    copy = Copy  # TP's CopyToParallel kept before fc1: its all-reduce, then the gather's reduce-scatter


class SPWithoutNormSync(SPWithListCollectives):
    def finish_gradient_sync(self):
        dist.all_reduce(self.fc2_bias.grad)


class AllReduceThenSlice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x.chunk(dist.get_world_size())[dist.get_rank()].clone()

    @staticmethod
    def backward(ctx, grad):
        return list_gather(grad)


class SPAllReducingInsteadOfScattering(SPWithListCollectives):
    scatter = AllReduceThenSlice


class SPAveragingTheSync(SPWithListCollectives):
    def finish_gradient_sync(self):
        super().finish_gradient_sync()
        for param in [*self.norm.parameters(), self.fc2_bias]:
            param.grad /= dist.get_world_size()


class CoursesSP(course_sp.SequenceParallelMLP):
    pass


class GatherForTwo(torch.autograd.Function):
    """The sequence joined and split for 2 ranks: shape[0] * 2 and // 2 written in."""

    @staticmethod
    def forward(ctx, x):
        full = x.new_empty((x.shape[0] * 2, *x.shape[1:]))
        GATHER(full, x.contiguous())
        return full

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((grad.shape[0] // 2, *grad.shape[1:]))
        SCATTER(out, grad.contiguous())
        return out


class SPGatheringForTwo(SPWithOneFlatSync):
    gather = GatherForTwo


class SPOnTheCoursesClass(course_sp.SequenceParallelMLP):
    """The course's class with its forward and sync rewritten: the rest (its __init__, its
    shards) is the course's, not the learner's."""
    forward, finish_gradient_sync = SPWithListCollectives.forward, SPWithListCollectives.finish_gradient_sync
    gather, scatter, copy = Gather, Scatter, None


class ColumnOnTheCoursesClass(course_tp.ColumnParallelLinear):
    """The course's class with its own __init__ and forward: no line of the course's runs."""

    def __init__(self, linear):
        nn.Module.__init__(self)
        self.weight, self.bias = nn.Parameter(_my_rows(linear.weight)), nn.Parameter(_my_rows(linear.bias))

    def forward(self, x):
        return ColumnMatmul.apply(x, self.weight, self.bias, True)


ALTERNATIVES = {
    lesson17.check_tensor_parallel: [
        answer("a functional layer, one Function for its matmul and backward", Column, Row),
        answer("a gradient hook for the column, an in-place all-reduce for the row",
               ColumnWithAHook, RowWithInPlaceAllReduce),
        answer("Megatron-LM's in-place all-reduces, of autograd's gradient too", ColumnLikeMegatron,
               RowWithInPlaceAllReduce),
    ],
    lesson17.check_sequence_parallel: [
        answer("list collectives, one all-reduce per replicated parameter", SPWithListCollectives),
        answer("flat collectives, one all-reduce of the replicated gradients", SPWithOneFlatSync),
    ],
}

WRONG_ANSWERS = {
    lesson17.check_tensor_parallel: [
        wrong_answer("the column layer's input gradient not all-reduced (identity both ways)",
                     ColumnWithoutBackwardAllReduce, Row),
        wrong_answer("the row layer's backward all-reduces too", Column, RowReducingItsBackwardToo),
        wrong_answer("the row layer never sums its partial results", Column, RowWithoutAllReduce),
        wrong_answer("the bias added on every rank before the all-reduce", Column, RowAddingBiasBeforeTheSum),
        wrong_answer("the column layer split along its input features", ColumnSplitByInputs, Row),
        wrong_answer("the column layer's rows dealt like cards", ColumnDealtRowByRow, Row),
        wrong_answer("the column layer's slices are views of the whole weight", ColumnKeepingViews,
                     Row),
        wrong_answer("the course's ColumnParallelLinear", CoursesColumn, Row),
        wrong_answer("a subclass of the course's ColumnParallelLinear, every method rewritten",
                     ColumnOnTheCoursesClass, Row),
        wrong_answer("the column layer cut in halves: chunk(2)", ColumnInHalves, Row),
        wrong_answer("the row layer's columns: in_features // 2", Column, RowOfHalfTheColumns),
        wrong_answer("torch.distributed.nn.functional.all_reduce in the row layer", Column,
                     RowWithTorchsDifferentiableAllReduce),
        wrong_answer("torch's ColwiseParallel inside the column layer", ColumnByTorchsColwiseParallel, Row),
    ],
    lesson17.check_sequence_parallel: [
        wrong_answer("an all-reduce before fc1 and the gather's reduce-scatter: twice", SPAllReducingTwice),
        wrong_answer("LayerNorm's gradients not summed over the ranks", SPWithoutNormSync),
        wrong_answer("an all-reduce and a slice in place of the reduce-scatter",
                     SPAllReducingInsteadOfScattering),
        wrong_answer("the replicated gradients averaged, not summed", SPAveragingTheSync),
        wrong_answer("the course's SequenceParallelMLP", CoursesSP),
        wrong_answer("a subclass of the course's SequenceParallelMLP, forward and sync rewritten",
                     SPOnTheCoursesClass),
        wrong_answer("the sequence joined and split for 2 ranks", SPGatheringForTwo),
    ],
}
