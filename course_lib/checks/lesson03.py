"""Graders of lesson 03, processes and collectives: predict what a short program's collectives
leave on each rank, build a ring all-reduce from send/recv, and invert the ring's cost model.

- predict the collectives: the value `out` holds on ranks 0, 1 and 2 (any sequence of 3 numbers).
- ring all-reduce: on 2, 3 and 4 ranks every rank's tensor ends as the sum of all ranks' tensors,
  built from point-to-point sends and receives only (send/recv, isend/irecv, batch_isend_irecv:
  counted below the Python API, however they were imported), each rank sending about
  2 (N - 1) / N times the tensor.
- fit alpha and beta: (alpha, beta) from exact ring times, any two numbers (floats, numpy,
  0-dim tensors) within 0.1%.

The ring grader launches the learner's function on 2, 3 and 4 ranks (gloo, on the CPU, so it
grades the same on a laptop and a GPU node), checks the sums and counts the bytes each rank sends.
"""

import numpy as np
import torch
import torch.distributed as dist

from ..topics.collectives import (_send_right_receive_left, collective_puzzle, count_traffic,
                                 naive_all_reduce, ring_chunks, ring_all_reduce_time)
from . import expect, expect_close, grader, wrong_answer
from .ranks import run_on_ranks

LAUNCH_TIMEOUT_S = 20
PUZZLE_WORLD_SIZE = 3
RING_WORLD_SIZES = (2, 3, 4)
RING_SHAPES = ((1200,), (10,), (3, 5))  # divisible by 2, 3 and 4; uneven chunks; two dimensions
BYTES_TOLERANCE = 0.05                  # every correct ring sends exactly 2 (N - 1) / N of them
ALLOWED_COLLECTIVES = {"barrier"}       # lines ranks up, moves no data


# -- Exercise: predict the collectives ---------------------------------------------------------

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
    actual = [out.item() for out in _launch_for_grading(
        collective_puzzle, nprocs=PUZZLE_WORLD_SIZE, what="collective_puzzle")]
    for rank, (predicted, value) in enumerate(zip(predicted_out, actual)):
        try:
            right = abs(float(predicted) - value) < 1e-6
        except (TypeError, ValueError):
            right = False
        expect(right, f"your prediction for rank {rank}",
               "the value out really holds there (run the puzzle in your head, line by line)",
               repr(predicted),
               "after broadcast every rank holds rank 2's x; then each adds its own rank; "
               "reduce_scatter gives rank r the sum over ranks of chunk r only")


# -- Exercise: a ring all-reduce from send/recv ------------------------------------------------

def grading_tensor(rank, world_size, shape):
    """The tensor rank `rank` reduces: whole numbers, so every summation order gives the same sum."""
    generator = torch.Generator().manual_seed(1000 * world_size + 10 * rank + len(shape))
    return torch.randint(-50, 51, shape, generator=generator).float()


def _reduce_grading_tensors(ring_all_reduce, shapes):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    runs = []
    for shape in shapes:
        tensor = grading_tensor(rank, world_size, shape)
        with count_traffic() as traffic:
            ring_all_reduce(tensor)
        runs.append((tensor, traffic))
    return runs


@grader("ring all-reduce")
def check_ring_all_reduce(ring_all_reduce):
    for world_size in RING_WORLD_SIZES:
        per_rank = _launch_for_grading(_reduce_grading_tensors, ring_all_reduce, RING_SHAPES,
                                       nprocs=world_size, what=f"ring_all_reduce on {world_size} ranks")
        _expect_point_to_point_only(per_rank, world_size)
        _expect_sums(per_rank, world_size)
        _expect_ring_traffic(per_rank, world_size)


def _expect_point_to_point_only(per_rank, world_size):
    for rank, runs in enumerate(per_rank):
        called = sorted({name for _, traffic in runs for name in traffic.collectives}
                        - ALLOWED_COLLECTIVES)
        expect(not called, f"the calls rank {rank} made on {world_size} ranks",
               "point-to-point calls only (dist.send/recv, isend/irecv, batch_isend_irecv)",
               f"collectives {called}",
               "build the all-reduce yourself: pass chunks to the next rank with "
               "send_right_receive_left, do not call a collective")


def _expect_sums(per_rank, world_size):
    for index, shape in enumerate(RING_SHAPES):
        expected = sum(grading_tensor(rank, world_size, shape) for rank in range(world_size))
        for rank, runs in enumerate(per_rank):
            expect_close(runs[index][0], expected,
                         f"rank {rank}'s tensor after ring_all_reduce on {world_size} ranks "
                         f"(shape {shape})",
                         "every rank must end with the sum of all ranks' tensors, written into "
                         "`tensor` itself (the chunks are views of it); do both halves: "
                         "reduce-scatter, then all-gather")


