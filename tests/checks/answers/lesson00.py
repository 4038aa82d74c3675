"""Lesson 00's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import os

import numpy as np
import torch.distributed as dist

from course_lib.checks import lesson00

from . import answer, wrong_answer


def whoami_from_the_environment_as_ints():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def whoami_as_a_list_of_numpy_ints():
    return [np.int64(dist.get_rank()), np.int64(dist.get_world_size())]


ALTERNATIVES = {
    lesson00.check_whoami: [
        answer("environment strings made ints", whoami_from_the_environment_as_ints),
        answer("a list of numpy ints", whoami_as_a_list_of_numpy_ints),
    ],
    lesson00.check_where_output_goes: [
        answer("tuples", ("[rank0] rank 0 has total 1",), (1, 2), 0),
        answer("numpy results, a float total", ["[rank0] rank 0 has total 1"], np.array([1, 2]),
               0.0),
    ],
}


# Wrong answers

def whoami_hard_coded():
    return (0, 2)


def whoami_from_environment():
    return (os.environ["RANK"], os.environ["WORLD_SIZE"])


def whoami_swapped():
    return (dist.get_world_size(), dist.get_rank())


def whoami_rank_and_hard_coded_world():
    return (dist.get_rank(), 2)


def whoami_float_world_size():
    return dist.get_rank(), float(dist.get_world_size())  # 2.0 == 2, but range(2.0) fails


RIGHT_LINES = ["[rank0] rank 0 has total 1"]

WRONG_ANSWERS = {
    lesson00.check_whoami: [
        wrong_answer("hard-codes rank 0 of 2", whoami_hard_coded),
        wrong_answer("returns the environment's strings, not ints", whoami_from_environment),
        wrong_answer("swaps rank and world_size", whoami_swapped),
        wrong_answer("asks the rank but hard-codes world_size 2", whoami_rank_and_hard_coded_world),
        wrong_answer("a float world size", whoami_float_world_size),
    ],
    lesson00.check_where_output_goes: [
        wrong_answer("expects rank 1's line too",
                     ["[rank0] rank 0 has total 1", "[rank1] rank 1 has total 2"], [1, 2], 0),
        wrong_answer("forgets the rank label", ["rank 0 has total 1"], [1, 2], 0),
        wrong_answer("expects only rank 0's result", RIGHT_LINES, [1], 0),
        wrong_answer("thinks the ranks share `total`", RIGHT_LINES, [1, 3], 0),
        wrong_answer("thinks the notebook's `total` changed", RIGHT_LINES, [1, 2], 3),
    ],
}
