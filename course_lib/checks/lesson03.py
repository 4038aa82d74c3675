"""Graders of lesson 03, processes and collectives: predict what a short program's collectives
leave on each rank, build a ring all-reduce from send/recv, and measure this machine's alpha and
beta.

- predict the collectives: the value `out` holds on ranks 0, 1 and 2 (any sequence of 3 numbers).
- ring all-reduce: on 2, 3 and 4 ranks every rank's tensor ends as the sum of all ranks' tensors,
  built from point-to-point sends and receives only (send/recv, isend/irecv, batch_isend_irecv:
  counted below the Python API, however they were imported), no collective at all, each rank
  talking to its two ring neighbours only (rank - 1 and rank + 1: on 3 and 4 ranks a direct
  reduce-scatter and all-gather would talk to every rank) and sending about 2 (N - 1) / N times
  the tensor.
- measure alpha and beta: the learner's sweep on 2 ranks, as cost_model.measure_all_reduce
  returned it (at least 8 sizes, from 64 bytes or less to 1 MiB or more), the (alpha, beta) fitted
  to it, and the size N alpha / beta below which an all-reduce is mostly latency; any kind of
  number. The fit is judged by how well it predicts the times measured: the root-mean-square of
  its relative errors at most FIT_SLACK (15%) above that of the best relative-error fit,
  cost_model.fit_alpha_beta, or that of its log errors above the best log-space fit's (a fit in
  log space, 6.6% from the relative fit in alpha, passes; a plain least-squares line, or alpha
  twice too large, does not on the example sweep). The sweep must be a
  measurement: the record measure_all_reduce made in this session, unchanged (its raw repeats,
  its clocks agreeing with them, its seal: checks/measured.py). Judged against the record, not a
  new run, so the load of a busy machine cannot fail an honest fit.

The ring grader launches the learner's function on 2, 3 and 4 ranks (gloo, on the CPU, so it
grades the same on a laptop and a GPU node), checks the sums and counts the bytes each rank sends.
"""

import numpy as np
import torch
import torch.distributed as dist

from ..topics.collectives import (_send_right_receive_left, collective_puzzle, count_traffic,
                                 naive_all_reduce, ring_chunks)
from ..topics.cost_model import AllReduceSweep, fit_alpha_beta, ring_all_reduce_time
from .engine import GradingError, expect, expect_close, grader, wrong_answer
from .engine.measured import expect_recorded
from .engine.ranks import run_on_ranks

LAUNCH_TIMEOUT_S = 20
PUZZLE_WORLD_SIZE = 3
RING_WORLD_SIZES = (2, 3, 4)
RING_SHAPES = ((1200,), (10,), (3, 5))  # divisible by 2, 3 and 4; uneven chunks; two dimensions
BYTES_TOLERANCE = 0.05                  # every correct ring sends exactly 2 (N - 1) / N of them


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
               f"follow x on rank {rank} through the calls, one line at a time: what does each "
               "call leave on that rank, and what does it read from the others?")


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
        _expect_neighbours_only(per_rank, world_size)
        _expect_sums(per_rank, world_size)
        _expect_ring_traffic(per_rank, world_size)


def _expect_point_to_point_only(per_rank, world_size):
    for rank, runs in enumerate(per_rank):
        called = sorted({name for _, traffic in runs for name in traffic.collectives})
        expect(not called, f"the calls rank {rank} made on {world_size} ranks",
               "point-to-point calls only (dist.send/recv, isend/irecv, batch_isend_irecv)",
               f"collectives {called}",
               "build the all-reduce yourself, from messages between neighbours: a collective "
               "runs the backend's own algorithm, not yours")


def _expect_neighbours_only(per_rank, world_size):
    for rank, runs in enumerate(per_rank):
        neighbours = {(rank - 1) % world_size, (rank + 1) % world_size}
        for shape, (_, traffic) in zip(RING_SHAPES, runs):
            peers = sorted(set(traffic.bytes_sent_to) | set(traffic.bytes_received_from),
                           key=str)
            strangers = [peer for peer in peers if peer not in neighbours]
            expect(not strangers, f"the ranks rank {rank} talked to on {world_size} ranks "
                   f"(tensor of shape {shape})", f"its ring neighbours only, ranks "
                   f"{sorted(neighbours)}", f"ranks {peers}",
                   f"in a ring, rank {rank} sends only to rank {(rank + 1) % world_size} and "
                   f"receives only from rank {(rank - 1) % world_size}; sending each chunk "
                   f"straight to its owner (rank {strangers[0] if strangers else '?'} here) is "
                   "not a ring")