def _expect_ring_traffic(per_rank, world_size):
    nbytes = RING_SHAPES[0][0] * 4  # float32
    fraction = 2 * (world_size - 1) / world_size
    for rank, runs in enumerate(per_rank):
        sent = runs[0][1].bytes_sent
        expect(abs(sent - fraction * nbytes) <= BYTES_TOLERANCE * fraction * nbytes,
               f"the bytes rank {rank} sent on {world_size} ranks, for a {nbytes}-byte tensor",
               f"about 2 (N - 1) / N = {fraction:.2f} times the tensor: {fraction * nbytes:.0f} bytes",
               f"{sent} bytes ({sent / nbytes:.2f} times the tensor)",
               "send one chunk (1/N of the tensor) per step, 2 (N - 1) steps; sending whole "
               "tensors, or everything through rank 0, costs more" if sent else
               "no send was seen: pass the chunks with send_right_receive_left (or "
               "dist.isend/irecv, dist.send/recv)")


def _calls_dist_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor


def _stub(tensor):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def _reduce_scatter_only(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        send_index, receive_index = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = torch.empty_like(chunks[receive_index])
        _send_right_receive_left(chunks[send_index], right, incoming, left)
        chunks[receive_index] += incoming
    return tensor  # each rank holds one summed chunk; the all-gather half is missing


def _passes_whole_tensors(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    passing = tensor.clone()
    for _ in range(world_size - 1):  # right sums, but N - 1 whole tensors per rank
        incoming = torch.empty_like(tensor)
        _send_right_receive_left(passing, right, incoming, left)
        tensor += incoming
        passing = incoming
    return tensor


# -- Exercise: invert the ring's cost model ----------------------------------------------------

FIT_SIZES_BYTES = [4 ** k for k in range(1, 13)]  # 4 B to 16 MiB
FIT_CASES = [(2, 50e-6, 1 / 1e9), (4, 50e-6, 1 / 1e9), (8, 5e-6, 1 / 100e9)]  # N, alpha, beta


@grader("fit alpha and beta")
def check_fit_ring_alpha_beta(fit_ring_alpha_beta):
    for world_size, alpha, beta in FIT_CASES:
        seconds = [ring_all_reduce_time(nbytes, world_size, alpha, beta)
                   for nbytes in FIT_SIZES_BYTES]
        fitted = fit_ring_alpha_beta(list(FIT_SIZES_BYTES), seconds, world_size)
        try:  # show numpy floats as plain numbers in the message
            fitted = tuple(float(value) for value in fitted)
        except (TypeError, ValueError):
            pass
        expect_close(fitted, (alpha, beta),
                     f"(alpha, beta) fitted to exact ring all-reduce times on {world_size} ranks",
                     "fit a line t = a + b * n, then undo the ring's factors: "
                     "a = 2 (N - 1) alpha and b = 2 (N - 1) / N * beta", rtol=1e-3, atol=0)


def _line_without_the_ring(sizes_bytes, seconds, world_size):
    slope, intercept = np.polyfit(sizes_bytes, seconds, 1)
    return intercept, slope


def _forgets_the_one_over_n(sizes_bytes, seconds, world_size):
    intercept, slope = _line_without_the_ring(sizes_bytes, seconds, world_size)
    return intercept / (2 * (world_size - 1)), slope / (2 * (world_size - 1))


def _swaps_alpha_and_beta(sizes_bytes, seconds, world_size):
    intercept, slope = _line_without_the_ring(sizes_bytes, seconds, world_size)
    return slope / (2 * (world_size - 1) / world_size), intercept / (2 * (world_size - 1))


# -- launching for a grader --------------------------------------------------------------------

def _launch_for_grading(fn, *args, nprocs, what):
    """Run fn on nprocs gloo ranks, silently; a failure or a hang becomes a GradingError."""
    return run_on_ranks(fn, *args, nprocs=nprocs, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint="a blocking send waits for its receiver: if every rank sends first, "
                                  "nobody receives. Post the send and the receive together "
                                  "(send_right_receive_left)",
                        crash_hint="the traceback above shows where the rank failed")


WRONG_ANSWERS = {
    check_collective_puzzle: [
        wrong_answer("forgets the broadcast", [33, 36, 39]),
        wrong_answer("forgets that each rank adds its rank", [60, 63, 66]),
        wrong_answer("gives every rank the sum of all chunks, as all_reduce would", [198, 198, 198]),
        wrong_answer("one number short", [63, 66]),
    ],
    check_ring_all_reduce: [
        wrong_answer("calls dist.all_reduce", _calls_dist_all_reduce),
        wrong_answer("gathers on rank 0, then broadcasts", naive_all_reduce),
        wrong_answer("does only the reduce-scatter half", _reduce_scatter_only),
        wrong_answer("passes whole tensors around the ring", _passes_whole_tensors),
        wrong_answer("the unfinished stub", _stub),
    ],
    check_fit_ring_alpha_beta: [
        wrong_answer("returns the line's intercept and slope", _line_without_the_ring),
        wrong_answer("divides the slope by 2 (N - 1), forgetting the 1 / N",
                     _forgets_the_one_over_n),
        wrong_answer("swaps alpha and beta", _swaps_alpha_and_beta),
    ],
}
