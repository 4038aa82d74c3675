"""Grader for lesson 05, gradient accumulation and `no_sync`: an accumulation loop that matches
the large batch with one all-reduce per step.

- accumulation with no_sync: one forward per micro-batch (never the group at once); DDP's
  all-reduce on the last micro-batch of each step and on no other, so exactly one per optimizer
  step; the weights after every optimizer step equal one process's on the whole global batch; the
  returned losses (floats: any real number type, not tensors), one per step, are this rank's: the loss of its own
  share of each global batch (the mean over its micro-batches), not the global batch's loss
  averaged over the ranks. The loop is the learner's own: a call of the course's
  accumulate_with_no_sync does not count.

The loop's grader runs your function on 2 gloo ranks (on the CPU, so it grades the same on a
laptop and a GPU node), counts DDP's all-reduces with a comm hook and notes, at every forward of
the model, how many have run so far (so it sees which micro-batch's backward all-reduced), and
compares the weights after every optimizer step with one process that trains on the whole global
batch.
"""
import numbers

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from .engine.boundary import grading_seed
from .engine.oracle import close, large_batch_sgd
from .engine.ranks import run_on_ranks
from .engine import describe, expect, expect_close, grader
from .engine.call_watch import calls_of
from .engine.learner_call import library_call_hint
from ..topics.accumulation import _accumulate, accumulate_with_no_sync
from ..training.data import make_dataset
from ..training.models import make_model

WORLD_SIZE = 2
LAUNCH_TIMEOUT_S = 60
LR = 0.5
MICRO_BATCH_SIZE = 4
DATA_SEED = 5  # of the global batches in a notebook; grading_seed(DATA_SEED) at grading time
LOOP_CASES = ((4, 3), (2, 2))  # (grad_accum_steps, optimizer steps): 12 and 4 micro-batches per rank


# -- the exercise: accumulation with no_sync ------------------------------------------------

def grading_micro_batches(grad_accum_steps, steps, rank, world_size=WORLD_SIZE, seed=DATA_SEED):
    """Rank `rank`'s micro-batches, in order: `steps` global batches, each dealt to the ranks
    like DistributedSampler (sample i to rank i % world_size), each rank's share cut in
    grad_accum_steps micro-batches of MICRO_BATCH_SIZE."""
    global_batch_size = MICRO_BATCH_SIZE * grad_accum_steps * world_size
    X, y = make_dataset(steps * global_batch_size, seed=seed).tensors
    micro_batches = []
    for X_global, y_global in zip(X.split(global_batch_size), y.split(global_batch_size)):
        X_rank, y_rank = X_global[rank::world_size], y_global[rank::world_size]
        micro_batches += zip(X_rank.split(MICRO_BATCH_SIZE), y_rank.split(MICRO_BATCH_SIZE))
    return micro_batches


def large_batch_run(grad_accum_steps, steps, world_size=WORLD_SIZE, seed=DATA_SEED):
    """The reference: one process, one optimizer step per global batch. Returns the loss, the
    weights after every step, and each rank's loss on its share of every global batch."""
    global_batch_size = MICRO_BATCH_SIZE * grad_accum_steps * world_size
    X, y = make_dataset(steps * global_batch_size, seed=seed).tensors
    rank_losses = [[] for _ in range(world_size)]

    def record_rank_shares(model, X_global, y_global):  # dealt like DistributedSampler: i % world_size
        for rank in range(world_size):
            share = F.cross_entropy(model(X_global[rank::world_size]), y_global[rank::world_size])
            rank_losses[rank].append(share.item())

    batches = zip(X.split(global_batch_size), y.split(global_batch_size))
    losses, weights = large_batch_sgd(batches, LR, before_each_step=record_rank_shares)
    return losses, weights[1:], rank_losses


