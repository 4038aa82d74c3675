"""Graders for lesson 17, tensor and sequence parallelism built from collectives. Both run your
code on 2 gloo ranks, then on 3 (ranks.py), on the course's parts (topics/from_scratch/
transformer_parts.py; on 3 ranks hidden 12 and 3 heads, so that every layer splits in 3),
with inputs and output gradients drawn from grading_seed; the ranks return what they computed and
which collectives they called, and every comparison is made here.

- both: your own classes; one that subclasses or calls the course's (topics/from_scratch/
  tensor_parallel.py, sequence_parallel.py), or holds torch's DTensors, is refused as not your own.
- tensor parallelism: your ColumnParallelLinear and RowParallelLinear split an MLP (fc1 column,
  fc2 row) and an attention (qkv column, whole heads per rank; out row). Each rank's output and
  input gradient equal one process's unsplit part (and torch's DTensor ColwiseParallel/
  RowwiseParallel); each rank's weight and bias gradients are its slice of one process's
  (column: rows; row: columns, the bias whole), each slice in a storage of its own (a view
  keeps the whole matrix alive on every rank); one all-reduce in the forward, one in the
  backward, nothing else.
- sequence parallelism: your SequenceParallelMLP around the course's Block (LayerNorm, MLP,
  residual) on a 1/world_size sequence shard per rank: output and input-gradient shards equal one
  process's (and torch's SequenceParallel + ColwiseParallel/RowwiseParallel on Shard(0)); one
  all-gather and one reduce-scatter in the forward and in the backward, no all-reduce; after
  finish_gradient_sync() (all-reduces only) the replicated parameters' gradients are one
  process's, the split ones their slices.
The lesson's split and its predictions are for 2 ranks; the 3-rank run sees a split written for 2
(chunk(2), a size // 2, a shape * 2): it must hold for any world size. torch's DTensor, a
reference beside yours, runs on 2 ranks only (on 3 it agreed with one process when this grader
was written; left out there, it keeps the check short).
"""
import torch

from ..engine import GradingError, expect, grader
from ..engine.boundary import grading_seed
from ..engine.ranks import run_on_ranks
from .ranks import LAYERS, SP_PARAMETERS, inputs, part, sp_on_rank, tp_on_rank

WORLD_SIZES, LAUNCH_TIMEOUT_S, DATA_SEED = (2, 3), 120, 17
SAME_COLLECTIVES = ("every rank must call the same collectives in the same order, with tensors of "
                    "the same size")
LIBRARY = ("your own classes", "ones that call the course's tensor_parallel/sequence_parallel code",
           "this exercise asks you to build them from collectives: write them with dist.* calls")
NOT_YOUR_OWN = ("a class that inherits from the course's is not your own, whichever methods it "
                "rewrites: write your class whole (nn.Module), with dist.* calls")


def _judge_your_own(results, what):
    """Refuses classes built on the course's (ranks.course_bases), calling its code, or handing the
    layers to torch's DTensor (ranks.torch_tensors)."""
    bases = results[0].get("course_bases")
    if bases:
        raise GradingError(what, "your own classes", f"a subclass of {bases[0]}", NOT_YOUR_OWN)
    if results[0].get("library_calls"):
        raise GradingError(what, *LIBRARY)
    dtensors = results[0].get("torch_tensors")
    if dtensors:
        raise GradingError(what, "your own classes, built from dist.* collectives",
                           f"torch's DTensor parallelism inside them ({dtensors[0]} is a DTensor)",
                           "parallelize_module is what the check compares you with: this exercise "
                           "asks you to split the weights and write the collectives yourself")


def _one_process(kind, data_seed, world_size):
    """The unsplit part's output, input gradient and parameter gradients (name -> tensor)."""
    x, grad_out = inputs(data_seed, world_size)
    whole = part(kind, world_size)
    x = x.clone().requires_grad_()
    out = whole(x)
    out.backward(grad_out)
    return out.detach(), x.grad, {name: p.grad for name, p in whole.named_parameters()}


def _close(got, expected):
    return isinstance(got, torch.Tensor) and got.shape == expected.shape and \
        torch.allclose(got, expected, rtol=1e-4, atol=1e-5)


def _shape(tensor):
    if not isinstance(tensor, torch.Tensor):
        return "nothing (no gradient)" if tensor is None else str(tensor)
    return f"a tensor of shape {tuple(tensor.shape)}"


def _judge_tensor(got, expected, what, hint):
    if _close(got, expected):
        return
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        raise GradingError(what, f"a tensor of shape {tuple(expected.shape)}", _shape(got), hint)
    ratio = float(got.norm() / expected.norm()) if expected.norm() > 0 else float("nan")
    raise GradingError(what, "one process's values", f"other values ({ratio:.2f} times as large)", hint)


