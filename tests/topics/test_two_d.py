"""FSDP x TP on a 2-D mesh (topics/from_scratch/two_d.py), on real gloo ranks: the groups built by
hand against init_device_mesh's, and lesson 17's TP inside fully_shard against one process and
torch's parallelize_module + fully_shard (the losses, what each rank holds, what each group carries)."""
from functools import partial

import pytest
import torch
import torch.distributed as dist

from course_lib import launch
from course_lib.topics.from_scratch import two_d
from course_lib.topics.traffic import count_traffic

pytestmark = [pytest.mark.timeout(300), pytest.mark.filterwarnings("ignore:.*ranks on 2 CPU cores")]


def _groups_against_init_device_mesh(shapes):
    from torch.distributed.device_mesh import init_device_mesh

    seen = []
    for dp_size, tp_size in shapes:
        tp_group, dp_group = two_d.mesh_groups(dp_size, tp_size)
        mesh = init_device_mesh("cpu", (dp_size, tp_size), mesh_dim_names=("dp", "tp"))
        members = []
        for group in (tp_group, dp_group):  # who really answers an all-gather over the group
            gathered = [torch.zeros(1, dtype=torch.long) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, torch.tensor([dist.get_rank()]), group=group)
            members.append([int(rank) for rank in gathered])
        rows = two_d.local_batch(torch.arange(12), dp_group).tolist()
        seen.append((members, [mesh["tp"].mesh.tolist(), mesh["dp"].mesh.tolist()], rows))
    return seen


def test_mesh_groups_are_init_device_mesh_rows_and_columns_and_tp_ranks_share_rows():
    shapes = [(2, 3), (3, 2)]
    results = launch(_groups_against_init_device_mesh, shapes, nprocs=6, backend="gloo", timeout=120,
                     output="none")
    for rank, seen in enumerate(results):
        for (dp_size, tp_size), (members, torchs, rows) in zip(shapes, seen):
            assert members == torchs, (rank, dp_size, tp_size)
            assert members[0] == [rank // tp_size * tp_size + j for j in range(tp_size)]  # row-major
            share = 12 // dp_size
            assert rows == list(range(rank // tp_size * share, (rank // tp_size + 1) * share))


def _tp_on_the_dp_group(model, mesh):
    """The mistake the equality must catch: the TP layers on the DP group."""
    from torch.distributed.fsdp import fully_shard

    from course_lib.topics.from_scratch.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    for block in model:
        block.mlp.fc1 = ColumnParallelLinear(block.mlp.fc1, mesh["dp"].get_group())
        block.mlp.fc2 = RowParallelLinear(block.mlp.fc2, mesh["dp"].get_group())
    return fully_shard(model, mesh=mesh["dp"])


def _train_on_mesh(parallelize, inputs, targets):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_group = mesh["dp"].get_group()
    x, y = (two_d.local_batch(t, dp_group) for t in (inputs, targets))
    model = parallelize(two_d.make_model(), mesh)
    held = sum(p.to_local().numel() for p in model.parameters())
    with count_traffic() as traffic:
        two_d.mean_squared_error(model(x), y).backward()
    model.zero_grad()
    return held, dict(traffic.collective_bytes), two_d.train(model, x, y, steps=3, dp_group=dp_group)


def test_tp_inside_fully_shard_gives_one_process_losses_as_torch_and_holds_a_quarter():
    draw = torch.Generator().manual_seed(5)
    inputs, targets = torch.randn(8, 16, generator=draw), torch.randn(8, 16, generator=draw)
    expected = two_d.train(two_d.make_model(), inputs, targets, steps=3)
    run = partial(launch, nprocs=4, backend="gloo", timeout=120, output="none")
    for parallelize in (two_d.parallelize, two_d.parallelize_with_torch):
        results = run(_train_on_mesh, parallelize, inputs, targets)
        for rank, (held, handed_in, losses) in enumerate(results):
            assert losses == pytest.approx(expected, rel=1e-5), (parallelize.__name__, rank)
            assert held == 1104, (parallelize.__name__, rank)  # 4320 elements: 1/4 split, 1/2 replicated
            if parallelize is two_d.parallelize:  # one forward and backward, as lesson 20 predicts
                assert handed_in == {"all_reduce": 1024, "all_gather": 8832, "reduce_scatter": 8832}
    # and the comparison can fail: TP on the DP group trains another model
    _, _, wrong = run(_train_on_mesh, _tp_on_the_dp_group, inputs, targets)[0]
    assert wrong != pytest.approx(expected, rel=1e-5)
