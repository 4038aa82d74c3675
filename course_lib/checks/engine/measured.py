"""Is a learner's measurement real? The shared rules of the MEASURE graders.

Two ways to tell a measurement of this machine from typed-in, copied or converted numbers:

- a band: the grader re-measures a little of the same work itself and wants the learner's figure
  within a factor of its own (`expect_within_band`, re-measuring several times before it rejects,
  so that a burst of load on a busy machine does not fail a right answer); a unit slip (1000
  times off) is named as one (`unit_slip`);
- a record: the course's measuring helpers (cost_model.measure_all_reduce, scaling.measure_speedup_pairs)
  return their numbers with the raw timings they came from, their clocks and a seal
  (topics.timing.seal); `expect_recorded` wants such a record, made in this session, unchanged,
  its clocks in agreement with each other and with the time its timings add up to.
And `expect_varies`: real timings of many steps are never all the same number.
"""
import time

from . import expect

# Clocks: a record reads time.time() and time.perf_counter() together at its start and its end, so
# both spans are one interval; they differ by NTP's slewing (at most 0.05%) and by a deschedule
# between the two reads of a pair (milliseconds on a loaded machine). 0.5 s + 5% covers both.
CLOCK_BAND_S, CLOCK_BAND_RATIO = 0.5, 0.05
# The timings of a record lie inside its span, but a rank's repeat can be timed as the slowest
# rank's, which starts a little before this rank's clock sees it: 1.5 x the span + 0.5 s.
TIMED_IN_SPAN_RATIO, TIMED_IN_SPAN_S = 1.5, 0.5

_UNITS = [(1e3, "milliseconds"), (1e6, "microseconds"), (1e9, "nanoseconds or GB/s")]


def unit_slip(ratio: float) -> str:
    """'' or a hint naming the unit a figure `ratio` times the right one was probably given in."""
    for factor, unit in _UNITS:
        for scale, direction in ((factor, "times"), (1 / factor, "times less than")):
            if 0.3 * scale <= ratio <= 3 * scale:
                size = f"{factor:,.0f}"
                return (f"about {size} {direction} this machine's figure: a unit slip ({unit}?); "
                        "the exercise asks for seconds, bytes and bytes per second")
    return ""


def expect_varies(values, what: str, hint: str) -> None:
    """Timings of real steps differ from step to step: at least half of them are distinct."""
    distinct = len(set(values))
    expect(distinct * 2 >= len(values), what, "times measured one by one, which differ from step "
           "to step", f"{len(values)} times of which {distinct} distinct: {list(values)[:4]}...",
           hint)


def expect_within_band(got: float, measure_here, factor: float, what: str, quantity: str,
                       hint: str, pauses_s=(0.2, 0.5, 1, 2)) -> float:
    """`got` within `factor` of `measure_here()`, a fresh measurement of the same work on this
    machine; measures again after each of `pauses_s` before rejecting (a burst of load passes).
    Returns the measurement that agreed."""
    measured = []
    for pause in (0, *pauses_s):
        time.sleep(pause)
        measured.append(measure_here())
        if measured[-1] / factor <= got <= measured[-1] * factor:
            return measured[-1]
    typical = sorted(measured)[len(measured) // 2]
    ratio = got / typical if typical > 0 else float("inf")
    expect(False, what, f"within {factor:g}x of {typical:.4g} {quantity}, which the check just "
           f"measured here, running the same work", f"{got:.4g} {quantity} ({ratio:.3g} times it)",
           unit_slip(ratio) or hint)


def expect_recorded(record, record_type, what: str, how_to_record: str, timed_seconds) -> None:
    """`record` is what `how_to_record` returned in this session, unchanged: its type, its seal,
    and its clocks, which agree with each other and with `timed_seconds(record)`, the seconds its
    raw timings add up to. Numbers typed in, copied into a plain list or dict, or converted fail."""
    expect(isinstance(record, record_type), what, f"the record {how_to_record} returned, as it "
           "returned it", f"a {type(record).__name__} without the raw timings of a measurement: "
           f"{repr(record)[:80]}", "the check reads the raw timings the measuring helper keeps; "
           "numbers typed in, copied or converted have none: measure, and pass its result as is")
    expect(record.recorded_here(), what, f"the record {how_to_record} made in this session",
           "a record changed since it was measured, or made in another session",
           "measure again in this notebook and pass the result unchanged (seconds, as measured)")
    (wall_start, perf_start), (wall_end, perf_end) = record.clock
    span, timed = perf_end - perf_start, timed_seconds(record)
    expect(abs((wall_end - wall_start) - span) <= CLOCK_BAND_S + CLOCK_BAND_RATIO * span
           and wall_end <= time.time() + CLOCK_BAND_S
           and timed <= TIMED_IN_SPAN_RATIO * span + TIMED_IN_SPAN_S, f"{what}'s clocks",
           "a measurement as long as its timings add up to, made before now",
           f"{timed:.3f} s of timings in a span of {span:.3f} s", "measure again in this notebook")