def _judge_collectives(got, expected, what, hint):
    expect(sorted(got) == sorted(expected), what, str(expected) if expected else "no collective",
           str(got) if got else "no collective", hint)


def _judge_torch(results, oracle, what):
    """torch's DTensor run beside yours: a reference, so a mismatch is the machine's, not yours."""
    for rank, result in enumerate(results):
        for got, expected in zip(result, oracle):
            expect(_close(got, expected), f"torch's DTensor on rank {rank} ({what})",
                   "one process's values", "other values", "please report this machine and torch version")


# -- exercise 1: column- and row-parallel Linear --------------------------------------------------------
TP_HINTS = {
    "out": "the row layer's partial results must be summed across ranks (all-reduce) and its bias "
           "added once, after the sum",
    "x_grad": "each rank's columns give only a part of dL/dx: the column layer's input needs the "
              "identity-forward / all-reduce-backward Function, and the row layer's backward passes "
              "dL/dy through unchanged",
    "column": "the column-parallel layer keeps weight rows (output features) rank*n/world_size.. "
              "and the same slice of the bias",
    "row": "the row-parallel layer keeps weight columns (input features), in the same order as the "
           "column layer's rows, and the whole bias",
}


def _output_hint(got, expected, bias, world_size):
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and \
            torch.allclose(got - expected, (world_size - 1) * bias.expand_as(got), atol=1e-4):
        return (f"the output is one process's plus {world_size - 1} extra bias: the row layer's bias "
                f"was added on every rank before the all-reduce summed them; add it once, after")
    return ("the column layer keeps a contiguous block of weight's rows (rank * out / world_size on), "
            "the row layer the same block of weight's columns, so that each rank's activations meet "
            "their own weights; " + TP_HINTS["out"])


FOR_ANY_WORLD = ("on 3 ranks each rank keeps a third: split with dist.get_world_size() and "
                 "dist.get_rank(), never a 2 written in (chunk(2), a size // 2, a shape * 2)")


def _crash_hint(world_size):
    def hint(cause):
        if world_size != 2:
            return FOR_ANY_WORLD
        if "shapes cannot be multiplied" in cause.summary or "size of tensor" in cause.summary:
            return ("the shapes do not fit: the column layer splits weight's rows (dim 0, its output "
                    "features), the row layer weight's columns (dim 1, its input features)")
        return "the error is raised in your function: fix it, run its cell again, then the check"
    return hint


@grader("tensor-parallel Linear layers")
def check_tensor_parallel(ColumnParallelLinear, RowParallelLinear):
    data_seed = grading_seed(DATA_SEED)
    for world_size in WORLD_SIZES:
        results = run_on_ranks(tp_on_rank, ColumnParallelLinear, RowParallelLinear, data_seed,
                               world_size == 2, nprocs=world_size, what=f"your layers on {world_size} ranks",
                               hang_hint=SAME_COLLECTIVES, crash_hint=_crash_hint(world_size),
                               timeout=LAUNCH_TIMEOUT_S)
        _judge_your_own(results, "ColumnParallelLinear and RowParallelLinear")
        for kind in LAYERS:
            _judge_split(results, kind, data_seed, world_size)


def _judge_split(results, kind, data_seed, world_size):
    first, second = LAYERS[kind]
    out, x_grad, grads = _one_process(kind, data_seed, world_size)
    full = [grads[f"{first}.weight"], grads[f"{first}.bias"], grads[f"{second}.weight"],
            grads[f"{second}.bias"]]
    bias = part(kind, world_size).get_submodule(second).bias.detach()
    if results[0]["torch"]:  # torch's DTensor beside yours on 2 ranks (the same parts split in 3 too)
        _judge_torch([[r["torch"][kind]["out"], r["torch"][kind]["x_grad"], *r["torch"][kind]["grads"]]
                      for r in results], [out, x_grad, *full], kind)
    wider = "" if world_size == 2 else "; " + FOR_ANY_WORLD
    for rank, result in enumerate(results):
        seen, where = result["mine"][kind], f"the split {kind} on rank {rank} of {world_size}"
        _judge_collectives(seen["forward"], ["all_reduce"], f"{where}: the forward's collectives",
                           "one all-reduce in the forward: the row layer's partial sums")
        _judge_collectives(seen["backward"], ["all_reduce"], f"{where}: the backward's collectives",
                           "one all-reduce in the backward: the column layer's input gradient; "
                           "the row layer's backward passes the gradient through")
        expect(not seen["views"], f"{where}: the memory behind its slices",
               "each slice in a storage of its own", f"{', '.join(seen['views'])}: views of the "
               "whole layer's tensor", "a slice of linear.weight shares the whole matrix's "
               "storage, so every rank keeps all of it alive: .clone() the slice")
        _judge_tensor(seen["out"], out, f"{where}: the output",
                      _output_hint(seen["out"], out, bias, world_size) + wider)
        _judge_tensor(seen["x_grad"], x_grad, f"{where}: the input's gradient", TP_HINTS["x_grad"] + wider)
        expected = [full[0].chunk(world_size, 0)[rank], full[1].chunk(world_size, 0)[rank],
                    full[2].chunk(world_size, 1)[rank], full[3]]
        names = [f"{first}.weight", f"{first}.bias", f"{second}.weight", f"{second}.bias"]
        for got, want, name in zip(seen["grads"], expected, names):
            _judge_tensor(got, want, f"{where}: {name}'s gradient (this rank's slice)",
                          TP_HINTS["column" if name.startswith(first) else "row"] + wider)


