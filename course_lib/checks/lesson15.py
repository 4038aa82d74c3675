"""Graders for lesson 15, DDP built from hooks: one all-reduce per gradient as it is ready, then
buckets. The DDP graders run your class on 2 and on 3 gloo ranks (checks.engine.gradient_sync)
with a model that has a tied weight, a frozen layer and a buffer, each rank starting from its own
random weights.

- DDP with overlap: after construction every rank holds rank 0's parameters and buffers; in every
  step each gradient that needs one is all-reduced exactly once (the tied weight once, the frozen
  layer never); every all-reduce but the last gradient's starts before backward() has computed the
  last gradient, and does not block it (while the last rank is held back, the others compute on);
  backward() returns only when every all-reduce is done (your finish_gradient_sync, which autograd
  runs at its end; done as a wait on its handle or on its Future sees it), and it forgets them:
  nothing of a step's all-reduces is still held at the end of the next step; the weights after each step equal one process's on the global batch, and
  torch's DDP's on the same shards. The class is the learner's own: one built on the course's
  DDPFromScratch does not count.
- the bucket plan: the parameters that need a gradient, each once, from the last registered to
  the first, a new bucket whenever the next gradient would take the current one past
  bucket_cap_mb MiB (2**20 bytes; a gradient's bytes are its elements times their size: one
  case is bfloat16); a bucket may fill the cap exactly; a gradient larger than the cap gets a
  bucket of its own. The plan is the learner's own: a call of the course's
  assign_buckets does not count.
- DDP with buckets: the same rules, with one all-reduce per bucket of the plan, in the plan's
  order, each started when its last gradient is ready; on 3 ranks the hidden layers run in
  another order than registered, so a bucket's gradients do not arrive in the plan's order.

Each run of the learner's code is a crossing (engine/boundary.py): the ranks return what they saw
(gradient_sync.train_on_rank), the plan crosses as parameter names, and every comparison is made
here. The global batches, and one more plan case, come from boundary.grading_seed.
"""
from collections import Counter

import torch

from .engine import GradingError, expect, grader
from .engine.boundary import grading_seed
from .engine.gradient_sync import (DATA_SEED, DELAYED_STEP, TiedNet, close, one_process,
                                   parameter_sizes, state_vector, train_on_rank)
from .engine.learner_call import call_learner, library_call_hint
from .engine.ranks import run_on_ranks
from ..topics.from_scratch.buckets import assign_buckets
from ..topics.from_scratch.ddp import DDPFromScratch

LAUNCH_TIMEOUT_S = 90
WORLD_SIZES = (2, 3)
BUCKET_CAPS_MB = {2: 0.001, 3: 0.003}  # per world size: many small buckets, then two
USED_ORDER = {3: (1, 0, 2)}  # on 3 ranks the forward runs hidden layer 1 first: gradients come out
# of the plan's order, and only a bucket that counts its gradients launches when all are in
SAME_COLLECTIVES = ("every rank must start the same all-reduces in the same order, with tensors of "
                    "the same shape: a rank that waits for a gradient that never comes (one that "
                    "needs no gradient) hangs the others")
TIED = "embed.weight (the tied weight: embed and head hold the same tensor)"
OUT_OF_ORDER = ("here the hidden layers run in another order than they are registered (1, 0, 2), so "
                "a bucket's gradients are not ready in the plan's order: launch a bucket when all of "
                "its gradients are in (count them), not when a given one of them arrives")


def _run(ddp_class, ddp_kwargs, world_size, what, data_seed, used_order=None):
    """What each rank saw (gradient_sync.train_on_rank: events, counts, weights; plain data): the
    grader's functions below compare it, here, with one process and with what the rules expect."""
    results = run_on_ranks(train_on_rank, ddp_class, ddp_kwargs, nprocs=world_size, what=what,
                           timeout=LAUNCH_TIMEOUT_S, hang_hint=SAME_COLLECTIVES,
                           **({"crash_hint": OUT_OF_ORDER} if used_order else {}),
                           written_by_you=(DDPFromScratch.__init__,), data_seed=data_seed,
                           used_order=used_order)
    called = results[0].get("library_calls")
    expect(not called, what, "your own class", "a class built on course_lib.topics.from_scratch's "
           "DDPFromScratch", library_call_hint("DDPFromScratch", "this exercise"))
    return results


