"""Lesson 13 graders: find the bug. Each runs the fixed function on 2 gloo ranks and judges what
it does, never how it is written.

- the end of an epoch: on every rank, end_of_epoch returns the mean of the ranks' epoch losses and
  rank 0's learning rate, two epochs in a row, on 2 ranks and on 3; in one epoch rank 0's rate is
  the smallest, in the other the largest, so a rule that makes the ranks agree on another value
  is seen.
- the cached data: load_data returns the dataset on every rank, only rank 0 writes the file, and
  only when it is missing; no rank reads it before it is complete, while rank 0's disk writes it
  slowly, piece by piece (slow_disk.py), whether rank 1 starts at once or late, on the
  first run and on the next.
- the logged loss: step_and_loss trains like one process on the global batch (four DDP steps),
  and returns that batch's loss on every rank.
- data parallel by hand: hand_ddp_step's weights after each of four steps are one process's on
  the global batch, on every rank, with the optimizer's learning rate left as it was.
- noise of its own: add_noise returns X plus noise of std NOISE_STD, the same for the same
  (seed, step) on a rank, and different for every other (seed, step, rank) up to FAR_STEP steps
  (noise_probe.py); X is left as it was.
- a loader that keeps up: make_loader's batches are the broken loader's (same samples, same
  order), the dataset is untouched, and a step with it takes at most MAX_TIME_RATIO of a step with
  the broken loader, both measured in turns in the same run (loader_timing.py).
- DDP without the search: wrap_for_ddp's model trains like one process on the global batch (six
  steps), and its last steps issue no more collectives than plain DDP's.

The graders judge what comes back from the ranks; what runs inside them is in this package's
modules: epoch_end, loader_timing, noise_probe, shard_training (against the one-process oracle),
slow_disk; watched.py sees a call of the course's own fix (refused: the exercise is the fix). Each
launch of the learner's function is a crossing (engine/boundary.py): the ranks return plain
observations (numbers, tensors, texts), and every comparison is made here. The data
fed to the learner's code comes from boundary.grading_seed: the notebook's at offset 0, other data
in class grading; the one-process oracle is computed here for the same data.
"""
import os
import tempfile

import torch

from ..engine import expect, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import library_call_hint
from ..engine.oracle import close, large_batch_sgd
from ..engine.ranks import run_on_ranks
from ...topics import debugging
from ...topics.debugging import NOISE_STD
from ...training.data import make_dataset
from .epoch_end import WIDER_WORLD, epoch_ends_on_rank, epoch_inputs, judge_epoch_end
from .loader_timing import DATA_SEED as LOADER_DATA_SEED
from .loader_timing import loader_on_rank
from .noise_probe import DATA_SEED as NOISE_DATA_SEED
from .noise_probe import FAR_STEP, SEEDS, first_collision, fingerprints_from_rows, noise_on_rank
from .shard_training import (DATA_SEED, LR, PER_RANK, STEPS, TRAINED_WORLD, WORLD_SIZE, batches,
                             expect_trained_like_one_process, train_on_rank, wrapped_on_rank)
from .slow_disk import LATE_START_S, load_on_rank, what_was_loaded
from .watched import watched_on_rank

LAUNCH_TIMEOUT_S = 20  # a right answer takes a second or two; past this, it hangs
SAME_COLLECTIVES = ("a rank waited for a partner that called another collective, or none: every "
                    "rank must call the same collectives, in the same order, with the same shapes")


def _launch(fn, *args, what: str, hint: str = SAME_COLLECTIVES, nprocs: int = WORLD_SIZE):
    """Every rank's result of fn(*args) on `nprocs` quiet gloo ranks; a call of the course's
    own fix (watched.py) is refused."""
    import torch._dynamo  # noqa: F401  DDP imports it on first use: once here, not in every rank

    results = run_on_ranks(watched_on_rank, fn, *args, nprocs=nprocs, what=what,
                           hang_hint=hint, crash_hint=hint, timeout=LAUNCH_TIMEOUT_S)
    called = [name for result in results for name in result["course_fixes"]]
    expect(not called, what, "your own fix of the broken function", f"a call of course_lib."
           f"topics.debugging.{called[0] if called else ''}", library_call_hint(
               f"debugging.{called[0] if called else ''}", "the exercise (find the bug, fix it)"))
    return [result["result"] for result in results]


