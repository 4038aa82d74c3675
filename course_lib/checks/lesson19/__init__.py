"""Graders for lesson 19, activation checkpointing and mixed-precision FSDP. Both run your code on 2
gloo ranks (ranks.py) with seeds from grading_seed; the ranks return what they saw, and every
comparison is made here.

- Checkpoint: your autograd Function around each of the course's 3 dropout blocks (p = 0.5), each
  rank on its own batch and dropout seed, the gradients averaged over the ranks by the course's
  code. Judged against one process without checkpointing, for each rank's batch: the parameters'
  averaged gradients and the input's gradient equal (dropout redrawn with another random state
  differs), autograd keeping no more tensors than torch.utils.checkpoint's reentrant version (its
  inputs; without checkpointing it keeps every activation), and the global random state after
  backward where it would be without checkpointing (a draw from it equal). Your own Function:
  torch.utils.checkpoint or the course's Checkpoint inside it is refused.
- MixedPrecisionUnit: your FSDPUnit subclass on a Linear-Tanh-Linear model, 12 SGD steps on each
  rank's batch, beside torch's fully_shard with MixedPrecisionPolicy(param_dtype=torch.bfloat16,
  reduce_dtype=torch.float32) on the same data. Judged: the shards (master weights) and their
  gradients fp32, the output bf16, the all-gathers handed bf16 and the reduce-scatters fp32, the
  losses and the final master weights close to fully_shard's (a bf16 master or a compute copy made
  once drifts away; the tolerances are measured, tests/topics/test_mixed_precision_unit.py).
"""
import torch

from ..engine import GradingError, expect, grader
from ..engine.boundary import grading_seed
from ..engine.ranks import run_on_ranks
from .ranks import checkpoint_on_rank, checkpoint_step, fsdp_on_rank

WORLD_SIZE, LAUNCH_TIMEOUT_S, MODEL_SEED, DATA_SEED = 2, 120, 19, 1900
LOSS_TOLERANCE, WEIGHT_TOLERANCE = 5e-5, 2e-6  # measured: a right unit is fully_shard to the bit;
# the nearest wrong one (a bf16 reduce-scatter) 7e-5 and 1.2e-5 away
SAME_COLLECTIVES = ("every rank must call the same collectives in the same order, with tensors of "
                    "the same size")
HINTS = {
    "grads": "the recompute must draw the same dropout masks as the forward did: note torch.get_rng_state() "
             "in forward and set it again before re-running the function in backward",
    "x_grad": "the input's gradient comes from the recompute: re-run the function on a detached copy of "
              "the input that requires grad, backprop through it, and return that copy's .grad",
    "saved": "a Function's forward already runs without grad: do not switch it back on "
             "(torch.enable_grad), and keep only its inputs (ctx.save_for_backward): the activations "
             "inside are what checkpointing gives up",
    "after": "setting the forward's random state for the recompute moves the global generator back; "
             "put the surrounding state back afterwards (set it inside torch.random.fork_rng, which "
             "notes the surrounding state and restores it when it ends)",
}


def _close(got, want):
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got, want, rtol=1e-4, atol=1e-5)


def _judge_your_own(results, what, exercise):
    called = results[0].get("library_calls")
    if called:
        raise GradingError(what, f"your own {exercise}", called[0],
                           f"this exercise asks you to write {exercise} yourself (the check sees "
                           "which functions run, whatever name they go by)")


@grader("activation checkpointing")
def check_checkpoint(Checkpoint):
    model_seed, data_seed = grading_seed(MODEL_SEED), grading_seed(DATA_SEED)
    what = "your Checkpoint on 2 ranks"
    results = run_on_ranks(checkpoint_on_rank, Checkpoint, model_seed, data_seed, nprocs=WORLD_SIZE,
                           what=what, hang_hint=SAME_COLLECTIVES, timeout=LAUNCH_TIMEOUT_S)
    _judge_your_own(results, what, "Checkpoint Function")
    plain = [checkpoint_step(model_seed, data_seed, rank) for rank in range(WORLD_SIZE)]
    averaged = [sum(grads) / WORLD_SIZE for grads in zip(*(p["grads"] for p in plain))]
    for rank, result in enumerate(results):
        mine, where = result["mine"], f"rank {rank}, blocks with dropout through your Checkpoint"
        expect(mine["x_grad"] is not None, f"{where}: the input's gradient", "one process's without "
               "checkpointing", "none", HINTS["x_grad"])
        for index, (got, want) in enumerate(zip(mine["grads"], averaged)):
            expect(got is not None and _close(got, want), f"{where}: parameter {index}'s gradient "
                   "(averaged over the ranks)", "one process's without checkpointing",
                   "none" if got is None else f"a difference of {(got - want).abs().max().item():.3g}",
                   HINTS["grads"])
        expect(_close(mine["x_grad"], plain[rank]["x_grad"]), f"{where}: the input's gradient",
               "one process's without checkpointing", "other values", HINTS["grads"] + "; " + HINTS["x_grad"])
        expect(mine["saved"] <= result["torch_saved"], f"{where}: tensors autograd keeps after the forward",
               f"at most {result['torch_saved']}, as torch.utils.checkpoint (without checkpointing: "
               f"{plain[rank]['saved']})", str(mine["saved"]), HINTS["saved"])
        expect(torch.equal(mine["after"], plain[rank]["after"]), f"{where}: the random state after backward",
               "where it is without checkpointing (the same torch.rand(4) drawn after backward)",
               "another state", HINTS["after"])


