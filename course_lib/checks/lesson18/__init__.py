"""Graders for lesson 18, pipeline parallelism built from send and recv.

- 1F1B: your schedule gives each rank's order of forwards and backwards for four pipelines (2, 3 and
  4 stages; micro-batch counts from grading_seed, and 2 micro-batches on 4 stages). Played out here
  (topics/from_scratch/pipeline_schedules.play: a forward 1 unit, a backward 2): every action once,
  no rank waiting for a send that never comes (named rank by rank), micro-batches received in the
  order they are sent, at most p - s micro-batches held on stage s, and the step no longer than
  m + p - 1 slots. Then your orders run on 2 and 3 gloo ranks with the course's stages (only the
  course's code runs there): each stage's gradients equal one process's and those of torch's
  Schedule1F1B on the same stages.
- idle share: your function reads one step's records (every rank's) and returns each rank's idle
  share of the step; judged against the same computation here, on the records you measured and on
  records drawn at grading time with stages of unequal speed (where the formula is not the answer).
"""
import random

import torch

from ..engine import GradingError, expect, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import call_learner
from ..engine.ranks import run_on_ranks
from ...topics.from_scratch.pipeline import Record, idle_shares
from ...topics.from_scratch.pipeline_schedules import ScheduleError, one_f_one_b as course_one_f_one_b, play
from .ranks import gradients_on_rank, one_process

DATA_SEED, FORWARD, BACKWARD = 18, 1.0, 2.0
SCHEDULE_HINT = ("stage s runs p - s - 1 forwards first, then one forward and one backward in turn, "
                 "then the backwards left; play(orders) shows where an order goes wrong")


def _pipelines() -> list:
    """(stages, micro-batches) to judge: 2, 3 and 4 stages, and 4 stages with fewer micro-batches."""
    draw = random.Random(grading_seed(DATA_SEED))
    return [(2, draw.randint(3, 6)), (3, draw.randint(4, 7)), (4, draw.randint(6, 9)), (4, 2)]


def _orders_of(schedule, pipelines) -> dict:
    """{"p,m": [each stage's order as [kind, micro-batch] pairs, or its repr if it is not one]}."""
    def order(stage, stages, microbatches):
        given = schedule(stage, stages, microbatches)
        try:
            return [[str(kind), int(i)] for kind, i in given]
        except (TypeError, ValueError):
            return repr(given)[:200]
    return {f"{p},{m}": [order(s, p, m) for s in range(p)] for p, m in pipelines}


def _judge_on_paper(orders, p, m) -> None:
    what = f"one_f_one_b with {p} stages and {m} micro-batches"
    for s, order in enumerate(orders):
        expect(not isinstance(order, str), what, "a list of ('F', i) and ('B', i) pairs",
               f"rank {s}: {order}", "return a list such as [('F', 0), ('F', 1), ('B', 0), ...]")
    try:
        played = play([[tuple(a) for a in order] for order in orders], FORWARD, BACKWARD, m)
    except ScheduleError as error:
        raise GradingError(what, "orders that run on the ranks", str(error), SCHEDULE_HINT) from None
    for s, held in enumerate(played.most_held):
        bound = min(p - s, m)
        expect(held <= bound, what, f"rank {s} holding at most {bound} micro-batches at once "
               f"(1F1B's bound, p - s)", f"{held} held at once: {_shown(orders[s])}",
               "GPipe keeps every micro-batch's activations until its backwards; 1F1B starts "
               "backwards after p - s - 1 warm-up forwards, and frees one with each backward")
    slots = (m + p - 1) * (FORWARD + BACKWARD)
    expect(played.makespan <= slots, what, f"a step of {slots:g} time units (a forward 1, a backward 2: "
           f"m + p - 1 slots)", f"{played.makespan:g}: the ranks wait more than the bubble",
           "with too few warm-up forwards, later stages wait for work; " + SCHEDULE_HINT)


def _shown(order) -> str:
    text = " ".join(f"{kind}{i}" for kind, i in order[:12])
    return text + (" ..." if len(order) > 12 else "")


@grader("1F1B")
def check_one_f_one_b(one_f_one_b):
    pipelines = _pipelines()
    orders = call_learner(_orders_of, one_f_one_b, pipelines, what="one_f_one_b(stage, stages, microbatches)",
                          hint="it returns one rank's order: a list of ('F', i) and ('B', i)",
                          written_by_you=(course_one_f_one_b,))
    for p, m in pipelines:
        _judge_on_paper(orders[f"{p},{m}"], p, m)
    seed = grading_seed(DATA_SEED)
    for p, m in pipelines[:2]:
        results = run_on_ranks(gradients_on_rank, orders[f"{p},{m}"], m, seed, nprocs=p, learner=False,
                               what=f"your 1F1B orders on {p} ranks",
                               hang_hint="the orders were played out without a hang: tell the course")
        expected = one_process(p, m, seed)
        for rank, result in enumerate(results):
            for name, got in (("your orders", result["ours"]), ("torch's Schedule1F1B", result["torch"])):
                for got_grad, want, part in zip(got, expected[rank], ("weight", "bias")):
                    expect(torch.allclose(got_grad, want, rtol=1e-4, atol=1e-6),
                           f"stage {rank}'s {part} gradient after {name} ({p} ranks, {m} micro-batches)",
                           "one process's gradient of the whole batch", f"a difference of "
                           f"{(got_grad - want).abs().max().item():.3g}", SCHEDULE_HINT)


def _drawn_records(seed: int) -> list:
    """One step of 1F1B on 3 stages whose speeds differ (drawn), as a Stage would record it; every
    rank's step starts a moment (drawn) before stage 0 computes: the step is not its first compute."""
    draw = random.Random(seed)
    speeds = [draw.uniform(0.5, 2.0) for _ in range(3)]
    lead = draw.uniform(0.05, 0.5)
    played = play([course_one_f_one_b(s, 3, 5) for s in range(3)], FORWARD, BACKWARD)
    records = []
    for s, slots in enumerate(played.slots):
        clock = 100.0 - lead  # the step starts; each action starts when the one before ended
        for kind, i, start, end in slots:
            start, end = 100 + start * speeds[s], 100 + end * speeds[s]
            records.append(Record(s, kind, i, clock, start, end))
            clock = end
    return records


@grader("idle share")
def check_idle_share(idle_share, records):
    what = "idle_share(records)"
    expect(isinstance(records, list) and records and all(isinstance(r, Record) for r in records), what,
           "the records of one step, as measure_steps returned them", f"{type(records).__name__}",
           "pass one step's records: measured[m][k], the k-th step with m micro-batches")
    for name, step in (("your measured step", records), ("a step drawn at grading time", _drawn_records(
            grading_seed(DATA_SEED)))):
        got = call_learner(idle_share, step, what=what, hint="it returns {rank: idle share}",
                           written_by_you=(idle_shares,))
        expected = idle_shares(step)
        try:
            ok = sorted(got) == sorted(expected) and all(abs(float(got[k]) - v) <= 1e-6 for k, v in expected.items())
        except (TypeError, ValueError, KeyError):
            ok = False
        expect(ok, f"{what} on {name}", "{rank: share}: " + ", ".join(f"{k}: {v:.3f}" for k, v in expected.items()),
               repr(got)[:200], "a rank is idle from the step's first start to its last end (over every "
               "rank) except while it computes: from `computing` to `ended` of each of its records; the "
               "formula (p - 1) / (m + p - 1) is a model, and these stages do not take equal times")