# -- exercise 1: the end of an epoch ------------------------------------------------------------

@grader("the end of an epoch")
def check_end_of_epoch(end_of_epoch):
    for world_size in (WORLD_SIZE, WIDER_WORLD):  # on 3 ranks too: a mean written as "/ 2" shows
        epoch_losses, learning_rates = epoch_inputs(world_size)
        results = _launch(epoch_ends_on_rank, end_of_epoch, epoch_losses, learning_rates,
                          what=f"end_of_epoch on {world_size} ranks, 2 epochs", nprocs=world_size)
        for epoch, (losses, rates) in enumerate(zip(epoch_losses, learning_rates)):
            for rank, per_epoch in enumerate(results):
                judge_epoch_end(per_epoch[epoch], losses, rates, rank, epoch)


# -- exercise 2: the cached data ----------------------------------------------------------------

@grader("the cached data")
def check_load_data(load_data):
    runs = [("the first run (no file yet)", True, None),
            ("the next run (the file is there)", False, None),
            (f"a first run where rank 1 starts {LATE_START_S:g} s late", True, 1),
            (f"a first run where rank 0 starts {LATE_START_S:g} s late", True, 0)]
    with tempfile.TemporaryDirectory() as scratch:
        for number, (name, fresh, late_rank) in enumerate(runs):
            folder = os.path.join(scratch, str(number if fresh else number - 1))
            os.makedirs(folder, exist_ok=True)
            results = _launch(load_on_rank, load_data, folder, late_rank,
                              what=f"load_data in {name}",
                              hint="a rank waited in a barrier that another rank skipped: in "
                                   "every run, whether the file is there or not, and whenever "
                                   "a rank starts, every rank must wait the same way")
            saves = [observed["saves"] for observed in results]
            expect(saves == [1 if fresh else 0, 0], f"torch.save calls on ranks 0 and 1 in {name}",
                   "[1, 0]: rank 0 writes the missing file" if fresh
                   else "[0, 0]: the file is there", str(saves),
                   "only rank 0 writes, and only when the file is missing")
            for rank, loaded in enumerate(map(what_was_loaded, results)):
                expect(loaded == "the dataset", f"what load_data returns on rank {rank} in {name}",
                       "the dataset, read from the complete file", loaded,
                       f"rank {rank} opened data.pt while rank 0 was still writing it: a file that "
                       "exists is not yet a complete file, and a slow disk writes it for a while; "
                       "no rank may read before rank 0's write has finished"
                       if loaded.startswith("read the file") else
                       "what torch.load read from data.pt, as the broken version returns it")


# -- exercise 3 and 4: a training step, against one process on the global batch ------------------

def _loss_hint(got, expected, own):
    if abs(got - TRAINED_WORLD * expected) < 1e-4:
        return "that is the ranks' losses added up: the global batch's loss is their mean"
    if abs(got - TRAINED_WORLD / 2 * expected) < 1e-4:
        return f"that is the ranks' sum divided by 2, not by the {TRAINED_WORLD} ranks"
    if abs(got - own) < 1e-5:
        return ("that is the loss of this rank's shard only, which the dashboard logged: the "
                "global batch's loss takes every rank's")
    return ("the global batch's loss as this step's forward computed it on every rank, before "
            "the optimizer changed the weights")


@grader("the logged loss")
def check_step_and_loss(step_and_loss):
    data_seed = grading_seed(DATA_SEED)
    single_losses, single_weights = large_batch_sgd(
        batches(seed=data_seed, world_size=TRAINED_WORLD), LR)
    results = _launch(train_on_rank, step_and_loss, True, data_seed, nprocs=TRAINED_WORLD,
                      what=f"step_and_loss, 4 DDP steps on {TRAINED_WORLD} ranks")
    expect_trained_like_one_process(
        results, single_weights, "step_and_loss",
        lambda *_: "the training itself was right: keep the step as it was, and change only "
                   "the number it returns")
    for step in range(STEPS):
        for rank, (returned, _, own, _) in enumerate(results):
            got, expected = returned[step], single_losses[step]
            expect(got is not None, f"what step_and_loss returns on rank {rank} at step {step}",
                   "the loss, a number", "something that is not a number", "return a number")
            expect(abs(got - expected) <= 1e-5 * abs(expected) + 1e-6,
                   f"the loss step_and_loss returns on rank {rank} at step {step}",
                   f"the global batch's loss, {expected:.6f} (one process on all "
                   f"{PER_RANK * TRAINED_WORLD} samples)",
                   f"{got:.6f}", _loss_hint(got, expected, own[step]))


