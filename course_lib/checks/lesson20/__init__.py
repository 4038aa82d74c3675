"""Graders for lesson 20, FSDP and tensor parallelism composed on a 2-D mesh. Both run your code on
gloo ranks (ranks.py) beside torch's own; the ranks return what they saw, and every comparison is
made here.

- mesh groups: your mesh_groups(dp_size, tp_size) on 6 ranks, as a 2x3 and a 3x2 grid: the ranks
  each of your groups really joins (an all-gather over it) equal those of init_device_mesh's
  mesh["tp"] and mesh["dp"]; your local_batch(batch, dp_group) gives each rank its DP group's
  contiguous rows of a batch drawn at grading time (TP ranks of one DP group the same rows).
  Neither may call init_device_mesh, DeviceMesh or the course's two_d code.
- parallelize: your parallelize(model, mesh) on a 2x2 mesh ("dp", "tp") and the course's model
  (two LayerNorm-MLP blocks): every parameter sharded by fully_shard over this rank's DP group and
  no more elements held than torch's parallelize_module + fully_shard hold; every all-reduce of a
  forward and backward over the TP group; 3 AdamW steps whose losses (the global batch's mean)
  equal one process's on the whole batch, on every rank, as torch's do.
"""
import torch

from ..engine import GradingError, expect, grader
from ..engine.boundary import grading_seed
from ..engine.ranks import run_on_ranks
from ...topics.from_scratch import two_d
from .ranks import LR, MODEL_SEED, STEPS, groups_on_rank, inputs, parallelize_on_rank, rows

DATA_SEED, LAUNCH_TIMEOUT_S = 20, 120
SHAPES = ((2, 3), (3, 2))
LOSS_RTOL = 1e-5  # one process against the mesh differ by float32 reordering: 1e-7 measured
SAME_GROUPS = ("every rank must call dist.new_group for every group, members or not, in the same order; "
               "and the same collectives in the same order")
LIBRARY = "this exercise asks you to build it: write it with dist.new_group, without init_device_mesh or DeviceMesh"


def _judge_groups(seen, rank, shape, data_seed):
    where, tp_size = f"rank {rank} on a {shape} grid (dp x tp)", int(shape.split("x")[1])
    for name, other in (("tp", "dp"), ("dp", "tp")):
        got, expected = seen[name], seen[f"torch_{name}"]
        if got == expected:
            continue
        hint = ("a TP group is a row of the grid: consecutive ranks (rank // tp_size is the DP "
                "index, rank % tp_size the TP index: init_device_mesh's row-major layout)"
                if name == "tp" else "a DP group is a column of the grid: ranks tp_size apart")
        if got == seen[f"torch_{other}"]:
            hint = f"your {name} group is torch's {other} group: the two are swapped; " + hint
        raise GradingError(f"{where}: the ranks of your {name} group (an all-gather over it)",
                           str(expected), str(got), hint)
    batch, dp_size = rows(data_seed), int(shape.split("x")[0])
    expected, got = batch.chunk(dp_size)[seen["dp_index"]], seen["rows"]
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and torch.equal(got, expected):
        return
    world = len(seen["torch_tp"]) * dp_size
    if isinstance(got, torch.Tensor) and torch.equal(got, batch):
        hint = "every rank got the whole batch: the DP groups must each train on their own rows"
    elif isinstance(got, torch.Tensor) and torch.equal(got, batch.chunk(world)[rank]):
        hint = ("one slice per rank: the TP ranks of one DP group must see the same rows (they "
                "split the model, not the batch): slice by the rank in dp_group")
    else:
        hint = "batch.chunk(size of dp_group)[rank in dp_group]: dist.get_world_size/get_rank take a group"
    raise GradingError(f"{where}: local_batch's rows", f"rows {seen['dp_index'] * len(expected)}.."
                       f"{(seen['dp_index'] + 1) * len(expected) - 1} of {len(batch)} (DP index "
                       f"{seen['dp_index']})", _rows_got(got, batch), hint)


def _rows_got(got, batch):
    if not isinstance(got, torch.Tensor):
        return str(got)
    found = [i for i in range(len(batch)) for row in got if torch.equal(row, batch[i])]
    return f"{len(got)} rows: {found}" if len(found) == len(got) else f"a tensor of shape {tuple(got.shape)}"


@grader("mesh groups")
def check_mesh_groups(mesh_groups, local_batch):
    data_seed = grading_seed(DATA_SEED)
    results = run_on_ranks(groups_on_rank, mesh_groups, local_batch, SHAPES, data_seed, nprocs=6,
                           what="mesh_groups and local_batch on 6 ranks", hang_hint=SAME_GROUPS,
                           timeout=LAUNCH_TIMEOUT_S)
    first = results[0]
    if "library_calls" in first:
        raise GradingError("mesh_groups and local_batch", "your own groups and rows",
                           f"calls to {', '.join(sorted(set(first['library_calls'])))}", LIBRARY)
    expect("not_a_pair" not in first, "mesh_groups(dp_size, tp_size)", "(tp_group, dp_group)",
           first.get("not_a_pair", ""), "return the two groups this rank belongs to, TP first")
    for rank, result in enumerate(results):
        for shape, seen in result["shapes"].items():
            _judge_groups(seen, rank, shape, data_seed)