def _expect_sums(per_rank, world_size):
    for index, shape in enumerate(RING_SHAPES):
        expected = sum(grading_tensor(rank, world_size, shape) for rank in range(world_size))
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


def _straight_to_each_owner(tensor):
    """Reduce-scatter and all-gather with each chunk sent straight to the rank that owns it: the
    right sums and bytes, but every rank talks to every other, not a ring."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    for owner in range(world_size):
        for peer in range(world_size):
            if peer != owner and rank == owner:
                incoming = torch.empty_like(chunks[owner])
                dist.recv(incoming, src=peer)
                chunks[owner] += incoming
            elif peer != owner and rank == peer:
                dist.send(chunks[owner].contiguous(), dst=owner)
    for owner in range(world_size):
        for peer in range(world_size):
            if peer != owner and rank == owner:
                dist.send(chunks[owner].contiguous(), dst=peer)
            elif peer != owner and rank == peer:
                dist.recv(chunks[owner], src=owner)
    return tensor


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
FIT_SLACK = 0.15              # a fit may miss the times by 15% more than the best relative fit

# A sweep as measure_all_reduce records one on a busy 2-core machine: the ring model with
# alpha = 150 us and 1 GB/s, times a fixed, uneven noise (a slow repeat at 64 KiB). A plain list:
# no record, so it shows the fitting mistakes below; a right fit of it is still no measurement.
_NOISE = [1.1, 0.8, 1.25, 0.9, 1.0, 1.3, 0.85, 1.6, 0.9, 1.15, 0.95, 1.2]
RECORDED_SWEEP = [(4 ** k, ring_all_reduce_time(4 ** k, 2, 150e-6, 1e-9) * noise)
                  for k, noise in zip(range(1, 13), _NOISE)]


@grader("measure alpha and beta")
def check_measure_alpha_beta(sweep, alpha, beta, latency_bound_below):
    sizes, seconds = _expect_a_sweep(sweep)
    fitted = _as_floats((alpha, beta), "(alpha, beta)")
    expect(all(value > 0 for value in fitted), "(alpha, beta)", "two positive numbers: seconds, "
           "and seconds per byte", repr(fitted), "a negative or zero alpha or beta comes from a "
           "fit that the large messages' times swamp, or from a sign slip")
    _expect_a_good_fit(sizes, seconds, *fitted)
    [below] = _as_floats((latency_bound_below,), "latency_bound_below")
    expect_close(below, SWEEP_WORLD_SIZE * fitted[0] / fitted[1],
                 "latency_bound_below, from your alpha and beta",
                 "the ring's two terms are equal at one size: solve for it with N = 2 ranks",
                 rtol=1e-3, atol=0)
    expect_recorded(sweep, AllReduceSweep, "sweep", "launch(cost_model.measure_all_reduce, "
                    "sizes_bytes, nprocs=2)[0]", lambda record: sum(map(sum, record.repeats)))
    expect(sweep.world_size == SWEEP_WORLD_SIZE, "the number of ranks of your sweep",
           f"{SWEEP_WORLD_SIZE} (alpha and beta are undone from the ring on 2 ranks)",
           str(sweep.world_size), "record the sweep with nprocs=2")


def fit_errors(sizes, seconds, alpha, beta):
    """(root-mean-square relative error, rms log error) of the ring model's times on 2 ranks."""
    predicted = ring_all_reduce_time(sizes, SWEEP_WORLD_SIZE, alpha, beta)
    return (float(np.sqrt(np.mean((predicted / seconds - 1) ** 2))),
            float(np.sqrt(np.mean(np.log(predicted / seconds) ** 2))))


