"""Lesson 18's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
from course_lib.checks import lesson18
from course_lib.topics.from_scratch import pipeline as course_pipeline, pipeline_schedules

from . import answer, wrong_answer


# -- 1F1B ------------------------------------------------------------------------------------------
def one_f_one_b_backwards_first(stage, stages, microbatches):
    """torch's way of counting: p - s forwards, then a backward and a forward in turn."""
    warmup = min(stages - stage, microbatches)
    order, forward, backward = [("F", i) for i in range(warmup)], warmup, 0
    while backward < microbatches:
        order.append(("B", backward))
        backward += 1
        if forward < microbatches:
            order.append(("F", forward))
            forward += 1
    return order


def one_f_one_b_by_counters(stage, stages, microbatches):
    """Forward whenever fewer than p - s are in flight, else backward."""
    order, forward, backward = [], 0, 0
    while backward < microbatches:
        if forward < microbatches and forward - backward < stages - stage:
            order.append(("F", forward))
            forward += 1
        else:
            order.append(("B", backward))
            backward += 1
    return order


def gpipe(stage, stages, microbatches):
    return [("F", i) for i in range(microbatches)] + [("B", i) for i in range(microbatches)]


def warmup_one_too_many(stage, stages, microbatches):
    warmup = min(stages - stage, microbatches)
    order = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(microbatches - warmup, microbatches)]


def warmup_from_the_wrong_end(stage, stages, microbatches):
    return one_f_one_b_by_counters(stages - 1 - stage, stages, microbatches)


def no_warmup(stage, stages, microbatches):
    return [action for i in range(microbatches) for action in (("F", i), ("B", i))]


def cooldown_backwards_reversed(stage, stages, microbatches):
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in reversed(range(microbatches - warmup, microbatches))]


