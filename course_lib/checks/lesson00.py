"""Graders for lesson 00 (welcome): what a rank knows about itself, and where its output goes.

- who am I: whoami() returns (rank, world_size), two whole numbers asked from the process group
  (or torchrun's environment), on 2 ranks and on 1.
- where output goes: the lines output="rank0" shows, what launch returns (every rank's result, in
  rank order), and the notebook's `total` afterwards (unchanged: each rank has its own memory)."""
import os

import torch.distributed as dist

from .engine import expect, expect_equal, grader
from .engine.observations import as_plain
from .engine.ranks import run_on_ranks


def _whoami_on_rank(whoami):
    """Inside a rank: what the learner's whoami returned, as plain data (NumPy's ints as ints)."""
    return as_plain(whoami())


def _launch_whoami(whoami, nprocs: int) -> list:
    # The inputs are the worlds themselves (2 ranks, then 1): nothing in them to draw at grading
    # time; each rank's answer is all that crosses back.
    results = run_on_ranks(_whoami_on_rank, whoami, nprocs=nprocs,
                           what=f"launch(whoami, nprocs={nprocs})",
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
        kinds = [type(value).__name__ for pair in got for value in pair]
        expect(set(kinds) == {"int"}, f"launch(whoami, nprocs={nprocs}): the types returned",
               "int, int on every rank", ", ".join(kinds),
               "2.0 equals 2, but range(2.0) fails; a tensor is no Python int either: return "
               "the ints that dist.get_rank() and dist.get_world_size() give")


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

