"""Lesson 12's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import os

import numpy as np
import torch
import torch.distributed as dist

from course_lib.checks import lesson12
from test_measured_graders import (HEALTH_ALTERNATIVES,  # measured here
                                   )


from . import answer, wrong_answer  # noqa: F401


def global_rank_by_counting(node_rank, local_rank, nproc_per_node):
    return sum(nproc_per_node for _ in range(node_rank)) + local_rank


def global_rank_as_numpy(node_rank, local_rank, nproc_per_node):
    return np.ravel_multi_index((node_rank, local_rank), (node_rank + 1, nproc_per_node))


def ranks_on_my_node_from_a_tensor():
    node_ranks = torch.zeros(dist.get_world_size(), dtype=torch.long)
    mine = torch.tensor([int(os.environ["GROUP_RANK"])])
    dist.all_gather(list(node_ranks.split(1)), mine)  # views: each rank's slot of node_ranks
    return torch.nonzero(node_ranks == mine).flatten()  # a tensor of ranks


def ranks_on_my_node_from_local_ranks():
    # My node's first rank is my rank minus my LOCAL_RANK; LOCAL_WORLD_SIZE says how many follow
    first = dist.get_rank() - int(os.environ["LOCAL_RANK"])
    return tuple(np.arange(first, first + int(os.environ["LOCAL_WORLD_SIZE"])))  # numpy ints


ALTERNATIVES = {
    lesson12.check_global_rank: [
        answer("counting nodes", global_rank_by_counting),
        answer("numpy's ravel_multi_index", global_rank_as_numpy),
    ],
    lesson12.check_ranks_on_my_node: [
        answer("all_gather of a tensor, a tensor back", ranks_on_my_node_from_a_tensor),
        answer("from LOCAL_RANK and LOCAL_WORLD_SIZE, numpy ints",
               ranks_on_my_node_from_local_ranks),
    ],
    lesson12.check_health_check: HEALTH_ALTERNATIVES,
}
