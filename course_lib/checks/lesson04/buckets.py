"""Lesson 04, exercise 5: the bucket size that makes a step fastest, measured on this machine.

- the sweep is real: StepTimings from 2 ranks, at least 4 caps up to DDP's default 25 MiB, a
  smallest cap that splits the gradients into 8 buckets or more, 20 timed steps per cap or more;
  the grader times the exercise's configuration (BUCKET_STEPS) again at the sweep's smallest and
  largest cap, and each one's median step must lie in checks/engine/remeasure.py's band around this
  machine's (5x faster than its fastest step at most, 30x slower than its median at most: made-up
  figures and milliseconds fall out), with the same number of buckets per step.
- the choice is judged against the sweep the learner recorded, never a new run (a busy machine
  gives other times at every run): the reported cap's median step (all its steps pooled) within
  BUCKET_TOLERANCE (10%) of the fastest cap's. Any number type; the sweep as a list of
  StepTimings (nested too) or a dict from cap to them.
"""
import functools
import math
import statistics
from collections.abc import Mapping

from ..engine import GradingError, expect, grader
from ..engine.remeasure import expect_like_this_machine
from ...topics.scaling import time_ddp_steps

BUCKET_WORLD_SIZE = 2
DEFAULT_BUCKET_CAP_MB = 25   # DDP's default cap: the sweep must say whether it is right here
MIN_BUCKET_CAPS = 4
MIN_STEPS_PER_CAP = 20       # timed steps, all rounds together
MIN_BUCKETS = 8              # at the smallest cap: a model with enough gradient tensors to split
BUCKET_TOLERANCE = 0.10      # two caps whose medians are closer are a tie on a busy machine
# the exercise's configuration (the notebook's BUCKET_STEPS): 48 hidden layers, 98 gradients
BUCKET_STEPS = dict(batch_size=64, hidden=64, hidden_layers=48, steps=8, warmup=3)
REMEASURE_TIMEOUT_S = 120
REMEASURE_ATTEMPTS = 3       # measurements, a few seconds each, before a figure is rejected
BUCKET_HINT = ("bucket_sweep holds what the exercise's steps 1 and 2 record: every StepTiming "
               "that time_ddp_steps returned on rank 0, for every cap and round")


def _sweep_records(bucket_sweep) -> list:
    """[(cap the record was measured at, record)] from a list of StepTimings (nested lists too)
    or a {cap: StepTiming or list of them}; a key must be its records' cap."""
    def records_in(value):
        if hasattr(value, "seconds"):
            return [value]
        try:
            return [record for item in value for record in records_in(item)]
        except TypeError:
            raise GradingError("bucket_sweep", "the StepTimings time_ddp_steps returned (a list, "
                               "or a dict from cap to them)", repr(value)[:120],
                               "keep the StepTiming objects themselves: their seconds, cap, "
                               "world size and bucket count are what the check reads") from None

    if isinstance(bucket_sweep, Mapping):
        pairs = []
        for key, value in bucket_sweep.items():
            for record in records_in(value):
                expect(_same_cap(key, record.bucket_cap_mb), f"bucket_sweep[{key!r}]",
                       f"timings measured at bucket_cap_mb={key}",
                       f"a timing measured at bucket_cap_mb={record.bucket_cap_mb}",
                       f"the timings under key {key!r} were measured at another cap")
                pairs.append(record)
        records = pairs
    else:
        records = records_in(bucket_sweep)
    expect(len(records) > 0, "bucket_sweep", "the StepTimings of your sweep", "nothing",
           BUCKET_HINT)
    return records


def _same_cap(a, b) -> bool:
    try:
        return a is not None and b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
    except (TypeError, ValueError):
        return False


def _steps_by_cap(records) -> dict:
    """{cap: (every timed step's seconds, buckets per step)}, the caps in increasing order."""
    by_cap = {}
    for record in records:
        expect(record.world_size == BUCKET_WORLD_SIZE, "the world size of bucket_sweep's timings",
               f"{BUCKET_WORLD_SIZE} ranks (DDP all-reduces only between ranks)",
               f"{record.world_size}", f"these timings come from {record.world_size} "
               "process(es): in the notebook's own process there is no DDP and nothing to bucket")
        expect(record.bucket_cap_mb is not None, "a timing of bucket_sweep",
               "timings at the caps you chose", "a timing at DDP's default (bucket_cap_mb=None)",
               "a timing in the sweep was measured at DDP's default cap, not one of BUCKET_CAPS_MB")
        cap = float(record.bucket_cap_mb)
        seconds, _ = by_cap.setdefault(cap, ([], record.buckets))
        seconds.extend(float(value) for value in record.seconds)
    return dict(sorted(by_cap.items()))


def _expect_a_bucket_sweep(by_cap) -> None:
    caps = list(by_cap)
    expect(len(caps) >= MIN_BUCKET_CAPS and caps[-1] >= DEFAULT_BUCKET_CAP_MB,
           "the caps bucket_sweep measured", f"at least {MIN_BUCKET_CAPS} caps, up to DDP's "
           f"default {DEFAULT_BUCKET_CAP_MB} MiB or more", f"{len(caps)}: {caps}",
           "sweep from a cap that gives every layer a bucket of its own to the default: "
           "BUCKET_CAPS_MB as the exercise gives it")
    smallest_buckets = by_cap[caps[0]][1] or 0
    expect(smallest_buckets >= MIN_BUCKETS, f"buckets per step at the smallest cap, {caps[0]} MiB",
           f"{MIN_BUCKETS} or more, for the cap to matter", str(smallest_buckets),
           f"{smallest_buckets} bucket(s) at {caps[0]:g} MiB: a model with this few gradient "
           "tensors (the course's 2-layer MLP has 4), or a smallest cap this large, has nothing "
           "to split; the exercise's model has 98")
    for cap, (seconds, _) in by_cap.items():
        expect(len(seconds) >= MIN_STEPS_PER_CAP, f"timed steps at bucket_cap_mb={cap:g}",
               f"{MIN_STEPS_PER_CAP} or more, all rounds together (one burst of load must not "
               f"decide)", str(len(seconds)), f"the cap {cap:g} MiB has fewer timed steps than "
               "the exercise's rounds and BUCKET_STEPS give")
        expect(all(math.isfinite(value) and value > 0 for value in seconds),
               f"the step times at bucket_cap_mb={cap:g}", "positive seconds",
               repr(seconds)[:120], BUCKET_HINT)


