"""Lesson 08 graders: the pitfalls clinic's four DIAGNOSE exercises, each fix run on gloo ranks: 2,
as in the broken runs, and 3 for the log line and the sampler (a world size of 2 written in shows).

- the log line: log_mean_loss returns the mean over all ranks on every rank, and rank 0 alone
  prints it (the printed number is that mean; stdout or stderr, as print allows).
- the second step: three DDP steps of wrap_model's model train like one process, on both ranks.
- every epoch the same: each epoch, the ranks together see every index once; the order changes
  from epoch to epoch, and so does each rank's share (one permutation of the whole dataset).
- the checkpoint the others read: only rank 0 calls torch.save, on a slow shared disk (the file
  exists, torn, while rank 0 writes; an older checkpoint is there before); every rank loads the
  new weights as soon as save_checkpoint returns, and returns when rank 0's save ended, not a
  fixed time later: twice, with disks of two speeds.

- replicas that agree, values that are finite (replicas.py): the learner builds a check that every
  rank runs every K steps, and every rank gets its verdict.

Each grader fails the broken snippet (a hang, a crash, a wrong result), fixes of the symptom and
half-fixes; the reference fixes are in course_lib.topics.pitfalls. fix_runs.py runs each fix on
the ranks."""
import os
import re
import tempfile

import torch
from torch.utils.data import TensorDataset

from ..engine import expect, expect_close, grader
from ..engine.boundary import grading_seed
from ...training.models import make_model_with_unused_branch
from .replicas import check_replica_health  # noqa: F401  exercise 5: built, not fixed
from .fix_runs import (WIDER_WORLD, indices_on_rank, loss_of_rank, mean_loss_on_rank,
                       reference_body, run_fix, save_then_load_on_rank, train_on_rank)

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


# -- exercise 1: the log line -------------------------------------------------------------------

def _numbers_in(text: str) -> list:
    return [float(number) for number in NUMBER.findall(text)]


@grader("the log line")
def check_log_mean_loss(log_mean_loss):
    shift = grading_seed(0) % 5  # rank r's loss is r + 1 + shift: the mean, the sum and ranks 0
    # and 2's own stay apart; 3 ranks, not the pitfall's 2, so that a mean "/ 2" shows
    results = run_fix(lambda: mean_loss_on_rank(log_mean_loss, shift), "log_mean_loss, then a "
                      f"barrier, on {WIDER_WORLD} ranks", nprocs=WIDER_WORLD)
    losses = [loss_of_rank(rank, shift) for rank in range(WIDER_WORLD)]
    expected = sum(losses) / WIDER_WORLD
    for rank, (mean, _) in enumerate(results):
        if abs(mean - expected) > 1e-5:
            said = {sum(losses): "the sum over the ranks", losses[rank]: f"rank {rank}'s own loss",
                    sum(losses) / 2: "the sum divided by 2, not by the world size"}
            which = next((name for value, name in said.items() if abs(mean - value) < 1e-5), None)
            expect(False, f"what log_mean_loss returns on rank {rank} (rank r's loss is "
                   f"r + {1 + shift})",
                   f"the mean over the ranks, {expected:g}", f"{mean:g}",
                   f"that is {which}: every rank goes on training with the mean" if which else
                   "every rank must return the mean of all ranks' losses")
    printed = results[0][1].strip()
    expect(printed != "", "rank 0's output", "one line with the mean loss", "nothing",
           "the log line is rank 0's: it must still appear")
    if not any(abs(number - expected) < 1e-3 for number in _numbers_in(printed)):
        said = {sum(losses): "the sum over the ranks", losses[0]: "rank 0's own loss"}
        which = next((name for value, name in said.items()
                      if any(abs(number - value) < 1e-3 for number in _numbers_in(printed))), None)
        expect(False, "the number rank 0 prints", f"the mean over the ranks, {expected:g}",
               repr(printed[:80]), f"rank 0 printed {which}" if which else
               "rank 0's line must hold the mean over the ranks")
    for rank, (_, printed) in list(enumerate(results))[1:]:
        expect(printed == "", f"rank {rank}'s output", "nothing", repr(printed[:80]),
               f"rank {rank} printed a line too: with N ranks the log holds N copies of every step")


# -- exercise 2: the second step ----------------------------------------------------------------

@grader("the second step")
def check_wrap_model(wrap_model):
    seed = grading_seed(1)  # the data's
    results = run_fix(lambda: train_on_rank(wrap_model, seed), "3 DDP steps with wrap_model on 2 "
                      "ranks")
    reference = reference_body(seed)
    apart = any(not torch.allclose(results[0][name], results[1][name], rtol=1e-4, atol=1e-6)
                for name in reference)
    hint = ("the two ranks ended with different weights: their gradients were never averaged"
            if apart else "the ranks agree, but not with one process on the global batch: each "
            "step must use the mean of the ranks' gradients")
    for rank, body in enumerate(results):
        for name, tensor in reference.items():
            expect_close(body[name], tensor, f"rank {rank}'s body.{name} after 3 steps",
                         hint=hint, rtol=1e-4, atol=1e-6)


