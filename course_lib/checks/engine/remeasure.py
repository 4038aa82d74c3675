"""A lopsided band for a learner's step times: the grader measures the same configuration again
itself and requires the learner's median inside a band around its own (checks/measured.py has
the symmetric band and the sealed records; this one is for step times taken minutes apart).

Load on a machine only ever adds time to a step; it never takes any away. So the band is
lopsided: a learner's median may be far slower than the grader's (a burst of load during the
learner's run, minutes before the check), but only a little faster than the fastest step the
grader saw (that much load may have slowed even the grader's best step). Both limits are wide
enough that a loaded 2-core machine never fails a real measurement, and narrow enough that a
made-up figure or one in the wrong unit (milliseconds, microseconds: factors of 1000) falls out.
"""
import statistics

from . import expect
from .measured import unit_slip

# On a 2-core machine shared by many processes, one cap's per-round median moved by 2.5x between
# rounds seconds apart (tests/checks/answers/lesson04.py's RECORDED_BUCKET_ROUNDS); a learner's run and the check are
# minutes apart, under other load. Hence 5x on the fast side and 30x on the slow side: a unit
# mistake is 1000x, a made-up 1 ms step 15-50x faster than this machine's fastest DDP step of
# the bucket exercise's model at its smallest cap.
AT_MOST_FASTER = 5    # learner's median >= the grader's fastest step / 5
AT_MOST_SLOWER = 30   # learner's median <= the grader's median step x 30


def expect_like_this_machine(learner_seconds, machine_seconds, what: str) -> None:
    """Expect the median of `learner_seconds` within the band around `machine_seconds`, the
    grader's own timings of the same work on this machine (seconds each)."""
    learner = statistics.median(learner_seconds)
    fastest, typical = min(machine_seconds), statistics.median(machine_seconds)
    low, high = fastest / AT_MOST_FASTER, typical * AT_MOST_SLOWER
    if low <= learner <= high:
        return
    ratio = learner / typical if typical > 0 else float("inf")
    if unit_slip(ratio):
        hint = unit_slip(ratio)
    elif learner < low:
        hint = (f"a step in {learner * 1e3:.3g} ms is {fastest / learner:.3g} times faster than "
                "the fastest step this machine runs now: these figures were not measured here, "
                "with this configuration")
    else:
        hint = (f"{learner / typical:.3g} times slower than this machine runs the same steps "
                "now: measure with the exercise's configuration, with nothing else running")
    expect(False, what, f"a median step between {low * 1e3:.3g} ms and {high * 1e3:.3g} ms "
           f"(this machine, re-measured: fastest {fastest * 1e3:.3g} ms, median "
           f"{typical * 1e3:.3g} ms)", f"{learner * 1e3:.3g} ms", hint)