def _hand_ddp_hint(ranks_differ, update, expected_update):
    if ranks_differ:
        return ("the ranks' models drifted apart: each rank stepped with gradients the others "
                "did not have")
    if close(update, TRAINED_WORLD / 2 * expected_update):
        return "each update is 1.5 times one process's: the sum divided by 2, not by the world size"
    if close(update, TRAINED_WORLD * expected_update):
        return (f"each update is {TRAINED_WORLD} times one process's, as many times as there are "
                "ranks: all_reduce adds the ranks' gradients")
    if close(update, torch.zeros_like(update)):
        return "the weights did not change at all in this step"
    return ("the gradients each parameter holds when the optimizer steps are not those of one "
            "process on the whole global batch")


@grader("data parallel by hand")
def check_hand_ddp_step(hand_ddp_step):
    data_seed = grading_seed(DATA_SEED)
    _, single_weights = large_batch_sgd(batches(seed=data_seed, world_size=TRAINED_WORLD), LR)
    results = _launch(train_on_rank, hand_ddp_step, False, data_seed, nprocs=TRAINED_WORLD,
                      what=f"hand_ddp_step, 4 steps on {TRAINED_WORLD} ranks")
    expect_trained_like_one_process(results, single_weights, "hand_ddp_step", _hand_ddp_hint)


# -- exercise 5: noise of its own ---------------------------------------------------------------

def _collision_hint(one, other) -> str:
    (rank_a, seed_a, step_a), (rank_b, seed_b, step_b) = one, other
    if seed_a == seed_b and step_a == step_b:
        return "every rank draws the same numbers (in some order): the ranks' noise is one noise"
    if seed_a == seed_b and rank_a == rank_b and max(step_a, step_b) < 8:
        return f"rank {rank_a} repeats its noise: steps {step_a} and {step_b} draw the same"
    if step_a == step_b and rank_a == rank_b:
        return (f"seeds {seed_a} and {seed_b} draw the same numbers: the seed does not reach the "
                "generator, or reaches it in bits the generator does not keep")
    return (f"two different (seed, step, rank) triples meet at step {max(step_a, step_b)}: the "
            "numbers they make the generator's seed from land on the same seed (or the same "
            "numbers in another order); a run that long repeats its augmentation")


@grader("noise of its own")
def check_add_noise(add_noise):
    data_seed = grading_seed(NOISE_DATA_SEED)
    results = _launch(noise_on_rank, add_noise, data_seed, what="add_noise on 2 ranks",
                      hint="add_noise should only draw numbers: it needs no collective")
    X = make_dataset(n_samples=64, seed=data_seed).tensors[0]
    for rank, (noise, again, X_after, _) in enumerate(results):
        expect(torch.equal(X_after, X), f"X after add_noise on rank {rank}", "unchanged",
               "changed in place", "X is the caller's batch: it must come back as it went in")
        for seed, step, drawn in ((seed, step, drawn) for seed, per_step in zip(SEEDS, noise)
                                  for step, drawn in enumerate(per_step)):
            std, mean = drawn.std().item(), drawn.mean().item()
            expect(0.85 * NOISE_STD < std < 1.15 * NOISE_STD and abs(mean) < 0.02,
                   f"the noise on rank {rank} (seed {seed}, step {step})",
                   f"mean 0, standard deviation {NOISE_STD}",
                   f"mean {mean:.3f}, standard deviation {std:.3f}",
                   "keep the augmentation as it was: only which numbers are drawn is wrong")
        expect(torch.equal(again, noise[0][2]),
               f"the noise on rank {rank}, drawn twice for seed 0, step 2",
               "the same both times: a run can be repeated", "different",
               "the second call drew other numbers: they depend on what was drawn before, not "
               "only on the seed, the step and the rank")
    collision = first_collision([fingerprints_from_rows(rows) for *_, rows in results])
    if collision:
        (rank_a, seed_a, step_a), (rank_b, seed_b, step_b) = collision
        expect(False, f"the noise on rank {rank_b} at seed {seed_b}, step {step_b}",
               f"noise no other (seed, step, rank) draws, for every step up to {FAR_STEP:,}",
               f"the same numbers as rank {rank_a} at seed {seed_a}, step {step_a}",
               _collision_hint(*collision))


