"""What the detector says about one learner cell: the exercise, the cell, a reason.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Finding:
    exercise: str | None  # the grader its check cell calls; None outside an exercise
    cell_index: int  # in the learner's notebook
    reason: str  # one line, for the learner and the instructor
