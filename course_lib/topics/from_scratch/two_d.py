"""Composing data and tensor parallelism on a 2-D mesh (lesson 20): world = dp x tp ranks in a grid,
row-major (rank = dp_index * tp + tp_index, init_device_mesh's layout). A row of the grid is a TP
group: its ranks split every layer (lesson 17) and see the same batch. A column is a DP group: its
ranks hold the same TP shard, see different batches, and shard that TP shard again with FSDP.

    mesh_groups(dp, tp)      the TP and DP groups built by hand with dist.new_group
    local_batch(batch, dp)   the rows of the global batch that this rank's DP group trains on
    parallelize(model, mesh) lesson 17's column/row layers on mesh["tp"], inside fully_shard on mesh["dp"]
    parallelize_with_torch   the same with torch's parallelize_module: the reference
    train(model, ...)        a few AdamW steps; the global batch's mean loss at each (one process too)
"""
import torch
import torch.distributed as dist
from torch import nn

from .pipeline import mean_squared_error  # lesson 18's loss, the same here
from .tensor_parallel import ColumnParallelLinear, RowParallelLinear
from .transformer_parts import Block

HIDDEN = 16


def mesh_groups(dp_size: int, tp_size: int) -> tuple:
    """(tp_group, dp_group) of this rank. Every rank creates every group, in the same order
    (dist.new_group's rule), and keeps the two it belongs to."""
    rank = dist.get_rank()
    grid = torch.arange(dp_size * tp_size).view(dp_size, tp_size)  # grid[dp_index, tp_index]
    for row in grid.tolist():
        group = dist.new_group(row)
        if rank in row:
            tp_group = group
    for column in grid.t().tolist():
        group = dist.new_group(column)
        if rank in column:
            dp_group = group
    return tp_group, dp_group


def local_batch(batch: torch.Tensor, dp_group) -> torch.Tensor:
    """This DP group's contiguous 1/dp of the batch's rows: the same on every rank of a TP group."""
    return batch.chunk(dist.get_world_size(dp_group))[dist.get_rank(dp_group)]


def make_model(seed: int = 0, blocks: int = 2, hidden: int = HIDDEN) -> nn.Sequential:
    """Residual LayerNorm-MLP blocks (transformer_parts.Block), the same weights for the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(*(Block(hidden) for _ in range(blocks)))


def parallelize(model: nn.Sequential, mesh) -> nn.Module:
    """TP inside FSDP: each block's fc1 column-parallel and fc2 row-parallel over the TP group,
    then each block and the whole model fully_shard-ed over the DP dimension."""
    from torch.distributed.fsdp import fully_shard

    tp_group = mesh["tp"].get_group()
    for block in model:
        block.mlp.fc1 = ColumnParallelLinear(block.mlp.fc1, tp_group)
        block.mlp.fc2 = RowParallelLinear(block.mlp.fc2, tp_group)
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def parallelize_with_torch(model: nn.Sequential, mesh) -> nn.Module:
    """The same split with torch's DTensor TP: fully_shard then shards each DTensor over dp too."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    for block in model:
        parallelize_module(block, mesh["tp"], {"mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def train(model, inputs, targets, steps: int = 3, lr: float = 0.01, dp_group=None) -> list:
    """`steps` AdamW steps on these rows; the loss before each step. On a mesh, pass the DP group:
    each DP group's loss averaged over it (equal batches: the global batch's mean loss)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = mean_squared_error(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        if dp_group is not None:
            dist.all_reduce(total, group=dp_group)
            total /= dist.get_world_size(dp_group)
        losses.append(total.item())
    return losses
