"""Graders for lesson 00 (welcome): what a rank knows about itself, and where its output goes.

- who am I: whoami() returns (rank, world_size), two whole numbers asked from the process group
  (or torchrun's environment), on 2 ranks and on 1.
- where output goes: the lines output="rank0" shows, what launch returns (every rank's result, in
  rank order), and the notebook's `total` afterwards (unchanged: each rank has its own memory)."""
import os

import torch.distributed as dist

from . import expect_equal, grader, wrong_answer
from .ranks import run_on_ranks

def _launch_whoami(whoami, nprocs: int) -> list:
    results = run_on_ranks(whoami, nprocs=nprocs, what=f"launch(whoami, nprocs={nprocs})",
                           hang_hint="whoami needs no collective: just return (rank, world_size)",
                           crash_hint="fix the error whoami raised in its rank; run it yourself with "
                                      "launch(whoami, nprocs=2, timeout=60) to see the whole traceback")
    return [tuple(result) if isinstance(result, list) else result for result in results]


@grader("who am I")
def check_whoami(whoami):
    for nprocs in (2, 1):
        got = _launch_whoami(whoami, nprocs)
        expect_equal(got, [(rank, nprocs) for rank in range(nprocs)],
                     f"launch(whoami, nprocs={nprocs})", hint=_whoami_mistake(got, nprocs))


def _whoami_mistake(got: list, nprocs: int) -> str:
    """What the learner's (rank, world_size) pairs show, without the code that fixes them."""
    pairs = [result for result in got if isinstance(result, tuple) and len(result) == 2]
    if len(pairs) != len(got):
        return "each rank should return a pair: (its rank, the world size)"
    if any(isinstance(value, str) for pair in pairs for value in pair):
        return "a rank returned text: the environment holds strings, the check wants whole numbers"
    if nprocs > 1 and len(set(pairs)) == 1:
        return (f"every rank returned {pairs[0]}: the value is written into the function, so no "
                f"rank can tell which one it is")
    if [pair[1] for pair in pairs] == list(range(nprocs)):
        return "the rank came second: the pair is (rank, world_size), in that order"
    if any(pair[1] != nprocs for pair in pairs):
        return (f"launched with nprocs={nprocs}, a rank said the world has {pairs[0][1]} ranks: "
                f"the world size depends on the launch, so ask for it at run time")
    return "compare each rank's pair with what that rank should say about itself"


@grader("where output goes")
def check_where_output_goes(predicted_lines, predicted_results, predicted_total):
    expect_equal(list(predicted_lines), ["[rank0] rank 0 has total 1"], "predicted_lines",
                 hint="reread what output='rank0' keeps, and how the launcher labels each line")
    expect_equal(list(predicted_results), [1, 2], "predicted_results",
                 hint="what launch returns does not depend on what `output` shows; and think of "
                      "where each rank's `total` lives")
    expect_equal(predicted_total, 0, "predicted_total",
                 hint="the ranks ran in other processes: what can they change in this notebook?")


# Plausible mistakes, each run as a real rank by the tests.

def whoami_hard_coded():
    return (0, 2)


def whoami_from_environment():
    return (os.environ["RANK"], os.environ["WORLD_SIZE"])


def whoami_swapped():
    return (dist.get_world_size(), dist.get_rank())


def whoami_rank_and_hard_coded_world():
    return (dist.get_rank(), 2)


RIGHT_LINES = ["[rank0] rank 0 has total 1"]

WRONG_ANSWERS = {
    check_whoami: [
        wrong_answer("hard-codes rank 0 of 2", whoami_hard_coded),
        wrong_answer("returns the environment's strings, not ints", whoami_from_environment),
        wrong_answer("swaps rank and world_size", whoami_swapped),
        wrong_answer("asks the rank but hard-codes world_size 2", whoami_rank_and_hard_coded_world),
    ],
    check_where_output_goes: [
        wrong_answer("expects rank 1's line too",
                     ["[rank0] rank 0 has total 1", "[rank1] rank 1 has total 2"], [1, 2], 0),
        wrong_answer("forgets the rank label", ["rank 0 has total 1"], [1, 2], 0),
        wrong_answer("expects only rank 0's result", RIGHT_LINES, [1], 0),
        wrong_answer("thinks the ranks share `total`", RIGHT_LINES, [1, 3], 0),
        wrong_answer("thinks the notebook's `total` changed", RIGHT_LINES, [1, 2], 3),
    ],
}
