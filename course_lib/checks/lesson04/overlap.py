"""Lesson 04, exercise 4: how much of the all-reduce did backward() hide?

- hidden share: for every rank and step, the share of the step's all-reduce time (the bucket
  spans merged, so time two buckets share counts once) that falls between backward.start and
  wait.start, within SHARE_TOLERANCE of course_lib.topics.timeline.overlap_fraction; None for a
  step with no all-reduce (under no_sync). Graded on hand-made timelines (buckets one after
  another, overlapping, three of them, a step under no_sync), which name each mistake first, and
  on one the grader records on 2 ranks, its times as they came.
"""
import functools

import torch
import torch.nn.functional as F

from ..engine import GradingError, expect, grader
from ..engine.ranks import run_on_ranks
from ...topics.timeline import merge_intervals, overlap_fraction
from ...training.models import make_model
from ...training.timeline_recorder import Span, Timeline, TimelineRecorder

LAUNCH_TIMEOUT_S = 90

SHARE_TOLERANCE = 0.01  # how far from overlap_fraction an answer may be (one may sample time)
# (rank, step): (backward's (start, end), each bucket all-reduce's (start, end)), in seconds. As
# in a recording, the wait runs from the last bucket's hook call (all gradients ready) to backward's
# end.
HAND_MADE_STEPS = {
    (0, 3): ((2.0, 6.0), [(3.0, 4.5), (5.0, 6.0)]),                    # 1.5 s of 2.5 hidden: 0.6
    (1, 3): ((2.0, 5.0), [(2.5, 4.8), (3.0, 5.0)]),                    # buckets overlap: 0.5 of 2.5
    (0, 4): ((9.0, 13.0), [(9.5, 12.5), (12.0, 13.0)]),                # 2.5 of 3.5
    (1, 4): ((9.0, 13.5), [(9.2, 10.2), (11.0, 11.4), (12.0, 13.5)]),  # three buckets: 1.4 of 2.9
    (0, 5): ((16.0, 19.0), []),                                        # no_sync: no all-reduce
    (1, 5): ((16.0, 19.5), []),
}


def _hand_made_timeline() -> Timeline:
    spans = []
    for (rank, step), ((start, end), buckets) in HAND_MADE_STEPS.items():
        spans += [Span(rank, step, "data", start - 1.5, start - 1.0),
                  Span(rank, step, "forward", start - 1.0, start),
                  Span(rank, step, "backward", start, end),
                  Span(rank, step, "optimizer", end, end + 0.5)]
        spans += [Span(rank, step, "allreduce", a, b, lane="comm", bucket=index, nbytes=4096)
                  for index, (a, b) in enumerate(buckets)]
        if buckets:
            spans.append(Span(rank, step, "wait", buckets[-1][0], end))
    return Timeline(spans=spans, world_size=2, backend="gloo", steps=[3, 4, 5])


def _record_a_timeline_on_rank():
    """A hand-written DDP loop with two buckets; its steps 2 (synchronised) and 3 (no_sync)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(seed=0, hidden=1024), bucket_cap_mb=0.01)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    X, y = torch.randn(512, 16), torch.randint(0, 4, (512,))
    recorder = TimelineRecorder(model, steps=2, skip=2)
    for step in range(4):
        recorder.start()
        recorder.lap("data")
        with model.no_sync() if step == 3 else torch.enable_grad():
            loss = F.cross_entropy(model(X), y)
            recorder.lap("forward")
            loss.backward()
        recorder.lap("backward")
        optimizer.step()
        optimizer.zero_grad()
        recorder.lap("optimizer")
    return recorder.finish()


@functools.lru_cache(maxsize=1)
def _recorded_timeline() -> Timeline:
    """One real timeline of 2 gloo ranks, recorded once per process."""
    return run_on_ranks(_record_a_timeline_on_rank, what="recording a timeline for the check",
                        timeout=LAUNCH_TIMEOUT_S, hang_hint="the recording hung: run the check "
                        "again (it uses no code of yours)")[0]


@grader("hidden share of the all-reduce")
def check_hidden_share(hidden_share):
    # The hand-made steps name each mistake first; then a real recording, its times as they came.
    _check_every_step(hidden_share, _hand_made_timeline(), "a hand-made timeline")
    _check_every_step(hidden_share, _recorded_timeline(), "a timeline recorded on 2 ranks")


def _check_every_step(hidden_share, timeline, where):
    for rank in range(timeline.world_size):
        for step in timeline.steps:
            _check_one_step(hidden_share, timeline, rank, step, where)


def _check_one_step(hidden_share, timeline, rank, step, where):
    call = f"hidden_share(timeline, rank={rank}, step={step}) on {where}"
    expected = overlap_fraction(timeline, rank, step)
    if expected is None:  # a step under no_sync
        try:
            got = hidden_share(timeline, rank, step)
        except NotImplementedError:
            raise
        except Exception as error:
            got = f"{type(error).__name__}: {error}"
        expect(got is None, call + " (a step with no all-reduce)", "None", str(got)[:120],
               f"step {step} ran under no_sync: it has no all-reduce, so no share to give "
               "(the exercise asks for None)")
        return
    got = hidden_share(timeline, rank, step)
    try:
        value = float(got)
    except (TypeError, ValueError, RuntimeError):
        raise GradingError(call, f"a share between 0 and 1 ({expected:.3f})", repr(got)[:120],
                           "the share is a number between 0 and 1") from None
    expect(abs(value - expected) <= SHARE_TOLERANCE, call,
           f"{expected:.3f} (within {SHARE_TOLERANCE})", f"{value:.3f}",
           _share_hint(value, timeline, rank, step))


def _share_hint(value, timeline, rank, step) -> str:
    """Which plausible mistake gives `value` here, and what to do instead."""
    allreduces = [(s.start, s.end) for s in timeline.select(rank, step, "allreduce")]
    [backward] = timeline.select(rank, step, "backward")
    [wait] = timeline.select(rank, step, "wait")
    merged = merge_intervals(allreduces)
    total = sum(end - start for start, end in merged)
    hidden = seconds_within(merged, backward.start, wait.start)
    other_rank = (rank + 1) % timeline.world_size
    mistakes = [
        (1 - hidden / total, "that is the share left exposed, after backward stopped computing, "
                             "not the share hidden under it"),
        (100 * hidden / total, "return a share between 0 and 1, not a percentage"),
        (hidden, "that is the hidden time in seconds, not its share of the all-reduce time"),
        (seconds_within(merged, backward.start, backward.end) / total,
         "the wait at the end of backward hides nothing: backward computes only from "
         "backward.start until wait.start"),
        (sum(seconds_within([span], backward.start, wait.start) for span in allreduces)
         / sum(end - start for start, end in allreduces),
         "time during which two buckets all-reduced at once is counted twice there: it is "
         "all-reduce time once"),
        (hidden / (backward.end - backward.start),
         "that is a share of backward's time, not of the all-reduce time"),
        (overlap_fraction(timeline, other_rank, step),
         f"that is rank {other_rank}'s share at step {step}, not rank {rank}'s"),
    ]
    for wrong, hint in mistakes:
        if wrong is not None and abs(value - wrong) <= SHARE_TOLERANCE:
            return hint
    return (f"at step {step} on rank {rank} the all-reduce ran {total:.3f} s (at least one "
            f"bucket all-reducing) and {hidden:.3f} s of it before wait.start: compare your "
            "two figures with these")


def seconds_within(intervals, low, high) -> float:
    return sum(max(0.0, min(end, high) - max(start, low)) for start, end in intervals)
