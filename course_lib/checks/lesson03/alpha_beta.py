"""Lesson 03's alpha and beta: the learner's all-reduce sweep on 2 ranks, the (alpha, beta) fitted
to it and the size below which an all-reduce is mostly latency, judged against the sweep's record.

The sweep as cost_model.measure_all_reduce returned it (at least 8 sizes, from 64 bytes or less to
1 MiB or more), the fit and N alpha / beta any kind of number. The fit is judged by how well it
predicts the times measured: the root-mean-square of its relative errors at most FIT_SLACK (15%)
above that of the best relative-error fit, cost_model.fit_alpha_beta, or that of its log errors
above the best log-space fit's (a fit in log space, 6.6% from the relative fit in alpha, passes; a
plain least-squares line, or alpha twice too large, does not on the example sweep of the tests).
The sweep must be a measurement: the record measure_all_reduce made in this session, unchanged
(its raw repeats, its clocks agreeing with them, its seal: checks/engine/measured.py). Judged
against the record, not a new run, so the load of a busy machine cannot fail an honest fit.
"""
import numpy as np

from ...topics.cost_model import AllReduceSweep, fit_alpha_beta, ring_all_reduce_time
from ..engine import GradingError, expect, expect_close, grader
from ..engine.measured import expect_recorded

SWEEP_WORLD_SIZE = 2          # the exercise measures on 2 ranks
SWEEP_MIN_SIZES = 8
SWEEP_SMALLEST_AT_MOST = 64   # bytes: latency-bound on any machine
SWEEP_LARGEST_AT_LEAST = 2**20  # bytes: bandwidth-bound on a CPU or a GPU link
FIT_SLACK = 0.15              # a fit may miss the times by 15% more than the best relative fit


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

