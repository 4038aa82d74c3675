"""Graders of lesson 09, scaling: speedup and efficiency from step times, Amdahl's law fitted to
speedups, the predicted time of a gradient all-reduce, and a batch plan for a target global batch.

- speedup and efficiency: {world_size: (speedup, efficiency)} for strong and weak scaling (pairs
  as tuples or lists, any kind of number).
- fit Amdahl's law: the serial fraction s, least squares over every world size.
- predicted all-reduce time: a ring's 2 (N - 1) alpha + 2 (N - 1) / N x bytes x beta.
- batch plan for a global batch: (batch_size, grad_accum_steps), whole numbers of any integer
  type, that give exactly the global batch with the fewest micro-batches that fit; a ValueError
  when the ranks cannot share it evenly.

Measured times vary from run to run and machine to machine, so every grader calls the learner's
function on fixed inputs, never on the lesson's measurements.
"""
import math
import numbers

from ..topics.cost_model import naive_all_reduce_time, ring_all_reduce_time
from . import expect, expect_close, expect_value_error, grader, wrong_answer

# -- Exercise 1: speedup and efficiency ------------------------------------------------------------

SPEEDUP_CASES = [  # (step_seconds, scaling, {world_size: (speedup, efficiency)})
    ({1: 0.8, 2: 0.5, 4: 0.32, 8: 0.2}, "strong",
     {1: (1.0, 1.0), 2: (1.6, 0.8), 4: (2.5, 0.625), 8: (4.0, 0.5)}),
    ({1: 0.1, 2: 0.11, 4: 0.125, 8: 0.16}, "weak",
     {1: (1.0, 1.0), 2: (2 / 1.1, 1 / 1.1), 4: (3.2, 0.8), 8: (5.0, 0.625)}),
    ({2: 0.004, 1: 0.001}, "strong", {1: (1.0, 1.0), 2: (0.25, 0.125)}),  # a slowdown
]


@grader("speedup and efficiency")
def check_speedup_and_efficiency(speedup_and_efficiency):
    for step_seconds, scaling, expected in SPEEDUP_CASES:
        call = f"speedup_and_efficiency({step_seconds}, {scaling!r})"
        got = speedup_and_efficiency(dict(step_seconds), scaling)
        expect(isinstance(got, dict) and sorted(got) == sorted(expected), call,
               f"a dict with the keys {sorted(expected)} (one entry per world size)",
               repr(got)[:120])
        for world_size in sorted(expected):
            pair = got[world_size]
            expect(isinstance(pair, (tuple, list)) and len(pair) == 2,
                   f"{call}[{world_size}]", "a pair (speedup, efficiency)", repr(pair)[:120])
            expect_close(tuple(float(value) for value in pair), expected[world_size],
                         f"{call}[{world_size}], (speedup, efficiency)",
                         _speedup_hint(scaling), rtol=1e-6)


def _speedup_hint(scaling):
    if scaling == "strong":
        return ("strong scaling: every world size does the same work per step, so the speedup "
                "is t1 / tN; the efficiency is the speedup divided by N")
    return ("weak scaling: a step on N ranks does N times the work of a step on 1 rank, so the "
            "speedup is N t1 / tN; the efficiency is the speedup divided by N")


def _inverted(step_seconds, scaling):
    work = (lambda n: 1) if scaling == "strong" else (lambda n: n)
    return {n: (work(n) * t / step_seconds[1], work(n) * t / step_seconds[1] / n)
            for n, t in step_seconds.items()}


def _weak_as_strong(step_seconds, scaling):
    return {n: (step_seconds[1] / t, step_seconds[1] / t / n) for n, t in step_seconds.items()}


def _efficiency_not_divided(step_seconds, scaling):
    speedups = {n: (1 if scaling == "strong" else n) * step_seconds[1] / t
                for n, t in step_seconds.items()}
    return {n: (value, value) for n, value in speedups.items()}


def _efficiency_is_time_ratio(step_seconds, scaling):
    return {n: ((1 if scaling == "strong" else n) * step_seconds[1] / t, step_seconds[1] / t)
            for n, t in step_seconds.items()}


def _speedup_stub(step_seconds, scaling):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- Exercise 2: fit Amdahl's law -----------------------------------------------------------------

AMDAHL_EXACT_CASES = [((1, 2, 4, 8), 0.05), ((2, 4, 16), 0.2), ((1, 2), 0.0)]
AMDAHL_NOISY_CASE = ((1, 2, 4, 8), (1.0, 1.9, 3.3, 5.6))  # no s fits exactly: the least squares