def warmup_without_the_min(stage, stages, microbatches):
    """Right while microbatches >= stages; asks for micro-batches that do not exist otherwise."""
    warmup = stages - stage - 1
    order = [("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(max(microbatches - warmup, 0), microbatches)]


def two_stages_only(stage, stages, microbatches):
    """Written for the notebook's 2 stages: stage 0 warms up with one forward, the last with none."""
    warmup = 1 if stage == 0 else 0
    order = [("F", i) for i in range(min(warmup, microbatches))]
    for i in range(microbatches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(microbatches - warmup, microbatches)]


def microbatches_from_one(stage, stages, microbatches):
    """Micro-batches numbered 1..m, as a learner counts them."""
    return [(kind, i + 1) for kind, i in one_f_one_b_by_counters(stage, stages, microbatches)]


def one_f_one_b_on_the_last_stage_only(stage, stages, microbatches):
    """1F1B where the loss is (the last stage), GPipe on the others: they hold every micro-batch."""
    if stage == stages - 1:
        return one_f_one_b_by_counters(stage, stages, microbatches)
    return gpipe(stage, stages, microbatches)


def the_courses_own(stage, stages, microbatches):
    return pipeline_schedules.one_f_one_b(stage, stages, microbatches)


# -- idle share --------------------------------------------------------------------------------------
def idle_share_by_rank_window(records):
    """Each rank's own first start to last end: misses the fill and drain outside it."""
    shares = {}
    for rank in sorted({r.rank for r in records}):
        mine = [r for r in records if r.rank == rank]
        step = max(r.ended for r in mine) - min(r.started for r in mine)
        shares[rank] = 1 - sum(r.ended - r.computing for r in mine) / step
    return shares


def idle_share_waits_only(records):
    """Only the time in recv: misses a rank's idle time before its first and after its last action."""
    step = max(r.ended for r in records) - min(r.started for r in records)
    shares = {}
    for r in records:
        shares[r.rank] = shares.get(r.rank, 0.0) + (r.computing - r.started) / step
    return shares


def idle_share_from_the_formula(records):
    stages = 1 + max(r.rank for r in records)
    m = sum(1 for r in records if r.rank == 0 and r.action == "F")
    return {rank: (stages - 1) / (m + stages - 1) for rank in range(stages)}


def busy_share(records):
    step = max(r.ended for r in records) - min(r.started for r in records)
    busy = {}
    for r in records:
        busy[r.rank] = busy.get(r.rank, 0.0) + (r.ended - r.computing) / step
    return busy


def idle_share_counting_waits_as_work(records):
    step = max(r.ended for r in records) - min(r.started for r in records)
    busy = {}
    for r in records:
        busy[r.rank] = busy.get(r.rank, 0.0) + r.ended - r.started
    return {rank: 1 - seconds / step for rank, seconds in busy.items()}


def idle_share_from_the_first_compute(records):
    """The step measured from the first computation, not the first start: a rank's wait before
    stage 0 computes is left out."""
    start, end = min(r.computing for r in records), max(r.ended for r in records)
    return {rank: (end - start - sum(r.ended - r.computing for r in records if r.rank == rank)) / (end - start)
            for rank in {r.rank for r in records}}


def idle_share_for_two_ranks(records):
    """Ranks 0 and 1 written in: the notebook's 2 stages."""
    start, end = min(r.started for r in records), max(r.ended for r in records)
    return {rank: (end - start - sum(r.ended - r.computing for r in records if r.rank == rank)) / (end - start)
            for rank in (0, 1)}


def idle_share_course(records):
    return course_pipeline.idle_shares(records)


def idle_share_with_intervals(records):
    """The same through sorted intervals per rank."""
    start, end = min(r.started for r in records), max(r.ended for r in records)
    shares = {}
    for rank in {r.rank for r in records}:
        spans = sorted((r.computing, r.ended) for r in records if r.rank == rank)
        shares[rank] = (end - start - sum(b - a for a, b in spans)) / (end - start)
    return shares


def idle_share_per_rank_totals(records):
    """Totals per rank first, with collections.defaultdict, then one division each."""
    from collections import defaultdict

    computing = defaultdict(float)
    for r in records:
        computing[r.rank] += r.ended - r.computing
    first, last = min(r.started for r in records), max(r.ended for r in records)
    return {rank: (last - first - seconds) / (last - first) for rank, seconds in computing.items()}


def _records():
    """One measured-looking step: GPipe on 2 stages, 3 micro-batches, from play, in seconds."""
    from course_lib.topics.from_scratch.pipeline import Record

    played = pipeline_schedules.play([pipeline_schedules.gpipe(s, 2, 3) for s in range(2)])
    records = []
    for s, slots in enumerate(played.slots):
        clock, seconds = 5.0, (0.010, 0.012)[s]  # a unit of time on each stage: stage 1 is slower
        for kind, i, start, end in slots:
            records.append(Record(s, kind, i, clock, 5 + start * seconds, 5 + end * seconds))
            clock = 5 + end * seconds
    return records


RECORDS = _records()

ALTERNATIVES = {
    lesson18.check_one_f_one_b: [
        answer("torch's counting: p - s forwards, then backward and forward in turn", one_f_one_b_backwards_first),
        answer("forward while fewer than p - s are in flight, else backward", one_f_one_b_by_counters),
    ],
    lesson18.check_idle_share: [
        answer("sorted intervals per rank", idle_share_with_intervals, RECORDS),
        answer("totals per rank in a defaultdict", idle_share_per_rank_totals, RECORDS),
    ],
}

WRONG_ANSWERS = {
    lesson18.check_one_f_one_b: [
        wrong_answer("GPipe's order (holds every micro-batch)", gpipe),
        wrong_answer("one warm-up forward too many (p - s)", warmup_one_too_many),
        wrong_answer("the warm-up counted from the wrong end (hangs)", warmup_from_the_wrong_end),
        wrong_answer("no warm-up: a forward and its backward in turn (a longer step)", no_warmup),
        wrong_answer("the cool-down's backwards in reverse (micro-batches mixed up)", cooldown_backwards_reversed),
        wrong_answer("no min(): more warm-up forwards than micro-batches", warmup_without_the_min),
        wrong_answer("written for 2 stages only", two_stages_only),
        wrong_answer("the course's one_f_one_b", the_courses_own),
        wrong_answer("micro-batches numbered from 1", microbatches_from_one),
        wrong_answer("1F1B on the last stage only, GPipe before it", one_f_one_b_on_the_last_stage_only),
    ],
    lesson18.check_idle_share: [
        wrong_answer("each rank's own window", idle_share_by_rank_window, RECORDS),
        wrong_answer("only the waits in recv", idle_share_waits_only, RECORDS),
        wrong_answer("the model's formula in place of the measurement", idle_share_from_the_formula, RECORDS),
        wrong_answer("the busy share", busy_share, RECORDS),
        wrong_answer("waits in recv counted as computing", idle_share_counting_waits_as_work, RECORDS),
        wrong_answer("the course's own idle_shares", idle_share_course, RECORDS),
        wrong_answer("the step from the first computation, not the first start",
                     idle_share_from_the_first_compute, RECORDS),
        wrong_answer("ranks 0 and 1 written in", idle_share_for_two_ranks, RECORDS),
        wrong_answer("numbers typed in place of records", idle_share_with_intervals, [[0, "F", 0, 0.0, 0.0, 1.0]]),
    ],
}