def counting_all_reduces(ddp_model) -> list:
    """Make DDP count its all-reduces: the list gets one entry (the bucket's size) per call."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls = []

    def counting_hook(process_group, bucket):
        calls.append(bucket.buffer().numel())
        return allreduce_hook(process_group, bucket)  # what DDP does without a hook

    ddp_model.register_comm_hook(None, counting_hook)
    return calls


def _loop_on_rank(train_with_accumulation, grad_accum_steps, steps, seed):
    """One run of the learner's loop on this rank: its losses, and for every optimizer step the
    weights after it and the all-reduces it took; observations only, as plain data (the grader
    compares them with its own reference)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    ddp_model = DDP(make_model(seed=0))
    all_reduces = counting_all_reduces(ddp_model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    records = []  # (weights after the step, all-reduces so far)

    def record(optimizer, args, kwargs):
        weights = parameters_to_vector(ddp_model.module.parameters()).detach().clone()
        records.append((weights, len(all_reduces)))

    optimizer.register_step_post_hook(record)
    forwards = []  # (samples, all-reduces so far, DDP set to sync) at every forward, through DDP or around it
    ddp_model.module.register_forward_pre_hook(lambda module, args: forwards.append(
        (len(args[0]), len(all_reduces), ddp_model.require_backward_grad_sync)))
    backwards = []  # at every backward (its first gradient ready): DDP set to sync, as no_sync sets it
    first_ready = list(ddp_model.module.parameters())[-1]
    first_ready.register_post_accumulate_grad_hook(
        lambda param: backwards.append(ddp_model.require_backward_grad_sync))
    micro_batches = grading_micro_batches(grad_accum_steps, steps, rank, seed=seed)
    with calls_of(accumulate_with_no_sync, _accumulate) as library_calls:
        losses = train_with_accumulation(ddp_model, optimizer, micro_batches, grad_accum_steps)
    if library_calls:
        return {"library_calls": library_calls}
    not_a_float = next((describe(loss) for loss in losses if not _is_a_float(loss)), None) \
        if isinstance(losses, (list, tuple)) else None
    holds_a_graph = any(getattr(loss, "requires_grad", False) for loss in losses) \
        if isinstance(losses, (list, tuple)) else False
    try:
        losses = [float(loss) for loss in losses]
    except (TypeError, ValueError, RuntimeError):
        losses = repr(losses)[:80]  # the grader says so; a crash here would hide the reason
    return {"losses": losses, "records": records, "total_all_reduces": len(all_reduces),
            "forwards": forwards, "backwards": backwards, "not_a_float": not_a_float,
            "holds_a_graph": holds_a_graph}


def _is_a_float(value) -> bool:
    """A real number of any type (float, NumPy's floats), not a bool and not a tensor."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _cases_on_rank(train_with_accumulation, seed):
    return [_loop_on_rank(train_with_accumulation, grad_accum_steps, steps, seed)
            for grad_accum_steps, steps in LOOP_CASES]


def _run_on_ranks(fn, *args, what: str):
    """fn(*args) on WORLD_SIZE quiet gloo ranks; a crash, a hang or a stub is explained."""
    return run_on_ranks(fn, *args, nprocs=WORLD_SIZE, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint="every rank must run the same backward passes outside no_sync, "
                                  "so that DDP's all-reduces pair up",
                        crash_hint="run the cell that defines it; it gets (ddp_model, optimizer, "
                                   "micro_batches, grad_accum_steps) and returns a list of losses")


@grader("accumulation with no_sync")
def check_train_with_accumulation(train_with_accumulation):
    what = "train_with_accumulation on 2 ranks"
    seed = grading_seed(DATA_SEED)  # the 2 ranks and the cases' sizes are the exercise's own
    references = [large_batch_run(*case, seed=seed) for case in LOOP_CASES]  # before forking
    per_rank = _run_on_ranks(_cases_on_rank, train_with_accumulation, seed, what=what)
    for case, (grad_accum_steps, steps) in enumerate(LOOP_CASES):
        runs = [ranks_cases[case] for ranks_cases in per_rank]
        expect("library_calls" not in runs[0], what, "your own accumulation loop",
               "a call of course_lib.topics.accumulation.accumulate_with_no_sync",
               library_call_hint("accumulate_with_no_sync", "the exercise"))
        setting = f"grad_accum_steps={grad_accum_steps}, {grad_accum_steps * steps} micro-batches"
        _expect_one_forward_per_micro_batch(runs, grad_accum_steps * steps, setting)
        _expect_steps(runs, steps, setting)
        _expect_all_reduces_on_last_micro_batches(runs, grad_accum_steps, setting)
        _expect_large_batch_weights(runs, references[case][1], grad_accum_steps, setting)
        _expect_one_all_reduce_per_step(runs, grad_accum_steps, setting)
        _expect_losses(runs, references[case][0], references[case][2], steps, setting)


def _expect_one_forward_per_micro_batch(runs, micro_batches, setting):
    samples = [count for count, *_ in runs[0]["forwards"]]
    expect(samples == [MICRO_BATCH_SIZE] * micro_batches, f"the model's forwards on rank 0 "
           f"({setting})", f"{micro_batches} forwards of {MICRO_BATCH_SIZE} samples, one per "
           "micro-batch", f"{len(samples)} forwards of {sorted(set(samples))} samples",
           "a micro-batch is as large as one forward may be (what fits in memory): run each "
           "micro-batch through the model on its own" if any(n > MICRO_BATCH_SIZE for n in samples)
           else "run every micro-batch of the list through the model once")


def _all_reduces_per_micro_batch(run) -> list:
    """How many all-reduces each micro-batch's backward ran: the count at the next forward (or at
    the end) minus the count at its own forward."""
    counts = [count for _, count, _ in run["forwards"]] + [run["total_all_reduces"]]
    return [after - before for before, after in zip(counts, counts[1:])]


def _expect_all_reduces_on_last_micro_batches(runs, grad_accum_steps, setting):
    for rank, run in enumerate(runs):
        per_micro_batch = _all_reduces_per_micro_batch(run)
        for index, count in enumerate(per_micro_batch):
            last = (index + 1) % grad_accum_steps == 0
            if count == (1 if last else 0):
                continue
            position = f"micro-batch {index % grad_accum_steps + 1} of {grad_accum_steps} " \
                       f"in optimizer step {index // grad_accum_steps}"
            if not count:
                hint = (f"the last micro-batch of optimizer step {index // grad_accum_steps} did "
                        "not all-reduce: the ranks stepped with gradients never averaged")
            elif _backward_only_in_no_sync(run, index):
                hint = (f"the backward of {position} ran inside no_sync, but its forward ran "
                        "outside it, and DDP decides in the forward whether the backward that "
                        "follows all-reduces: so it did")
            else:
                hint = (f"the backward of {position} all-reduced the gradients: only the last "
                        "micro-batch's may, the others accumulate locally")
            expect(False, f"DDP's all-reduces after {position} on rank {rank} ({setting})",
                   "1 (the last micro-batch of the step)" if last else
                   "0 (the gradients stay local until the last micro-batch)", str(count), hint)


def _backward_only_in_no_sync(run, index) -> bool:
    """Whether micro-batch `index` ran its forward with DDP set to sync and its backward inside
    no_sync (one backward per forward, or nothing is claimed)."""
    forwards, backwards = run["forwards"], run["backwards"]
    return (len(forwards) == len(backwards) and forwards[index][2] and not backwards[index])


def _expect_steps(runs, steps, setting):
    taken = len(runs[0]["records"])
    expect(taken == steps, f"the optimizer steps taken ({setting})", str(steps), str(taken),
           f"{taken} optimizer steps for {steps} groups of micro-batches: one step per group, "
           "after its last micro-batch")


def _expect_large_batch_weights(runs, reference_weights, grad_accum_steps, setting):
    for step, expected in enumerate(reference_weights):
        before = reference_weights[step - 1] if step else \
            parameters_to_vector(make_model(seed=0).parameters()).detach()
        for rank, run in enumerate(runs):
            got = run["records"][step][0]
            if close(got, expected):
                continue
            update, expected_update = got - before, expected - before
            if not close(runs[0]["records"][step][0], runs[1]["records"][step][0]):
                hint = (f"the ranks' weights differ after optimizer step {step}: the gradients "
                        "they stepped with were not averaged over the ranks")
            elif close(update, grad_accum_steps * expected_update):
                hint = (f"step {step}'s update is {grad_accum_steps} times one process's: it "
                        f"used the sum of its {grad_accum_steps} micro-batches' gradients, where "
                        "the global batch's loss is their mean")
            elif close(update, expected_update / grad_accum_steps):
                hint = (f"step {step}'s update is 1/{grad_accum_steps} of one process's: it "
                        "used one micro-batch's gradient, not its whole group's")
            else:
                hint = (f"step {step} did not use exactly its own group of {grad_accum_steps} "
                        "micro-batches: compare which micro-batches' gradients were in .grad "
                        "when the optimizer stepped")
            expect(False, f"rank {rank}'s weights after optimizer step {step} ({setting})",
                   "the weights of one process trained on the whole global batch",
                   f"weights off by up to {(got - expected).abs().max().item():.2e}", hint)


def _expect_one_all_reduce_per_step(runs, grad_accum_steps, setting):
    counts = [0] + [count for _, count in runs[0]["records"]]
    per_step = [after - before for before, after in zip(counts, counts[1:])]
    expect(all(count == 1 for count in per_step),
           f"DDP's all-reduces per optimizer step ({setting})",
           f"1 per step: {[1] * len(per_step)}", str(per_step),
           "more than one micro-batch of a step all-reduced its gradients"
           if any(count > 1 for count in per_step) else
           "a step whose micro-batches never all-reduced stepped with local gradients")


def _expect_losses(runs, reference_losses, rank_losses, steps, setting):
    for rank, run in enumerate(runs):
        losses = run["losses"]
        expect(isinstance(losses, list) and len(losses) == steps,
               f"the losses rank {rank} returned ({setting})",
               f"a list of {steps} numbers, one per optimizer step", str(losses)[:80],
               "append the step's loss after each optimizer step, and return the list")
    for rank, run in enumerate(runs):
        odd = run["not_a_float"]
        expect(odd is None, f"the losses rank {rank} returned ({setting})",
               "a float per optimizer step", odd or "",
               "a tensor that still holds the autograd graph of its micro-batches: the list keeps "
               "every step's graph in memory for as long as it lives; the exercise asks for the "
               "number alone" if run["holds_a_graph"] else
               "a tensor where the exercise asks for a number: the caller logs, plots or compares "
               "floats")
    for rank, run in enumerate(runs):
        if _all_close(run["losses"], reference_losses) and not _all_close(reference_losses,
                                                                        rank_losses[rank]):
            hint = ("these are the global batch's losses, the mean over the ranks: return this "
                    "rank's own, without an all-reduce (averaging them is the caller's choice)")
        else:
            hint = (f"rank {rank}'s loss for a step is the mean of its own micro-batches' losses "
                    "in that step (compare your first value with theirs)")
        expect_close(run["losses"], rank_losses[rank],
                     f"the losses rank {rank} returned ({setting}), one per optimizer step",
                     hint, rtol=1e-4)


def _all_close(a, b) -> bool:
    return torch.allclose(torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64),
                          rtol=1e-4, atol=1e-8)