def _least_squares_serial_fraction(world_sizes, speedups):
    x = [1 - 1 / n for n in world_sizes]
    y = [1 / s - 1 / n for n, s in zip(world_sizes, speedups)]
    return sum(a * b for a, b in zip(x, y)) / sum(a * a for a in x)


@grader("fit Amdahl's law")
def check_fit_amdahl(fit_amdahl):
    hint = ("rearrange 1/S = s + (1 - s)/N into the line y = s x with x = 1 - 1/N and "
            "y = 1/S - 1/N, then s = sum(x * y) / sum(x * x) over all points")
    for world_sizes, serial_fraction in AMDAHL_EXACT_CASES:
        speedups = [1 / (serial_fraction + (1 - serial_fraction) / n) for n in world_sizes]
        got = fit_amdahl(list(world_sizes), speedups)
        expect_close(_as_float(got), serial_fraction,
                     f"fit_amdahl({list(world_sizes)}, exact speedups of s = {serial_fraction})",
                     hint, rtol=1e-6, atol=1e-9)
    world_sizes, speedups = AMDAHL_NOISY_CASE
    got = fit_amdahl(list(world_sizes), list(speedups))
    expect_close(_as_float(got), _least_squares_serial_fraction(world_sizes, speedups),
                 f"fit_amdahl({list(world_sizes)}, {list(speedups)}) (measured: no s fits all)",
                 hint + "; use every world size, not only the largest", rtol=1e-6)


def _as_float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value  # expect_close describes what came back


def _largest_world_size_only(world_sizes, speedups):
    n, s = world_sizes[-1], speedups[-1]
    return (1 / s - 1 / n) / (1 - 1 / n)


def _mean_inverse_speedup(world_sizes, speedups):
    return sum(1 / s for s in speedups) / len(speedups)


def _one_minus_efficiency(world_sizes, speedups):
    return 1 - speedups[-1] / world_sizes[-1]


def _amdahl_stub(world_sizes, speedups):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- Exercise 3: a predicted all-reduce time ------------------------------------------------------

ALL_REDUCE_CASES = [  # (n_parameters, world_size, alpha, beta, bytes_per_parameter)
    (25_600_000, 8, 10e-6, 1 / 50e9, 4),       # ResNet-50's gradients, fp32, 8 GPUs
    (1_000_000_000, 64, 20e-6, 1 / 25e9, 2),   # 1B parameters, bf16 gradients, 64 GPUs
    (676, 2, 50e-6, 1 / 2e9, 4),               # the course model on 2 CPU ranks
    (1_000_000, 1, 10e-6, 1 / 50e9, 4),        # one rank: nothing to send
]


@grader("predicted all-reduce time")
def check_all_reduce_seconds(all_reduce_seconds):
    for n_parameters, world_size, alpha, beta, bytes_per_parameter in ALL_REDUCE_CASES:
        expected = ring_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)
        got = all_reduce_seconds(n_parameters, world_size, alpha, beta,
                                 bytes_per_parameter=bytes_per_parameter)
        expect_close(_as_float(got), expected,
                     f"all_reduce_seconds({n_parameters:_}, {world_size}, alpha={alpha:g}, "
                     f"beta={beta:g}, bytes_per_parameter={bytes_per_parameter})",
                     "the gradients are n_parameters * bytes_per_parameter bytes; a ring takes "
                     "2 (N - 1) alpha + 2 (N - 1) / N * bytes * beta", rtol=1e-6, atol=1e-15)