def _expect_a_good_fit(sizes, seconds, alpha, beta):
    best = [fit_errors(sizes, seconds, *fit_alpha_beta(sizes, seconds, SWEEP_WORLD_SIZE, errors))[i]
            for i, errors in enumerate(("relative", "log"))]
    got = fit_errors(sizes, seconds, alpha, beta)
    if any(mine <= (1 + FIT_SLACK) * optimum + 1e-3 for mine, optimum in zip(got, best)):
        return
    predicted = ring_all_reduce_time(sizes, SWEEP_WORLD_SIZE, alpha, beta)
    worst = int(np.argmax(np.abs(np.log(predicted / seconds))))
    off = predicted[worst] / seconds[worst]
    raise GradingError(
        "how well your alpha and beta predict the times you measured",
        f"relative errors (root mean square) at most {1 + FIT_SLACK:.2f} x {best[0]:.1%}, those "
        f"of a fit on relative errors", f"{got[0]:.3g} ({got[0] / best[0]:.3g} times as large)",
        f"your model is furthest off at {sizes[worst]:,.0f} bytes: it predicts "
        f"{predicted[worst] * 1e6:,.4g} us where you measured {seconds[worst] * 1e6:,.4g} us "
        f"({off:.3g} times). " + ("Is alpha in seconds and beta in seconds per byte? "
                                 if off > 100 or off < 0.01 else "")
        + "Fit so that every size counts alike (its error relative to its time), and undo the "
          "ring's factors on 2 ranks")


def _expect_a_sweep(sweep):
    """The recorded sweep as two float arrays, or a GradingError that says what to record."""
    expected = (f"measure_all_reduce's list of (nbytes, seconds) from 2 ranks: at least "
                f"{SWEEP_MIN_SIZES} sizes, from {SWEEP_SMALLEST_AT_MOST} bytes or less up to "
                f"{SWEEP_LARGEST_AT_LEAST:,} or more")
    hint = ("record it with measure_all_reduce on 2 ranks, over the sizes the exercise gives "
            "(4 bytes to 16 MiB)")
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


def _changed(change):
    """The reference report of the example sweep, with (alpha, beta, latency) changed."""
    recorded, alpha, beta, below = _reference_report()
    return (recorded, *change(alpha, beta, below))


def _converted_record():
    """A sweep dressed as measure_all_reduce's record, its times turned into milliseconds."""
    record = AllReduceSweep((nbytes, seconds * 1e3) for nbytes, seconds in RECORDED_SWEEP)
    record.repeats, record.world_size, record.backend = [[t] for _, t in record], 2, "gloo"
    record.clock, record.seal = ((0.0, 0.0), (1.0, 1.0)), "0" * 64
    return _reference_report(record)


# -- launching for a grader --------------------------------------------------------------------

def _launch_for_grading(fn, *args, nprocs, what):
    """Run fn on nprocs gloo ranks, silently; a failure or a hang becomes a GradingError."""
    return run_on_ranks(fn, *args, nprocs=nprocs, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint="a blocking send waits for its receiver: if every rank sends "
                                  "first, nobody receives. In each step every rank must be "
                                  "sending and receiving at the same time",
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
        wrong_answer("reduce-scatter and all-gather straight to each chunk's owner, not a ring",
                     _straight_to_each_owner),
        wrong_answer("the unfinished stub", _stub),
    ],
    check_measure_alpha_beta: [
        wrong_answer("a plain least-squares line: the large messages' noise swamps alpha",
                     *_unweighted_line()),
        wrong_answer("keeps the line's intercept, forgetting the ring's 2 (N - 1)",
                     *_line_without_the_ring()),
        wrong_answer("swaps alpha and beta", *_changed(lambda a, b, n: (b, a, 2 * b / a))),
        wrong_answer("latency_bound_below = alpha / beta, forgetting N",
                     *_changed(lambda a, b, n: (a, b, a / b))),
        wrong_answer("a sweep of 3 sizes", *_reference_report(RECORDED_SWEEP[::4])),
        wrong_answer("a sweep that stops at 64 KiB, before bandwidth shows",
                     *_reference_report(RECORDED_SWEEP[:8])),
        wrong_answer("made up: a typed-in sweep, fitted right", *_reference_report()),
        wrong_answer("wrong unit: alpha in microseconds",
                     *_changed(lambda a, b, n: (a * 1e6, b, n * 1e6))),
        wrong_answer("made up: a record whose times were turned into milliseconds",
                     *_converted_record()),
    ],
}
