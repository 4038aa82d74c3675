"""What lesson 20's graders run on each rank: the learner's groups and batch rows beside torch's
init_device_mesh on the same grid, and the learner's parallelize trained beside one process's
and torch's parallelize_module + fully_shard. Each rank returns observations, never a verdict.
"""
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from ...topics.from_scratch import two_d
from ..engine.call_watch import calls_of

ROWS, FEATURES = 12, 3           # the batch of exercise 1: 12 rows split 2 or 3 ways
BATCH, STEPS, LR, MODEL_SEED = 8, 3, 0.01, 20
COURSE_GROUPS = (two_d.mesh_groups, two_d.local_batch)
COLLECTIVES = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "allgather_": "all_gather",
               "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter"}


def torch_mesh(dp_size: int, tp_size: int):
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cpu", (dp_size, tp_size), mesh_dim_names=("dp", "tp"))


def rows(data_seed: int) -> torch.Tensor:
    return torch.randn(ROWS, FEATURES, generator=torch.Generator().manual_seed(data_seed))


def inputs(data_seed: int) -> tuple:
    draw = torch.Generator().manual_seed(data_seed)
    return (torch.randn(BATCH, two_d.HIDDEN, generator=draw),
            torch.randn(BATCH, two_d.HIDDEN, generator=draw))


def _members(group):
    """The global ranks that answer an all-gather over `group` (what it really joins), or what
    `group` is when it is no process group."""
    if not isinstance(group, dist.ProcessGroup):
        return f"a {type(group).__name__}: {repr(group)[:80]}"
    mine = torch.tensor([dist.get_rank()])
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, mine, group=group)
    return [int(rank) for rank in gathered]


# -- exercise 1: groups and batch rows -------------------------------------------------------------------
def groups_on_rank(mesh_groups, local_batch, shapes, data_seed: int) -> dict:
    from torch.distributed import device_mesh

    seen = {}
    for dp_size, tp_size in shapes:
        with calls_of(*COURSE_GROUPS, device_mesh.init_device_mesh, device_mesh.DeviceMesh.__init__) as library_calls:
            groups = mesh_groups(dp_size, tp_size)
        if library_calls:
            return {"library_calls": library_calls}
        if not isinstance(groups, (tuple, list)) or len(groups) != 2:
            return {"not_a_pair": repr(groups)[:120]}
        mesh = torch_mesh(dp_size, tp_size)
        with calls_of(*COURSE_GROUPS) as library_calls:
            got_rows = local_batch(rows(data_seed), mesh["dp"].get_group())
        if library_calls:
            return {"library_calls": library_calls}
        seen[f"{dp_size}x{tp_size}"] = dict(
            tp=_members(groups[0]), dp=_members(groups[1]), rows=got_rows if isinstance(
                got_rows, torch.Tensor) else repr(got_rows)[:120],
            torch_tp=mesh["tp"].mesh.tolist(), torch_dp=mesh["dp"].mesh.tolist(),
            dp_index=mesh.get_local_rank("dp"))
    return {"shapes": seen}


# -- exercise 2: TP inside FSDP on a 2x2 mesh ------------------------------------------------------------
class _WatchGroups(TorchDispatchMode):
    """Records (collective, the global ranks of its group) for each c10d collective on this thread."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name().split("::", 1)[1] if func.namespace == "c10d" else ""
        if name in COLLECTIVES:  # the in-place all-reduce takes its group second, the others third
            group = dist.ProcessGroup.unbox(args[1] if name == "allreduce_" else args[2])
            self.seen.append([COLLECTIVES[name], sorted(dist.get_process_group_ranks(group))])
        return func(*args, **(kwargs or {}))


def _describe(model) -> list:
    """[name, kind, mesh ranks (a DTensor's) or None, local elements] for each parameter."""
    described = []
    for name, param in model.named_parameters():
        mesh = getattr(param, "device_mesh", None)
        local = param.to_local() if hasattr(param, "to_local") else param
        described.append([name, type(param).__name__, None if mesh is None else mesh.mesh.tolist(),
                          int(local.numel())])
    return described


def _train(model, x, y, dp_group) -> tuple:
    """two_d.train's steps, with the collectives of each forward and backward watched."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, collectives = [], []
    for _ in range(STEPS):
        with _WatchGroups() as watch:
            loss = two_d.mean_squared_error(model(x), y)
            loss.backward()
        collectives.append(watch.seen)
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, group=dp_group)
        losses.append(total.item() / dist.get_world_size(dp_group))
    return losses, collectives


def parallelize_on_rank(parallelize, data_seed: int) -> dict:
    mesh = torch_mesh(2, 2)
    dp_group = mesh["dp"].get_group()
    x, y = (two_d.local_batch(t, dp_group) for t in inputs(data_seed))
    with calls_of(two_d.parallelize, two_d.parallelize_with_torch) as library_calls:
        model = parallelize(two_d.make_model(MODEL_SEED), mesh)
    if library_calls:
        return {"library_calls": library_calls}
    if not isinstance(model, torch.nn.Module):
        return {"not_a_module": repr(model)[:120]}
    parameters = _describe(model)
    losses, collectives = _train(model, x, y, dp_group)
    reference = two_d.parallelize_with_torch(two_d.make_model(MODEL_SEED), mesh)
    return dict(parameters=parameters, losses=losses, collectives=collectives,
                tp=mesh["tp"].mesh.tolist(), dp=mesh["dp"].mesh.tolist(),
                torch_losses=two_d.train(reference, x, y, STEPS, LR, dp_group),
                torch_elements=sum(n for *_, n in _describe(reference)))