# -- the verdicts both DDP graders share ------------------------------------------------------------
def _judge_broadcast(results, what):
    rank0 = state_vector(TiedNet(seed=0))
    parameters = sum(p.numel() for p in TiedNet(seed=0).parameters())
    for rank, result in enumerate(results):
        got = result["after_construction"]
        if torch.equal(got, rank0):
            continue
        part = "parameters" if not torch.equal(got[:parameters], rank0[:parameters]) else "buffers"
        hint = ("every rank must start from rank 0's parameters (frozen ones too) and buffers"
                if rank else "rank 0 must keep its own: it is the source")
        raise GradingError(f"{what}: rank {rank}'s model right after construction",
                           "rank 0's initial parameters and buffers", f"other {part}", hint)


def _judge_sizes(results, expected, what, ordered):
    """Each step's all-reduces: `expected` element counts (in order, or as a multiset)."""
    names = {numel: name for name, numel in parameter_sizes()}
    for rank, result in enumerate(results):
        for step, events in enumerate(result["steps"]):
            got = [e[1] for e in events if e[0] == "allreduce"]
            if (got == expected) if ordered else (Counter(got) == Counter(expected)):
                continue
            where = f"{what}: the all-reduces of rank {rank} at step {step}"
            extra = Counter(got) - Counter(expected)
            if not ordered and extra:
                numel = next(iter(extra))
                hint = (f"{TIED} was all-reduced {got.count(numel)} times in one step: once per "
                        f"gradient, however many modules hold the tensor"
                        if names.get(numel) == "embed.weight" else
                        f"{got.count(numel)} all-reduces of {numel} elements where "
                        f"{expected.count(numel)} were expected: each gradient once, and nothing "
                        f"for a parameter that needs no gradient (the frozen layer)")
            elif step > 0:  # step 0 passed this very check on this rank
                hint = (f"step 0 was right and step {step} is not: something your class counted "
                        f"during step 0 was not reset for the next step (how many gradients each "
                        f"bucket still waits for)" if ordered else
                        f"step 0 was right and step {step} is not: something your class kept "
                        f"from step 0 was not reset for the next step")
            elif ordered and sorted(got) == sorted(expected):
                hint = "the right buckets, in another order: the last layers' gradients come first"
            else:
                hint = ("one all-reduce per bucket of your plan: walk the gradients from the last "
                        "registered parameter to the first" if ordered else
                        "one all-reduce per parameter that needs a gradient, each tensor once")
            raise GradingError(where, f"{len(expected)} all-reduces of {expected} elements",
                               f"{len(got)}: {got}", hint)


def _judge_overlap(results, what, launches):
    """All but the last of `launches` all-reduces start before the last gradient is ready, and a
    rank computes on while one is in flight (the last rank holds back one step's first)."""
    for rank, result in enumerate(results):
        for step, events in enumerate(result["steps"]):
            last_ready = max(i for i, e in enumerate(events) if e[0] == "ready")
            early = sum(e[0] == "allreduce" for e in events[:last_ready])
            expect(early >= launches - 1, f"{what}: rank {rank} at step {step}",
                   f"at least {launches - 1} of its {launches} all-reduces started while "
                   f"backward() still computed gradients",
                   f"{early} started before the last gradient was ready",
                   "start an all-reduce from inside backward(), the moment what it sends is "
                   "ready, not after backward() returns")
            if rank == len(results) - 1 or step != DELAYED_STEP or launches < 2:
                continue
            first = next(i for i, e in enumerate(events) if e[0] == "allreduce")
            next_ready = next((e for e in events[first:] if e[0] == "ready"), None)
            expect(next_ready is not None and next_ready[3] > 0, f"{what}: rank {rank} at step {step}",
                   "backward() computing the next gradient while the first all-reduce is in flight",
                   "the next gradient was computed only after that all-reduce had finished",
                   "start the all-reduce without waiting for it (async_op=True); wait for it later")