# -- exercise 6: a loader that keeps up ---------------------------------------------------------

MAX_TIME_RATIO = 0.6   # a fixed step over a broken one: about 0.38 with 2 workers, 0.76 with 1


@grader("a loader that keeps up")
def check_make_loader(make_loader):
    results = _launch(loader_on_rank, make_loader, grading_seed(LOADER_DATA_SEED),
                      what="make_loader on 2 ranks",
                      hint="make_loader should only build a loader; the check iterates it")
    for rank, facts in enumerate(results):
        for key in ("read_seconds", "own_read_seconds"):
            expect(facts[key] == debugging.READ_SECONDS,
                   f"the dataset's read_seconds on rank {rank}",
                   f"{debugging.READ_SECONDS} (storage is as slow as it is)", str(facts[key]),
                   "the dataset stands for the storage: it cannot be made faster, only read at "
                   "another time")
        expect(isinstance(facts["batches"], list) and facts["batches"] == facts["broken_batches"],
               f"the batches rank {rank}'s loader gives in one epoch",
               "the broken loader's: the same samples, in batches of 16, in the same order",
               "other batches" if isinstance(facts["batches"], list) else str(facts["batches"]),
               "what each step trains on must not change: only how the batches are read")
        ratio = min(facts["fixed"]) / min(facts["broken"])
        fixed_ms, broken_ms = min(facts["fixed"]) * 1000, min(facts["broken"]) * 1000
        expect(ratio <= MAX_TIME_RATIO,
               f"a step's time on rank {rank}, over a step's with the broken loader",
               f"at most {MAX_TIME_RATIO:.2f}", f"{ratio:.2f} ({fixed_ms:.0f} ms against "
               f"{broken_ms:.0f} ms, the best of {len(facts['fixed'])} each)",
               "each batch takes 16 x 2 ms of reads and the step 10 ms: the reads still hold up "
               "the steps; if the machine is very busy, run the check again")


# -- exercise 7: DDP without the search ---------------------------------------------------------

WRAPPED_STEPS, COUNTED_STEPS = 6, 2  # count the last 2: DDP rebuilds its buckets in step 2 (3 with
                                     # static_graph), then each step is like the next


@grader("DDP without the search")
def check_wrap_for_ddp(wrap_for_ddp):
    data_seed = grading_seed(DATA_SEED)
    _, single_weights = large_batch_sgd(batches(WRAPPED_STEPS, data_seed), LR)
    results = _launch(wrapped_on_rank, wrap_for_ddp, WRAPPED_STEPS, COUNTED_STEPS, data_seed,
                      what=f"{WRAPPED_STEPS} training steps with wrap_for_ddp on 2 ranks")
    ranks_agree = close(results[0][0], results[1][0])
    for rank, (weights, counts, settings) in enumerate(results):
        searches = settings["find_unused_parameters"] and not settings["static_graph"]
        expect(close(weights, single_weights[-1]),
               f"rank {rank}'s weights after {WRAPPED_STEPS} steps",
               "one process's on the whole global batch",
               f"weights off by up to {(weights - single_weights[-1]).abs().max().item():.2e}",
               "the ranks agree, but some parameters did not train as one process trains them"
               if ranks_agree else "the ranks trained apart: their gradients were never averaged")
        yours, plain = counts["yours"] / COUNTED_STEPS, counts["plain"] / COUNTED_STEPS
        expect(yours <= plain and not searches, f"collectives per step on rank {rank}",
               f"{plain:g}, as DDP(model) issues", f"{yours:g}",
               "the extra all_reduce says which parameters got a gradient: DDP runs it, and walks "
               "the autograd graph after every forward, because it was told to look for unused "
               "parameters; this model has none")