MIXED_HINTS = {
    "master": "the shards are the master weights: keep them in the model's fp32 and cast a copy to bf16 "
              "only for the gather",
    "grad": "the gradient lands in the fp32 shard's .grad: after the reduce-scatter, keep it (or cast it) "
            "in the shard's dtype",
    "output": "the forward computes in bf16: gather bf16 parameters (allocate_full(torch.bfloat16)) and "
              "cast the module's floating-point inputs to bf16 before its forward (a forward pre-hook)",
    "all_gather": "cast the shard to bf16 before the all-gather: half the bytes, and the compute copy",
    "reduce_scatter": "cast the bf16 gradient up to fp32 before the reduce-scatter, so that the sum over "
                      "the ranks is taken in fp32",
    "drift": "cast the fp32 shard to bf16 at every gather: a copy made once never sees the optimizer's "
             "updates, and a bf16 master weight loses the small ones",
}


def master_weight_gap(results) -> float:
    """The largest difference between the ranks' shards put together and fully_shard's weights."""
    units = [torch.cat(shards) for shards in zip(*(r["mine"]["shards"] for r in results))]
    torch_full = results[0]["torch"]["full"]  # weight, bias of each Linear: a unit each
    pairs = [torch.cat(torch_full[i:i + 2]) for i in range(0, len(torch_full), 2)]
    return max((unit[:pair.numel()] - pair).abs().max().item() for unit, pair in zip(units, pairs))


def _unit_crash_hint(cause):
    if "dtype" in cause.summary and "grad" in cause.summary:  # e.g. grad_dtype
        return MIXED_HINTS["grad"]
    if "dtype" in cause.summary:
        return MIXED_HINTS["output"]
    return "the error is raised in your class: fix it, run its cell again, then the check"


@grader("mixed-precision FSDP")
def check_mixed_precision_unit(MixedPrecisionUnit):
    model_seed, data_seed = grading_seed(MODEL_SEED), grading_seed(DATA_SEED)
    what = "your MixedPrecisionUnit on 2 ranks"
    results = run_on_ranks(fsdp_on_rank, MixedPrecisionUnit, model_seed, data_seed, nprocs=WORLD_SIZE,
                           what=what, hang_hint=SAME_COLLECTIVES, timeout=LAUNCH_TIMEOUT_S,
                           crash_hint=_unit_crash_hint)
    _judge_your_own(results, what, "MixedPrecisionUnit")
    for rank, result in enumerate(results):
        mine, where = result["mine"], f"{what}, rank {rank}"
        expect(all(d == torch.float32 for d in mine["shard_dtypes"]), f"{where}: the shards' dtype",
               "torch.float32 (the master weights)", str(mine["shard_dtypes"]), MIXED_HINTS["master"])
        expect(all(d == torch.float32 for d in mine.get("grad_dtypes", [None])), f"{where}: the shards' "
               "gradients' dtype after backward", "torch.float32", str(mine.get("grad_dtypes")), MIXED_HINTS["grad"])
        expect(mine.get("output_dtype") == torch.bfloat16, f"{where}: the model's output dtype",
               "torch.bfloat16", str(mine.get("output_dtype")), MIXED_HINTS["output"])
        for name, dtype in (("all_gather", "bfloat16"), ("reduce_scatter", "float32")):
            expect(mine["collectives"].get(name) == [dtype], f"{where}: the tensors handed to {name}",
                   dtype, str(mine["collectives"].get(name, "no call")), MIXED_HINTS[name])
        gap = max(abs(a - b) for a, b in zip(mine["losses"], result["torch"]["losses"]))
        expect(gap <= LOSS_TOLERANCE, f"{where}: the losses of 12 steps", f"fully_shard's, within "
               f"{LOSS_TOLERANCE:g}", f"up to {gap:.3g} away", MIXED_HINTS["drift"])
    gap = master_weight_gap(results)
    expect(gap <= WEIGHT_TOLERANCE, f"{what}: the master weights after 12 steps", "fully_shard's, within "
           f"{WEIGHT_TOLERANCE:g}", f"up to {gap:.3g} away", MIXED_HINTS["drift"])
