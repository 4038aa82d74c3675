"""Graders of lesson 03, processes and collectives: predict what a short program's collectives
leave on each rank, build a ring all-reduce from send/recv, and measure this machine's alpha and
beta.

- predict the collectives: the value `out` holds on ranks 0, 1 and 2 (any sequence of 3 numbers).
- ring all-reduce: on 2, 3 and 4 ranks every rank's tensor ends as the sum of all ranks' tensors,
  built from point-to-point sends and receives only (send/recv, isend/irecv, batch_isend_irecv:
  counted below the Python API, however they were imported), each rank sending about
  2 (N - 1) / N times the tensor.
- measure alpha and beta: the learner's sweep of measure_all_reduce on 2 ranks (at least 8 sizes,
  from 64 bytes or less to 1 MiB or more), the (alpha, beta) fitted to it (within 5% of
  cost_model.fit_alpha_beta's relative-error fit of the same sweep: a measurement is noisy, so the
  grader judges the numbers against the data the learner recorded, never against a new run), and
  the size N alpha / beta below which an all-reduce is mostly latency; any kind of number.

The ring grader launches the learner's function on 2, 3 and 4 ranks (gloo, on the CPU, so it
grades the same on a laptop and a GPU node), checks the sums and counts the bytes each rank sends.
"""

import numpy as np
import torch
import torch.distributed as dist

from ..topics.collectives import (_send_right_receive_left, collective_puzzle, count_traffic,
                                 naive_all_reduce, ring_chunks)
from ..topics.cost_model import fit_alpha_beta, ring_all_reduce_time
from . import GradingError, expect, expect_close, grader, wrong_answer
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


# -- Exercise: measure this machine's alpha and beta ------------------------------------------

SWEEP_WORLD_SIZE = 2          # the exercise measures on 2 ranks
SWEEP_MIN_SIZES = 8
SWEEP_SMALLEST_AT_MOST = 64   # bytes: latency-bound on any machine
SWEEP_LARGEST_AT_LEAST = 2**20  # bytes: bandwidth-bound on a CPU or a GPU link
FIT_RTOL = 0.05               # two fits that weigh relative errors agree far closer than this

# A sweep as measure_all_reduce records one on a busy 2-core machine: the ring model with
# alpha = 150 us and 1 GB/s, times a fixed, uneven noise (a slow repeat at 64 KiB).
_NOISE = [1.1, 0.8, 1.25, 0.9, 1.0, 1.3, 0.85, 1.6, 0.9, 1.15, 0.95, 1.2]
RECORDED_SWEEP = [(4 ** k, ring_all_reduce_time(4 ** k, 2, 150e-6, 1e-9) * noise)
                  for k, noise in zip(range(1, 13), _NOISE)]


@grader("measure alpha and beta")
def check_measure_alpha_beta(sweep, alpha, beta, latency_bound_below):
    sizes, seconds = _expect_a_sweep(sweep)
    reference_alpha, reference_beta = fit_alpha_beta(sizes, seconds, SWEEP_WORLD_SIZE)
    hint = ("fit with relative errors (cost_model.fit_alpha_beta(sizes, seconds, world_size=2), or "
            "np.polyfit(sizes, seconds, 1, w=1 / seconds)), then undo the ring's factors: "
            "intercept = 2 (N - 1) alpha, slope = 2 (N - 1) / N * beta")
    fitted = _as_floats((alpha, beta), "(alpha, beta)")
    expect_close(fitted, (reference_alpha, reference_beta),
                 "(alpha, beta) fitted to the sweep you recorded on 2 ranks", hint,
                 rtol=FIT_RTOL, atol=0)
    [below] = _as_floats((latency_bound_below,), "latency_bound_below")
    expect_close(below, SWEEP_WORLD_SIZE * fitted[0] / fitted[1],
                 "latency_bound_below, from your alpha and beta",
                 "the ring's two terms are equal where 2 (N - 1) alpha = 2 (N - 1) / N * n * beta, "
                 "that is at n = N alpha / beta bytes (N = 2 here)", rtol=1e-3, atol=0)


