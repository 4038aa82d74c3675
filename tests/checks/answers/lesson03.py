"""Lesson 03's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""

import numpy as np
import torch
import torch.distributed as dist

from course_lib.checks import lesson03
from course_lib.topics.collectives import ring_chunks
from test_measured_graders import (ALPHA_BETA_ALTERNATIVES)


from . import answer, wrong_answer  # noqa: F401


def ring_with_isend_irecv(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size

    def exchange(outgoing, incoming):
        requests = [dist.isend(outgoing.contiguous(), right), dist.irecv(incoming, left)]
        for request in requests:
            request.wait()

    for step in range(world_size - 1):
        incoming = torch.empty_like(chunks[(rank - step - 1) % world_size])
        exchange(chunks[(rank - step) % world_size], incoming)
        chunks[(rank - step - 1) % world_size].add_(incoming)
    for step in range(world_size - 1):
        incoming = torch.empty_like(chunks[(rank - step) % world_size])
        exchange(chunks[(rank - step + 1) % world_size], incoming)
        chunks[(rank - step) % world_size].copy_(incoming)
    return tensor


def ring_with_batched_p2p_ops(tensor):
    """Even and odd ranks in one batch_isend_irecv per step; the chunk index owned after the
    reduce-scatter is (rank + 1) % world_size."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for phase in ("reduce", "gather"):
        for step in range(world_size - 1):
            shift = 0 if phase == "reduce" else 1
            send_index, receive_index = (rank - step + shift) % world_size, \
                (rank - step - 1 + shift) % world_size
            incoming = torch.empty_like(chunks[receive_index])
            operations = [dist.P2POp(dist.isend, chunks[send_index].contiguous(), right),
                          dist.P2POp(dist.irecv, incoming, left)]
            for request in dist.batch_isend_irecv(operations):
                request.wait()
            if phase == "reduce":
                chunks[receive_index] += incoming
            else:
                chunks[receive_index][:] = incoming
    return tensor


ALTERNATIVES = {
    lesson03.check_collective_puzzle: [
        answer("a tuple", (63, 66, 69)),
        answer("numpy floats", np.array([63.0, 66.0, 69.0])),
    ],
    lesson03.check_ring_all_reduce: [
        answer("dist.isend/irecv", ring_with_isend_irecv),
        answer("batch_isend_irecv", ring_with_batched_p2p_ops),
    ],
    lesson03.check_measure_alpha_beta: ALPHA_BETA_ALTERNATIVES,
}