@grader("the fastest bucket size, measured")
def check_best_bucket_cap(bucket_sweep, best_bucket_cap_mb):
    records = _sweep_records(bucket_sweep)
    by_cap = _steps_by_cap(records)
    _expect_a_bucket_sweep(by_cap)
    _expect_measured_here(by_cap)
    medians = {cap: statistics.median(seconds) for cap, (seconds, _) in by_cap.items()}
    fastest = min(medians, key=medians.get)
    table = ", ".join(f"{cap:g} MiB {seconds * 1e3:.1f} ms" for cap, seconds in medians.items())
    chosen = next((cap for cap in medians if _same_cap(best_bucket_cap_mb, cap)), None)
    expect(chosen is not None, "best_bucket_cap_mb", f"one of the caps you measured, in MiB: "
           f"{list(medians)}", repr(best_bucket_cap_mb)[:60],
           "report the cap (a key of your medians), not its step time"
           if _is_a_step_time(best_bucket_cap_mb, medians) else
           "report one of the caps of BUCKET_CAPS_MB, the one whose median step is shortest")
    slower = medians[chosen] / medians[fastest] - 1
    hint = ("take each cap's median over all its timed steps (every round together) and report "
            "the cap whose median is shortest")
    if medians[chosen] == max(medians.values()):
        hint = "that is the slowest cap of your sweep: report the one with the shortest median"
    elif chosen in _fastest_in_some_round(records):
        hint = ("that cap was the fastest in one round only, which a burst of load can decide: "
                + hint)
    expect(slower <= BUCKET_TOLERANCE, "best_bucket_cap_mb, judged by the sweep you recorded "
           f"(median step per cap: {table})", f"a cap whose median step is within "
           f"{BUCKET_TOLERANCE:.0%} of the fastest, {fastest:g} MiB",
           f"{chosen:g} MiB, {slower:.0%} slower than {fastest:g} MiB", hint)


def _expect_measured_here(by_cap) -> None:
    """The sweep's smallest and largest caps, timed again here: the same buckets per step, and
    each median step inside the band around this machine's. A figure outside the band is judged
    again against up to REMEASURE_ATTEMPTS measurements together, so that a burst of load during
    the grader's own few steps never fails a real sweep."""
    caps = (min(by_cap), max(by_cap))
    for cap, timing in zip(caps, this_machines_steps(caps)):
        expect(by_cap[cap][1] == timing.buckets, f"buckets per step at bucket_cap_mb={cap:g}",
               f"{timing.buckets}, as DDP splits the exercise's model on this machine",
               str(by_cap[cap][1]), "these timings are not of the exercise's model "
               "(BUCKET_STEPS) at this cap, or their bucket counts were typed in")
    for index, cap in enumerate(caps):
        for attempt in range(REMEASURE_ATTEMPTS):
            machine_seconds = [value for a in range(attempt + 1)
                               for value in this_machines_steps(caps, attempt=a)[index].seconds]
            try:
                expect_like_this_machine(by_cap[cap][0], machine_seconds, "the median step of "
                                         f"bucket_sweep at bucket_cap_mb={cap:g}")
                break
            except GradingError:
                if attempt == REMEASURE_ATTEMPTS - 1:
                    raise


def _time_caps_on_rank(caps):
    return [time_ddp_steps(bucket_cap_mb=cap, **BUCKET_STEPS) for cap in caps]


@functools.lru_cache(maxsize=16)
def this_machines_steps(caps: tuple, attempt: int = 0) -> list:
    """[StepTiming] of the exercise's configuration at each cap, measured now on 2 ranks (with
    the backend the learner's launch picks), once per process, set of caps and attempt."""
    from ...runtime.launcher.launch import launch
    from ...runtime.shared.errors import DistributedRunError

    try:
        return launch(_time_caps_on_rank, list(caps), nprocs=BUCKET_WORLD_SIZE,
                      timeout=REMEASURE_TIMEOUT_S, output="none")[0]
    except DistributedRunError as error:
        raise GradingError("re-measuring the sweep's configuration on this machine",
                           "a few DDP steps on 2 ranks", str(error).splitlines()[0][:200],
                           "this part of the check runs none of your code: run it again") from None


def _fastest_in_some_round(records) -> set:
    """The caps that had the shortest median in one round (the k-th timing of every cap)."""
    rounds = {}
    for record in records:
        per_cap = rounds.setdefault(float(record.bucket_cap_mb), [])
        per_cap.append(statistics.median(record.seconds) if len(record.seconds) else math.inf)
    fastest = set()
    for k in range(min(len(medians) for medians in rounds.values())):
        fastest.add(min(rounds, key=lambda cap: rounds[cap][k]))
    return fastest


def _is_a_step_time(value, medians) -> bool:
    try:
        return any(math.isclose(float(value), seconds, rel_tol=1e-6) for seconds in medians.values())
    except (TypeError, ValueError):
        return False