def _expect_a_sweep(sweep):
    """The recorded sweep as two float arrays, or a GradingError that says what to record."""
    expected = (f"measure_all_reduce's list of (nbytes, seconds) from 2 ranks: at least "
                f"{SWEEP_MIN_SIZES} sizes, from {SWEEP_SMALLEST_AT_MOST} bytes or less up to "
                f"{SWEEP_LARGEST_AT_LEAST:,} or more")
    hint = ("record it with launch(cost_model.measure_all_reduce, sizes_bytes, nprocs=2)[0], "
            "with sizes_bytes = [4**k for k in range(1, 13)]")
    try:
        pairs = np.asarray([(float(nbytes), float(time_s)) for nbytes, time_s in sweep])
    except (TypeError, ValueError):
        pairs = None
    expect(pairs is not None and pairs.ndim == 2 and len(pairs) >= SWEEP_MIN_SIZES, "sweep",
           expected, repr(sweep)[:120], hint)
    sizes, seconds = pairs.T
    expect(len(np.unique(sizes)) == len(sizes) and sizes.min() <= SWEEP_SMALLEST_AT_MOST
           and sizes.max() >= SWEEP_LARGEST_AT_LEAST, "sweep's sizes", expected,
           f"{len(np.unique(sizes))} different sizes from {sizes.min():,.0f} to {sizes.max():,.0f} "
           "bytes", hint)
    expect(bool(np.all(np.isfinite(seconds)) and np.all(seconds > 0)), "sweep's times",
           "positive seconds, one per size", repr(seconds.tolist())[:120], hint)
    return sizes, seconds


def _as_floats(values, what):
    try:
        return tuple(float(value) for value in values)
    except (TypeError, ValueError):
        raise GradingError(what, "numbers (floats, numpy floats or 0-dim tensors)",
                           repr(values)[:120]) from None


def _report(sweep, alpha, beta):
    return sweep, alpha, beta, SWEEP_WORLD_SIZE * alpha / beta


def _reference_report(sweep=RECORDED_SWEEP):
    return _report(sweep, *fit_alpha_beta(*zip(*sweep), SWEEP_WORLD_SIZE))


def _unweighted_line(sweep=RECORDED_SWEEP):
    sizes, seconds = np.array(sweep).T
    slope, intercept = np.polyfit(sizes, seconds, 1)
    return _report(sweep, intercept / 2, slope)


def _line_without_the_ring(sweep=RECORDED_SWEEP):
    sizes, seconds = np.array(sweep).T
    slope, intercept = np.polyfit(sizes, seconds, 1, w=1 / seconds)
    return _report(sweep, intercept, slope)


def _swaps_alpha_and_beta():
    recorded, alpha, beta, _ = _reference_report()
    return _report(recorded, beta, alpha)


def _forgets_the_world_size():
    recorded, alpha, beta, _ = _reference_report()
    return recorded, alpha, beta, alpha / beta


def _sweep_of_three_sizes():
    return _reference_report(RECORDED_SWEEP[::4])


def _sweep_of_small_messages():
    return _reference_report(RECORDED_SWEEP[:8])


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
    check_measure_alpha_beta: [
        wrong_answer("a plain least-squares line: the large messages' noise swamps alpha",
                     *_unweighted_line()),
        wrong_answer("keeps the line's intercept, forgetting the ring's 2 (N - 1)",
                     *_line_without_the_ring()),
        wrong_answer("swaps alpha and beta", *_swaps_alpha_and_beta()),
        wrong_answer("latency_bound_below = alpha / beta, forgetting N",
                     *_forgets_the_world_size()),
        wrong_answer("a sweep of 3 sizes", *_sweep_of_three_sizes()),
        wrong_answer("a sweep that stops at 64 KiB, before bandwidth shows",
                     *_sweep_of_small_messages()),
    ],
}