def _judge_sync(results, what):
    for rank, result in enumerate(results):
        for step, events in enumerate(result["steps"]):
            in_flight = next(e[2] for e in events if e[0] == "returned")
            expect(in_flight == 0, f"{what}: rank {rank} at step {step}",
                   "every all-reduce finished when backward() returns (your "
                   "finish_gradient_sync, queued at its end)",
                   f"{in_flight} still in flight",
                   "the wait must run at the end of backward(): keep the given "
                   "self.queue_finish() call at the top of gradient_ready, and let "
                   "finish_gradient_sync() wait for every handle")


def _judge_forgotten(results, what):
    """Nothing of a step's all-reduces (handles, tensors sent) is still held a step later."""
    for rank, result in enumerate(results):
        for step, held in enumerate(result["left_behind"], start=1):
            expect(held == 0, f"{what}: rank {rank} at the end of step {step}",
                   f"nothing left of step {step - 1}'s all-reduces: finish_gradient_sync() "
                   f"forgets what it has waited for",
                   f"{held} of them still held (their handles, or the tensors they sent)",
                   "what a step keeps after its wait piles up: one more handle per gradient or "
                   "bucket every step, each holding its tensors, for the whole run")


def _judge_weights(results, oracle, what):
    for step, expected in enumerate(oracle):
        for rank, result in enumerate(results):
            expect(close(result["torch_ddp"][step], expected), f"torch's DDP on rank {rank}",
                   "the one-process weights", "other weights", "please report this machine")
            got = result["weights"][step]
            if close(got, expected):
                continue
            before = oracle[step - 1] if step else _initial_weights()
            ratio = float((got - before).norm() / (expected - before).norm())
            hint = ("the ranks' weights differ: each rank stepped on its own gradient"
                    if not close(results[0]["weights"][step], results[-1]["weights"][step]) else
                    f"every rank agrees, on an update {ratio:.2f} times one process's: the gradient "
                    f"must be the mean over the {len(results)} ranks")
            raise GradingError(f"{what}: rank {rank}'s weights after step {step}",
                               "one process's weights on the global batch (and torch's DDP's)",
                               "other weights", hint)


def _initial_weights():
    from torch.nn.utils import parameters_to_vector
    return parameters_to_vector(TiedNet(seed=0).parameters()).detach()


def _judge(ddp_class, ddp_kwargs, world_size, expected_sizes, ordered, what, used_order=None):
    data_seed = grading_seed(DATA_SEED)  # the batches; the model (TiedNet, rank r's seed r) is fixed
    oracle = one_process(data_seed=data_seed, used_order=used_order)  # first: the ranks then fork
    results = _run(ddp_class, ddp_kwargs, world_size, what, data_seed, used_order)
    _judge_broadcast(results, what)
    _judge_sizes(results, expected_sizes, what, ordered)
    _judge_overlap(results, what, len(expected_sizes))
    _judge_sync(results, what)
    _judge_forgotten(results, what)
    _judge_weights(results, oracle, what)


# -- exercise 1: one all-reduce per gradient, as soon as it is ready --------------------------------
@grader("DDP with overlap")
def check_overlapping_ddp(OverlappingDDP):
    sizes = [numel for _, numel in parameter_sizes()]
    for world_size in WORLD_SIZES:
        _judge(OverlappingDDP, {}, world_size, sizes, False,
               f"OverlappingDDP on {world_size} ranks")


# -- exercise 2: the bucket plan ----------------------------------------------------------------
def expected_plan(parameters, bucket_cap_mb):
    cap, buckets, size = bucket_cap_mb * 2**20, [], 0
    for param in reversed([p for p in parameters if p.requires_grad]):
        nbytes = param.numel() * param.element_size()
        if not buckets or size + nbytes > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(param)
        size += nbytes
    return buckets


