"""Lesson 03's puzzle: predict the value `out` holds on ranks 0, 1 and 2 after a short program's
collectives (any sequence of 3 numbers), judged against the puzzle run on 3 ranks.
"""
from ...topics.collectives import collective_puzzle
from ..engine import expect, grader
from .harness import launch_for_grading

PUZZLE_WORLD_SIZE = 3


@grader("predict the collectives")
def check_collective_puzzle(predicted_out):
    what, original = "predicted_out", predicted_out
    try:  # a list, a tuple, a numpy array or a tensor of numbers
        predicted_out = list(predicted_out) if not isinstance(predicted_out, str) else None
    except TypeError:
        predicted_out = None
    expect(predicted_out is not None and len(predicted_out) == PUZZLE_WORLD_SIZE,
           what, f"a list of {PUZZLE_WORLD_SIZE} numbers: out on rank 0, rank 1 and rank 2",
           repr(original)[:120])
    actual = [out.item() for out in launch_for_grading(  # the course's program, run here
        collective_puzzle, nprocs=PUZZLE_WORLD_SIZE, what="collective_puzzle", learner=False)]
    for rank, (predicted, value) in enumerate(zip(predicted_out, actual)):
        try:
            right = abs(float(predicted) - value) < 1e-6
        except (TypeError, ValueError):
            right = False
        expect(right, f"your prediction for rank {rank}",
               "the value out really holds there (run the puzzle in your head, line by line)",
               repr(predicted),
               f"follow x on rank {rank} through the calls, one line at a time: what does each "
               "call leave on that rank, and what does it read from the others?")