# -- exercise 2: sequence parallelism -----------------------------------------------------------------
SP_HINTS = {
    "forward": "forward: all-gather the normalised shards before fc1, reduce-scatter fc2's partial "
               "results: these replace TP's all-reduce, and no all-reduce is left",
    "backward": "backward: the gather's twin reduce-scatters, the scatter's twin all-gathers; no "
                "CopyToParallel before fc1 (the gather's backward already sums the ranks' parts)",
    "sync": "finish_gradient_sync() only all-reduces the gradients of the replicated parameters",
    "replicated": "LayerNorm's parameters and fc2's bias are on every rank, but each rank's gradient "
                  "covers only its tokens: finish_gradient_sync() must sum them over the ranks",
}


@grader("sequence parallelism")
def check_sequence_parallel(SequenceParallelMLP):
    data_seed = grading_seed(DATA_SEED)
    for world_size in WORLD_SIZES:
        results = run_on_ranks(sp_on_rank, SequenceParallelMLP, data_seed, world_size == 2,
                               nprocs=world_size,
                               what=f"your SequenceParallelMLP on {world_size} ranks",
                               hang_hint=SAME_COLLECTIVES, crash_hint=_crash_hint(world_size),
                               timeout=LAUNCH_TIMEOUT_S)
        _judge_your_own(results, "SequenceParallelMLP")
        _judge_sequence_parallel(results, data_seed, world_size)


def _judge_sequence_parallel(results, data_seed, world_size):
    out, x_grad, grads = _one_process("block", data_seed, world_size)
    full = [grads[name] for name in ("norm.weight", "norm.bias", "mlp.fc1.weight", "mlp.fc1.bias",
                                     "mlp.fc2.weight", "mlp.fc2.bias")]
    wider = "" if world_size == 2 else "; " + FOR_ANY_WORLD
    for rank, result in enumerate(results):
        seen, where = result["mine"], f"SequenceParallelMLP on rank {rank} of {world_size}"
        expected = [full[0], full[1], full[2].chunk(world_size, 0)[rank],
                    full[3].chunk(world_size, 0)[rank], full[4].chunk(world_size, 1)[rank], full[5]]
        shards = [out.chunk(world_size)[rank], x_grad.chunk(world_size)[rank]]
        if result["torch"]:
            _judge_torch([[result["torch"]["out"], result["torch"]["x_grad"]]], shards, "sequence parallel")
            _judge_torch([result["torch"]["grads"]], full, "sequence parallel")
        for phase in ("forward", "backward"):
            _judge_collectives(seen[phase], ["all_gather", "reduce_scatter"],
                               f"{where}: the {phase}'s collectives", SP_HINTS[phase])
        expect(bool(seen["sync"]) and set(seen["sync"]) == {"all_reduce"},
               f"{where}: finish_gradient_sync()'s collectives", "all-reduces (one or more)",
               str(seen["sync"]) if seen["sync"] else "no collective", SP_HINTS["sync"])
        _judge_tensor(seen["out"], shards[0], f"{where}: its output shard", SP_HINTS["forward"] + wider)
        _judge_tensor(seen["x_grad"], shards[1], f"{where}: its input shard's gradient",
                      SP_HINTS["backward"] + wider)
        for got, want, name in zip(seen["grads"], expected, SP_PARAMETERS):
            replicated = name.startswith("norm") or name == "fc2_bias"
            _judge_tensor(got, want, f"{where}: {name}'s gradient" + ("" if replicated else
                          " (this rank's slice)"), SP_HINTS["replicated"] if replicated else
                          SP_HINTS["backward"] + wider)