# -- exercise 2 ----------------------------------------------------------------------------------------
def _judge_parameters(result, rank):
    where = f"rank {rank}: your model's parameters"
    for name, kind, mesh, _ in result["parameters"]:
        if mesh is None:
            raise GradingError(where, "every parameter sharded by fully_shard (a DTensor)",
                               f"{name} is a plain {kind}", "fully_shard(model, mesh=mesh['dp']) "
                               "after your TP layers are in place (each block, then the model)")
        if mesh != result["dp"]:
            if isinstance(mesh[0], list):
                hint = ("torch's parallelize_module made 2-D DTensors: this exercise asks for your column "
                        "and row layers (lesson 17's) on mesh['tp'].get_group()")
            else:
                over = "the TP group" if mesh == result["tp"] else "every rank" if len(mesh) == 4 else str(mesh)
                hint = f"fully_shard(model, mesh=mesh['dp']): FSDP shards over the DP group only, yours over {over}"
            raise GradingError(where, f"{name} sharded over ranks {result['dp']} (this rank's DP group)",
                               f"sharded over {mesh}", hint)
    held = sum(n for *_, n in result["parameters"])
    expect(held <= result["torch_elements"], f"rank {rank}: the parameter elements it holds",
           f"{result['torch_elements']} (torch's TP inside fully_shard)", str(held),
           "split fc1 by its output features (column) and fc2 by its input features (row) over the "
           "TP group before fully_shard shards what is left over the DP group")


def _judge_collectives(result, rank):
    reduces = [ranks for step in result["collectives"] for name, ranks in step if name == "all_reduce"]
    where = f"rank {rank}: the all-reduces of your forwards and backwards"
    expect(reduces, where, f"all-reduces over the TP group {result['tp']}", "none",
           "the row layer sums its partial outputs, the column layer's input its gradients: both over the TP group")
    for ranks in reduces:
        if ranks != result["tp"]:
            hint = ("the TP layers are on the DP group: give them mesh['tp'].get_group()" if ranks == result["dp"]
                    else "an all-reduce over the whole world: pass the TP group (group=...) to every TP collective")
            raise GradingError(where, f"each over the TP group {result['tp']}", f"one over {ranks}", hint)


def _close(losses, expected):
    """Each loss against one process's, in float32's rounding; a missing or extra loss is not close."""
    close = [abs(a - b) <= LOSS_RTOL * abs(b) for a, b in zip(losses, expected)]
    return close if len(losses) == len(expected) else close + [False]


def _shown(losses):
    return "[" + ", ".join(f"{loss:.6f}" for loss in losses) + "]"


@grader("TP inside FSDP")
def check_parallelize(parallelize):
    data_seed = grading_seed(DATA_SEED)
    results = run_on_ranks(parallelize_on_rank, parallelize, data_seed, nprocs=4,
                           what="your parallelize on a 2x2 mesh", hang_hint=SAME_GROUPS, crash_hint=_crash_hint,
                           timeout=LAUNCH_TIMEOUT_S)
    first = results[0]
    if "library_calls" in first:
        raise GradingError("parallelize(model, mesh)", "your own composition",
                           "the course's two_d.parallelize", "compose the TP layers and fully_shard yourself")
    expect("not_a_module" not in first, "parallelize(model, mesh)", "the model (an nn.Module)",
           first.get("not_a_module", ""), "return the model, parallelized")
    expected = two_d.train(two_d.make_model(MODEL_SEED), *inputs(data_seed), STEPS, LR)
    for rank, result in enumerate(results):
        expect(all(_close(result["torch_losses"], expected)),
               f"torch's parallelize_module + fully_shard on rank {rank}", _shown(expected),
               _shown(result["torch_losses"]), "please report this machine and torch version")
        _judge_parameters(result, rank)
        _judge_collectives(result, rank)
        close = _close(result["losses"], expected)
        expect(all(close), f"rank {rank}: the losses of {STEPS} AdamW steps",
               f"one process's: {_shown(expected)}", _shown(result["losses"]),
               LOSS_HINTS["backward" if close[:1] == [True] else "forward"])


LOSS_HINTS = {
    "forward": "the first loss differs, so the forward does: the column layer keeps rows of weight (output "
               "features) and of bias, the row layer the same columns of weight, and adds its whole bias "
               "once, after the all-reduce over the TP group",
    "backward": "the first loss is right and the next differ: the gradients are wrong; the column layer's "
                "input must sum its gradient over the TP group in backward (each rank's columns give a "
                "part of it), and the row layer's backward passes the gradient through",
}


def _crash_hint(cause):
    if "shapes cannot be multiplied" in cause.summary or "size of tensor" in cause.summary:
        return ("the shapes do not fit: the column layer splits weight's rows (dim 0, its output "
                "features), the row layer weight's columns (dim 1, its input features)")
    return "the error is raised in your function: fix it, run its cell again, then the check"
