"""Lesson 04, exercise 4: how much of the all-reduce did backward() hide?

- hidden share: for every rank and step, the share of the step's all-reduce time (the bucket
  spans merged, so time two buckets share counts once) that falls between backward.start and
  wait.start, within SHARE_TOLERANCE of course_lib.topics.timeline.overlap_fraction; None for a
  step with no all-reduce (under no_sync). Graded on hand-made timelines (buckets one after
  another, overlapping, three of them, a step under no_sync), which name each mistake first, and
  on one the grader records on 2 ranks, its times as they came.

Where learner code runs (boundary.py): the learner's function is called on every step of a
timeline inside a crossing, which returns what each call gave (a number, None, an error) as plain
data, and the recorded timeline's spans with it (recorded there, before the learner's function
sees it); the shares to compare with are computed here. The hand-made steps' times are warped at
grading time by a monotone map drawn from grading_seed (none in a notebook), which keeps every
step's shape (which spans overlap, which end together) and changes its shares.
"""
import dataclasses
import functools
import random
import traceback

import torch
import torch.nn.functional as F

from ..engine import GradingError, expect, grader
from ..engine.boundary import crossing, grading_seed
from ..engine.ranks import run_on_ranks, without_grader_frames
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


def _warp(seed: int):
    """A monotone piecewise-linear map of time, its slope between 0.6 and 1.6 on every half
    second, drawn from `seed`; the identity for seed 0 (the lesson's own timeline)."""
    if seed == 0:
        return lambda t: t
    draw = random.Random(seed)
    knots = [0.5 * i for i in range(1, 45)]  # up to 22 s: past every hand-made time
    slopes = [draw.uniform(0.6, 1.6) for _ in knots]

    def warp(t):
        total, previous = 0.0, 0.0
        for knot, slope in zip(knots, slopes):
            total += slope * max(0.0, min(t, knot) - previous)
            previous = knot
        return total

    return warp


def _hand_made_timeline(seed: int = 0) -> Timeline:
    """HAND_MADE_STEPS as a timeline, its times warped by _warp(seed)."""
    spans = []
    for (rank, step), ((start, end), buckets) in _warped_steps(_warp(seed)).items():
        spans += [Span(rank, step, "data", start - 1.5, start - 1.0),
                  Span(rank, step, "forward", start - 1.0, start),
                  Span(rank, step, "backward", start, end),
                  Span(rank, step, "optimizer", end, end + 0.5)]
        spans += [Span(rank, step, "allreduce", a, b, lane="comm", bucket=index, nbytes=4096)
                  for index, (a, b) in enumerate(buckets)]
        if buckets:
            spans.append(Span(rank, step, "wait", buckets[-1][0], end))
    return Timeline(spans=spans, world_size=2, backend="gloo", steps=[3, 4, 5])


def _warped_steps(warp) -> dict:
    """HAND_MADE_STEPS with every time t as warp(t); the data, forward and optimizer spans around
    backward are laid out from the warped times (1.5 s and 1 s before it, 0.5 s after)."""
    return {key: ((warp(start), warp(end)), [(warp(a), warp(b)) for a, b in buckets])
            for key, ((start, end), buckets) in HAND_MADE_STEPS.items()}


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
    """One real timeline of 2 gloo ranks, recorded once per process (the course's code only)."""
    return run_on_ranks(_record_a_timeline_on_rank, what="recording a timeline for the check",
                        timeout=LAUNCH_TIMEOUT_S, learner=False, hang_hint="the recording hung: "
                        "run the check again (it uses no code of yours)")[0]


@grader("hidden share of the all-reduce")
def check_hidden_share(hidden_share):
    # The hand-made steps name each mistake first; then a real recording, its times as they came.
    seed = grading_seed(0)
    answers = crossing("hidden_share on a hand-made timeline",
                       lambda: _answers(hidden_share, _hand_made_timeline(seed)))
    _check_every_step(answers, _hand_made_timeline(seed), "a hand-made timeline")
    recorded = crossing("hidden_share on a timeline recorded on 2 ranks",
                        lambda: _answers_on_a_recording(hidden_share))
    timeline = Timeline(**{**recorded["timeline"],
                           "spans": [Span(**span) for span in recorded["timeline"]["spans"]]})
    _check_every_step(recorded["answers"], timeline, "a timeline recorded on 2 ranks")


def _answers_on_a_recording(hidden_share) -> dict:
    """Beside the learner's code: a real timeline as plain data, and the learner's answers on it."""
    timeline = _recorded_timeline()
    return {"timeline": dataclasses.asdict(timeline), "answers": _answers(hidden_share, timeline)}


def _answers(hidden_share, timeline) -> list:
    """Beside the learner's code: what hidden_share gave for every rank and step, in order."""
    return [_answer(hidden_share, timeline, rank, step)
            for rank in range(timeline.world_size) for step in timeline.steps]


def _answer(hidden_share, timeline, rank, step) -> dict:
    """One call's outcome as plain data: its value as a float (None when it is no number), whether
    it was None, its text; or the error it raised (a stub's NotImplementedError goes through)."""
    try:
        got = hidden_share(timeline, rank, step)
    except NotImplementedError:
        raise
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}", "traceback": without_grader_frames(
            "".join(traceback.format_exception(error)))}
    try:
        value = float(got)
    except (TypeError, ValueError, RuntimeError):
        value = None
    return {"error": None, "none": got is None, "value": value, "text": str(got)[:120],
            "repr": repr(got)[:120]}


def _check_every_step(answers, timeline, where):
    steps = [(rank, step) for rank in range(timeline.world_size) for step in timeline.steps]
    expect(isinstance(answers, list) and len(answers) == len(steps), f"hidden_share on {where}",
           f"an answer for each of {len(steps)} steps", "another number of answers")
    for (rank, step), answer in zip(steps, answers):
        _check_one_step(answer, timeline, rank, step, where)


def _check_one_step(answer, timeline, rank, step, where):
    call = f"hidden_share(timeline, rank={rank}, step={step}) on {where}"
    expected = overlap_fraction(timeline, rank, step)
    if expected is None:  # a step under no_sync
        got = answer["error"] or (None if answer["none"] else answer["text"])
        expect(got is None, call + " (a step with no all-reduce)", "None", str(got)[:120],
               f"step {step} ran under no_sync: it has no all-reduce, so no share to give "
               "(the exercise asks for None)")
        return
    if answer["error"]:
        raise GradingError(call, "a result", answer["error"][:300], "", "your function's "
                           f"traceback (the grader's frames left out):\n{answer['traceback']}")
    value = answer["value"]
    if value is None:
        raise GradingError(call, f"a share between 0 and 1 ({expected:.3f})", answer["repr"],
                           "the share is a number between 0 and 1")
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
