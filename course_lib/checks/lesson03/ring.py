"""Lesson 03's ring all-reduce: the learner's function on 2, 3 and 4 ranks, every rank's tensor
ending as the sum of all ranks' tensors, built from sends and receives between ring neighbours.

Built from point-to-point sends and receives only (send/recv, isend/irecv, batch_isend_irecv:
counted below the Python API, however they were imported), no collective at all, each rank
talking to its two ring neighbours only (rank - 1 and rank + 1: on 3 and 4 ranks a direct
reduce-scatter and all-gather would talk to every rank) and sending about 2 (N - 1) / N times the
tensor; written by the learner (a call of the course's own ring, which the lesson shows, is
refused). The grader checks the sums and counts the bytes each rank sends (harness.py).
"""
import torch

from ...topics.collectives import ring_chunks
from ..engine import expect, expect_close, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import library_call_hint
from .harness import grading_tensor, launch_for_grading, reduce_grading_tensors

RING_WORLD_SIZES = (2, 3, 4)
RING_SHAPES = ((1200,), (10,), (3, 5))  # divisible by 2, 3 and 4; uneven chunks; two dimensions
BYTES_TOLERANCE = 0.05                  # every correct ring sends exactly 2 (N - 1) / N of them


@grader("ring all-reduce")
def check_ring_all_reduce(ring_all_reduce):
    seed = grading_seed(0)  # the ranks' tensors: drawn at grading time (0 in a notebook)
    for world_size in RING_WORLD_SIZES:
        per_rank = launch_for_grading(reduce_grading_tensors, ring_all_reduce, RING_SHAPES, seed,
                                      nprocs=world_size,
                                      what=f"ring_all_reduce on {world_size} ranks")
        expect(not any(traffic["course_ring"] for runs in per_rank for _, traffic in runs),
               f"ring_all_reduce on {world_size} ranks", "your own ring",
               "a call of course_lib.topics.collectives.ring_all_reduce",
               library_call_hint("course_lib.topics.collectives.ring_all_reduce", "the exercise"))
        _expect_point_to_point_only(per_rank, world_size)
        _expect_neighbours_only(per_rank, world_size)
        _expect_sums(per_rank, world_size, seed)
        _expect_ring_traffic(per_rank, world_size)


def _expect_point_to_point_only(per_rank, world_size):
    for rank, runs in enumerate(per_rank):
        called = sorted({name for _, traffic in runs for name in traffic["collectives"]})
        expect(not called, f"the calls rank {rank} made on {world_size} ranks",
               "point-to-point calls only (dist.send/recv, isend/irecv, batch_isend_irecv)",
               f"collectives {called}",
               "build the all-reduce yourself, from messages between neighbours: a collective "
               "runs the backend's own algorithm, not yours")


def _expect_neighbours_only(per_rank, world_size):
    for rank, runs in enumerate(per_rank):
        neighbours = {(rank - 1) % world_size, (rank + 1) % world_size}
        for shape, (_, traffic) in zip(RING_SHAPES, runs):
            peers = sorted(set(traffic["bytes_sent_to"]) | set(traffic["bytes_received_from"]),
                           key=str)
            strangers = [peer for peer in peers if peer not in neighbours]
            expect(not strangers, f"the ranks rank {rank} talked to on {world_size} ranks "
                   f"(tensor of shape {shape})", f"its ring neighbours only, ranks "
                   f"{sorted(neighbours)}", f"ranks {peers}",
                   f"in a ring, rank {rank} sends only to rank {(rank + 1) % world_size} and "
                   f"receives only from rank {(rank - 1) % world_size}; sending each chunk "
                   f"straight to its owner (rank {strangers[0] if strangers else '?'} here) is "
                   "not a ring")


def _expect_sums(per_rank, world_size, seed):
    for index, shape in enumerate(RING_SHAPES):
        expected = sum(grading_tensor(rank, world_size, shape, seed) for rank in range(world_size))
        for rank, runs in enumerate(per_rank):
            got = runs[index][0]
            pairs = zip(ring_chunks(got.flatten(), world_size),
                        ring_chunks(expected.flatten(), world_size))
            wrong = [chunk for chunk, (mine, right) in enumerate(pairs) if not torch.equal(
                mine, right)] if got.shape == expected.shape else "all"
            expect_close(got, expected,
                         f"rank {rank}'s tensor after ring_all_reduce on {world_size} ranks "
                         f"(shape {shape})",
                         f"rank {rank}'s chunks {wrong} do not hold the sum of every rank's "
                         "chunk; every rank must end with the whole sum, in its own tensor")


def _expect_ring_traffic(per_rank, world_size):
    nbytes = RING_SHAPES[0][0] * 4  # float32
    fraction = 2 * (world_size - 1) / world_size
    for rank, runs in enumerate(per_rank):
        sent = sum(runs[0][1]["bytes_sent_to"].values())
        expect(abs(sent - fraction * nbytes) <= BYTES_TOLERANCE * fraction * nbytes,
               f"the bytes rank {rank} sent on {world_size} ranks, for a {nbytes}-byte tensor",
               f"about 2 (N - 1) / N = {fraction:.2f} times the tensor: {fraction * nbytes:.0f} bytes",
               f"{sent} bytes ({sent / nbytes:.2f} times the tensor)",
               "send one chunk (1/N of the tensor) per step, 2 (N - 1) steps; sending whole "
               "tensors, or everything through rank 0, costs more" if sent else
               "no send was seen: pass the chunks with send_right_receive_left (or "
               "dist.isend/irecv, dist.send/recv)")