EXACT_FIT_MB = (1024 + 64) / 2**20  # a hidden layer's weight and bias fill it to the byte
F32 = torch.float32
PLAN_CASES = ((3, 0.001, F32), (3, 0.003, F32), (5, 0.0043, F32), (3, 0.0002, F32), (3, 25, F32),
              (3, EXACT_FIT_MB, F32), (3, 0.002, torch.bfloat16))  # bfloat16: 2 bytes an element
PLAN_SEED = 0


def plan_cases() -> tuple:
    """PLAN_CASES, then one case drawn at grading time: 2-5 hidden layers, a cap of 1-7 KiB."""
    draw = torch.Generator().manual_seed(grading_seed(PLAN_SEED))
    hidden_layers = int(torch.randint(2, 6, (), generator=draw))
    cap_bytes = int(torch.randint(1024, 7 * 1024, (), generator=draw)) // 4 * 4
    return PLAN_CASES + ((hidden_layers, cap_bytes / 2**20, F32),)


def _named_plan(plan_buckets, parameters, cap, names):
    """In the learner's side of the crossing: the plan as parameter names (plain data), or
    ("not buckets", what came back) when it is no list of lists."""
    got = plan_buckets(parameters, cap)
    try:
        return "buckets", [[names.get(id(p), "a tensor not in the model") for p in bucket]
                           for bucket in got]
    except TypeError:
        return "not buckets", repr(got)[:120]


@grader("the bucket plan")
def check_plan_buckets(plan_buckets):
    for hidden_layers, cap, dtype in plan_cases():
        model = TiedNet(hidden_layers=hidden_layers).to(dtype)
        names = {id(p): name for name, p in model.named_parameters()}
        expected = expected_plan(list(model.parameters()), cap)
        model_call = f"TiedNet(hidden_layers={hidden_layers})" + ("" if dtype == F32 else f".to({dtype})")
        call = f"plan_buckets({model_call}.parameters(), {cap})"
        kind, got_names = call_learner(
            lambda parameters, cap, names=names: _named_plan(plan_buckets, parameters, cap, names),
            model.parameters(), cap, what=call, written_by_you=(assign_buckets,),
            hint="the error was raised in your function (its traceback is below)")
        if kind != "buckets":
            raise GradingError(call, "a list of buckets, each a list of parameters", got_names)
        want = [[names[id(p)] for p in bucket] for bucket in expected]
        expect(got_names == want, call, str(want), str(got_names), _plan_hint(got_names, want, cap, dtype))


def _plan_hint(got, want, cap, dtype=F32):
    flat_got, flat_want = [n for b in got for n in b], [n for b in want for n in b]
    if any(name.startswith("frozen") for name in flat_got):
        return "the frozen layer needs no gradient: it has none to all-reduce"
    if flat_got == flat_want[::-1] or flat_got == list(reversed(flat_want)):
        return "backward() computes the last layers' gradients first: walk the parameters backwards"
    if flat_got == flat_want and dtype != F32:
        return (f"the right order, cut in other places: these parameters are {dtype}, "
                f"{torch.finfo(dtype).bits // 8} bytes an element: a gradient's bytes are "
                f"numel() * element_size(), not numel() * 4")
    if flat_got == flat_want:
        return (f"the right order, cut in other places: a bucket holds at most {cap} MiB "
                f"({cap * 2**20:.0f} bytes: 4 bytes a float32 element), up to the last byte, "
                f"unless one gradient alone is larger")
    return "each parameter that needs a gradient once, in reverse registration order"


# -- exercise 3: DDP with buckets ----------------------------------------------------------------
@grader("DDP with buckets")
def check_bucketed_ddp(BucketedDDP):
    for world_size in WORLD_SIZES:
        cap, used_order = BUCKET_CAPS_MB[world_size], USED_ORDER.get(world_size)
        plan = expected_plan(list(TiedNet().parameters()), cap)
        sizes = [sum(p.numel() for p in bucket) for bucket in plan]
        _judge(BucketedDDP, {"bucket_cap_mb": cap}, world_size, sizes, True,
               f"BucketedDDP(bucket_cap_mb={cap}) on {world_size} ranks" + (
                   f", hidden layers run in the order {used_order}" if used_order else ""), used_order)