def _parameters_as_bytes(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    return ring_all_reduce_time(n_parameters, world_size, alpha, beta)


def _through_rank_zero(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    return naive_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)


def _reduce_scatter_half_only(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    nbytes = n_parameters * bytes_per_parameter
    return (world_size - 1) * alpha + (world_size - 1) / world_size * nbytes * beta


def _always_fp32(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    return ring_all_reduce_time(n_parameters * 4, world_size, alpha, beta)


def _all_reduce_stub(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- Exercise 4: a batch plan for a target global batch --------------------------------------------

PLAN_CASES = [  # (global_batch_size, max_batch_size, world_size, (batch_size, grad_accum_steps))
    (1024, 64, 1, (64, 16)), (1024, 64, 8, (64, 2)), (1024, 64, 64, (16, 1)),
    (1024, 48, 2, (32, 16)), (768, 100, 4, (96, 2)), (1000, 64, 8, (25, 5)),
]
IMPOSSIBLE_PLANS = [(1000, 64, 16), (96, 8, 5)]  # the global batch does not split over the ranks


@grader("batch plan for a global batch")
def check_accumulation_plan(accumulation_plan):
    for global_batch_size, max_batch_size, world_size, expected in PLAN_CASES:
        call = f"accumulation_plan({global_batch_size}, {max_batch_size}, {world_size})"
        got = accumulation_plan(global_batch_size, max_batch_size, world_size)
        expect(isinstance(got, (tuple, list)) and len(got) == 2
               and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in got),
               call, "a pair of ints (batch_size, grad_accum_steps)", repr(got)[:120],
               "use // (integer division) for counts of samples and micro-batches")
        batch_size, grad_accum_steps = got
        product = batch_size * grad_accum_steps * world_size
        expect(product == global_batch_size, f"{call}: the global batch it gives",
               f"{global_batch_size}", f"{batch_size} x {grad_accum_steps} x {world_size} = "
               f"{product}", "batch_size x grad_accum_steps x world_size must be exactly the "
               "target: the learning rate was tuned for it; so grad_accum_steps must divide "
               "each rank's share")
        expect(batch_size <= max_batch_size, f"{call}: the micro-batch",
               f"at most max_batch_size = {max_batch_size} samples", str(batch_size),
               "a larger micro-batch does not fit in the device's memory")
        expect(tuple(got) == expected, call, f"{expected}: the fewest micro-batches",
               repr(tuple(got)), "try grad_accum_steps = 1, 2, 3, ... and take the first that "
               "divides each rank's share into micro-batches that fit")
    for global_batch_size, max_batch_size, world_size in IMPOSSIBLE_PLANS:
        call = f"accumulation_plan({global_batch_size}, {max_batch_size}, {world_size})"
        expect_value_error(lambda: accumulation_plan(global_batch_size, max_batch_size, world_size),
                           call, "the global batch does not split evenly over the ranks",
                           "check global_batch_size % world_size == 0 and raise ValueError otherwise")


def _largest_batch_rounding_up(global_batch_size, max_batch_size, world_size):
    per_rank = global_batch_size // world_size
    batch_size = min(max_batch_size, per_rank)
    return batch_size, math.ceil(per_rank / batch_size)


def _ignores_world_size(global_batch_size, max_batch_size, world_size):
    for steps in range(1, global_batch_size + 1):
        if global_batch_size % steps == 0 and global_batch_size // steps <= max_batch_size:
            return global_batch_size // steps, steps


def _never_checks_even_split(global_batch_size, max_batch_size, world_size):
    per_rank = global_batch_size // world_size  # no check that the ranks share it evenly
    for steps in range(1, per_rank + 1):
        if per_rank % steps == 0 and per_rank // steps <= max_batch_size:
            return per_rank // steps, steps


def _plan_stub(global_batch_size, max_batch_size, world_size):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    check_speedup_and_efficiency: [
        wrong_answer("divides tN by t1", _inverted),
        wrong_answer("treats weak scaling like strong scaling", _weak_as_strong),
        wrong_answer("forgets to divide the efficiency by N", _efficiency_not_divided),
        wrong_answer("efficiency t1 / tN under both scalings (right for weak only)",
                     _efficiency_is_time_ratio),
        wrong_answer("the unfinished stub", _speedup_stub),
    ],
    check_fit_amdahl: [
        wrong_answer("uses only the largest world size", _largest_world_size_only),
        wrong_answer("averages 1 / S, forgetting the 1 / N term", _mean_inverse_speedup),
        wrong_answer("one minus the efficiency at the largest world size", _one_minus_efficiency),
        wrong_answer("the unfinished stub", _amdahl_stub),
    ],
    check_all_reduce_seconds: [
        wrong_answer("counts parameters as bytes", _parameters_as_bytes),
        wrong_answer("all through rank 0 (naive all-reduce)", _through_rank_zero),
        wrong_answer("counts only the reduce-scatter half of the ring",
                     _reduce_scatter_half_only),
        wrong_answer("assumes fp32 gradients whatever bytes_per_parameter says", _always_fp32),
        wrong_answer("the unfinished stub", _all_reduce_stub),
    ],
    check_accumulation_plan: [
        wrong_answer("takes the largest micro-batch and rounds the steps up",
                     _largest_batch_rounding_up),
        wrong_answer("forgets the world size", _ignores_world_size),
        wrong_answer("never checks that the ranks share the batch evenly",
                     _never_checks_even_split),
        wrong_answer("the unfinished stub", _plan_stub),
    ],
}
