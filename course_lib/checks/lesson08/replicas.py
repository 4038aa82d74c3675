"""Lesson 08's replica health check: the learner's replica_health_check(model, loss) on 2 and 3
gloo ranks, every CHECK_EVERY steps of a short training run whose replicas should stay equal,
with faults injected at a step and on a rank drawn at grading time: a weight changed in place on
one rank (two values swapped, a sign flipped, a small nudge) and a NaN in one rank's batch.

Every rank must say the same thing at every check: "ok" until the fault, then "diverged" or
"non-finite" at the first check that can see it. A rank that raises alone, or the only rank that
knows (rank 0 comparing for everyone), would leave the others waiting in their next collective.
Each rank runs every step whatever its answers, so the ranks' collectives stay paired.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..engine import expect, grader
from ..engine.boundary import grading_seed
from ..engine.call_watch import calls_of
from ..engine.learner_call import library_call_hint
from ..engine.ranks import run_on_ranks
from ...topics import pitfalls

WORLD_SIZES = (2, 3)
STEPS, CHECK_EVERY = 9, 3          # checks after the forward of steps 2, 5 and 8
CHECK_STEPS = [step for step in range(STEPS) if step % CHECK_EVERY == CHECK_EVERY - 1]
DRIFTS = ("two values swapped", "a sign flipped", "a value nudged by 1e-4")
LAUNCH_TIMEOUT_S = 30


def faults(world_size, seed):
    """{scenario: (kind, rank, step)}: the faults of one grading, drawn from its seed."""
    rank = 1 + seed % (world_size - 1)     # never rank 0: it must not be the only one to know
    plan = {"healthy": None}
    for index, drift in enumerate(DRIFTS):
        # made just before a check, so that no update blurs it: a swap must show as a swap
        plan[drift] = ("drift", rank, CHECK_STEPS[(seed + index) % len(CHECK_STEPS)] - 1)
    plan["a NaN in one rank's batch"] = ("nan", rank, (seed + 3) % 6)
    return plan


def first_check_seeing(fault):
    """The step of the first check that can see `fault`: a drift made after step s's update shows
    from step s + 1 on, a NaN in step s's batch at once (the loss) or after it (the weights)."""
    kind, _, step = fault
    return next(check for check in CHECK_STEPS if check >= step + (kind == "drift"))


def _drift(model, drift):
    weight = model[0].weight
    with torch.no_grad():  # outside autograd, on one rank: nothing tells the others
        if drift == DRIFTS[0]:
            weight[0, 0], weight[1, 1] = weight[1, 1].clone(), weight[0, 0].clone()
        elif drift == DRIFTS[1]:
            weight[2, 3] = -weight[2, 3]
        else:
            weight[1, 2] += 1e-4


def train_with_checks_on_rank(replica_health_check, plan, seed):
    """Inside a rank: each scenario's run, {scenario: {check step: what the check returned}}."""
    rank, answers = dist.get_rank(), {}
    for scenario, fault in plan.items():
        torch.manual_seed(seed)   # the same replica on every rank, the same batches: as after
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # DDP's averaged gradients
        inputs, labels = torch.randn(STEPS, 8, 6), torch.randint(0, 3, (STEPS, 8))
        said = answers[scenario] = {}
        for step in range(STEPS):
            batch = inputs[step].clone()
            if fault and fault[0] == "nan" and (rank, step) == fault[1:]:
                batch[0, 0] = float("nan")
            loss = F.cross_entropy(model(batch), labels[step])
            if step in CHECK_STEPS:
                with calls_of(pitfalls.replica_health_check) as library_calls:
                    answer = replica_health_check(model, loss)
                said[step] = ("the course's own" if library_calls else answer
                              if isinstance(answer, str) else repr(answer)[:60])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if fault and fault[0] == "drift" and (rank, step) == fault[1:]:
                _drift(model, scenario)
    return answers


def _raised_alone(cause):
    return (f"rank {cause.rank} raised ({cause.summary[:100]}) while the other ranks went on: in "
            "training they would wait for it in their next collective, until the timeout. Let "
            "every rank learn the verdict (one collective) and return it on every rank")


@grader("replicas that agree, values that are finite")
def check_replica_health(replica_health_check):
    seed = grading_seed(0)
    for world_size in WORLD_SIZES:
        plan = faults(world_size, seed)
        answers = run_on_ranks(
            train_with_checks_on_rank, replica_health_check, plan, seed, nprocs=world_size,
            what=f"replica_health_check every {CHECK_EVERY} steps on {world_size} ranks",
            timeout=LAUNCH_TIMEOUT_S, crash_hint=_raised_alone,
            hang_hint="the ranks' checks did not call the same collectives: every rank must make "
                      "the same calls, whatever it found")
        for scenario, fault in plan.items():
            _expect_answers(answers, scenario, fault, world_size)


def _expect_answers(answers, scenario, fault, world_size):
    where = f"on {world_size} ranks, {scenario}" + (
        f" on rank {fault[1]} at step {fault[2]}" if fault else "")
    sees = first_check_seeing(fault) if fault else None
    expected = "non-finite" if fault and fault[0] == "nan" else "diverged"
    for step in CHECK_STEPS:
        said = [per_rank[scenario].get(step) for per_rank in answers]
        expect("the course's own" not in said, "replica_health_check", "your own check",
               "a call of pitfalls.replica_health_check",
               library_call_hint("replica_health_check", "exercise 5"))
        right = "ok" if sees is None or step < sees else expected
        if step == sees or right == "ok":
            _expect_same(said, right, step, where, fault)
        if step == sees:
            break


def _expect_same(said, right, step, where, fault):
    what = f"what each rank's check returned at step {step} {where}"
    if all(answer == right for answer in said):
        return
    knowing = [rank for rank, answer in enumerate(said) if answer == right]
    if right == "ok":
        hint = ("the replicas are equal and finite here: a check must not cry wolf (two ranks' "
                "fingerprints of equal weights are equal)")
    elif knowing:
        hint = (f"only ranks {knowing} know: the others would go on training, and wait for them in "
                "their next collective. Reduce the verdict so that every rank gets it")
    elif right == "diverged":
        hint = ("no rank saw the drift: compare the ranks' parameters with a collective, and make "
                "the fingerprint see a swap of two values and a flipped sign (a plain sum does not)")
    else:
        hint = (f"rank {fault[1]}'s loss or weights are not finite here: test torch.isfinite on "
                "the loss and the parameters, and reduce the flag with MAX")
    expect(False, what, f"{right!r} on every rank", str(said), hint)