# -- exercise 3: every epoch the same -----------------------------------------------------------

N_INDICES, EPOCHS = 24, 3


@grader("every epoch the same")
def check_indices_per_epoch(indices_per_epoch):
    # The input is the dataset's size only, fixed: the learner's sampler draws the orders, on 3
    # ranks (a sampler told num_replicas=2 deals 2 ranks' shares)
    dataset = TensorDataset(torch.arange(N_INDICES))
    results = run_fix(lambda: indices_on_rank(indices_per_epoch, dataset, EPOCHS, 4),
                      f"indices_per_epoch on {WIDER_WORLD} ranks", nprocs=WIDER_WORLD)
    every_index = list(range(N_INDICES))
    for epoch in range(EPOCHS):
        together = sorted(index for per_rank in results for index in per_rank[epoch])
        expect(together == every_index, f"the indices the {WIDER_WORLD} ranks see together in "
               f"epoch {epoch}", f"each of the {N_INDICES} once", f"{len(together)} indices, "
               f"{len(together) - len(set(together))} of them on two ranks or more",
               "each sample once per epoch, on one rank: the ranks' shares must not overlap, and "
               "together they cover the dataset (the sampler takes the world size from the group)")
    orders = [tuple(results[0][epoch]) for epoch in range(EPOCHS)]
    repeated = next(((a, b) for a in range(EPOCHS) for b in range(a + 1, EPOCHS)
                     if orders[a] == orders[b]), None)
    expect(repeated is None, "rank 0's order in each epoch", f"{EPOCHS} different orders",
           f"epochs {repeated} in the same order: {orders[0][:6]}..." if repeated else "",
           "the run's symptom: every epoch is the first one again")
    shares = [frozenset(order) for order in orders]
    expect(len(set(shares)) == EPOCHS, "the samples rank 0 gets in each epoch",
           "a new share every epoch, drawn from the whole dataset",
           f"the same {len(shares[0])} samples every epoch, reordered",
           "each rank reshuffles only its own half: rank 0 never meets rank 1's samples")


# -- exercise 4: the checkpoint the others read --------------------------------------------------

DISK_SECONDS = (0.4, 1.2)  # rank 0's save takes this long, as on a busy shared file system
WAKE_BAND_S = 0.75  # a rank told that the save ended returns within ms; a fixed wait does not


@grader("the checkpoint the others read")
def check_save_checkpoint(save_checkpoint):
    seed = grading_seed(0)  # the new weights'; last epoch's are another seed's
    new_weights = make_model_with_unused_branch(seed=seed).state_dict()
    for seconds in DISK_SECONDS:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "model.pt")
            torch.save(make_model_with_unused_branch(seed=seed + 1).state_dict(), path)
            results = run_fix(lambda: save_then_load_on_rank(save_checkpoint, path, seconds, seed),
                              f"save_checkpoint on 2 ranks, rank 0's disk taking {seconds:g} s")
        where = f"with rank 0's disk taking {seconds:g} s"
        expect([saves for saves, *_ in results] == [1, 0], f"torch.save calls on ranks 0 and 1 "
               f"{where}", "[1, 0]", str([saves for saves, *_ in results]),
               "the ranks hold the same weights: one writer is enough, and two writers of one "
               "file tear it")
        save_ended = results[0][3]
        for rank, (_, load, returned, _) in enumerate(results):
            loaded = _what_was_loaded(load, new_weights)
            expect(loaded == "the new weights", f"what rank {rank} loads right after "
                   f"save_checkpoint returns, {where}", "the new weights", loaded,
                   "when save_checkpoint returns on this rank, rank 0 has not finished writing")
            late = returned - save_ended
            expect(-0.01 <= late <= WAKE_BAND_S, f"when save_checkpoint returns on rank {rank}, "
                   f"{where}", f"when rank 0's save ends (within {WAKE_BAND_S} s after it)",
                   f"{late:+.2f} s from it", "a rank must not return before the file is "
                   "complete, and no later than it must: a fixed wait is right for one disk "
                   "only" if late > 0 else "this rank returned while rank 0 was still writing")


def _what_was_loaded(load, new_weights) -> str:
    """What a rank's load read back: the new weights, older (or other) ones, or its error."""
    if "error" in load:
        return load["error"]
    state = load["state"]
    new = isinstance(state, dict) and all(
        torch.equal(_tensor_or_empty(state.get(name)), tensor) for name, tensor in new_weights.items())
    return "the new weights" if new else "an older checkpoint (or other weights)"


def _tensor_or_empty(value):
    return value if isinstance(value, torch.Tensor) else torch.empty(0)
