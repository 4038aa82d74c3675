"""Graders for lesson 04, the DDP flow: the broadcast at construction, DDP by hand, and the
indices DistributedSampler deals each rank. The distributed graders run your function on ranks.

- broadcast the parameters: afterwards every rank holds rank 0's initial weights, and rank 0
  keeps its own (any way of copying them from rank 0).
- DDP by hand: the weights after each step equal one process's on the global batch, on every
  rank: the gradients averaged over the ranks, whatever collective does it.
- indices for a rank: run on 2, 3 and 4 ranks, the indices DistributedSampler(shuffle=True, seed)
  gives the calling rank (its rank and world size from the process group) in this epoch (a list,
  a tensor or any sequence of whole numbers).
- hidden share: the share of a step's all-reduce time (merged bucket spans) before backward's
  wait began, on hand-made timelines and on one the grader records on 2 ranks, within
  SHARE_TOLERANCE of course_lib.topics.timeline.overlap_fraction; None for a step without one.
- the fastest bucket size: judged against the sweep the learner recorded, never a new run (a
  busy machine gives other times at every run): StepTimings from 2 ranks, at least 4 caps up to
  DDP's default 25 MiB, a smallest cap that splits the gradients into 8 buckets or more, 20
  timed steps per cap or more; the reported cap's median step (all its steps pooled) within
  BUCKET_TOLERANCE (10%) of the fastest cap's. Any number type; the sweep as a list of
  StepTimings (nested too) or a dict from cap to them.
"""
import functools
import math
import statistics
from collections.abc import Mapping

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from . import GradingError, expect, expect_equal, grader, wrong_answer
from .oracle import close, large_batch_sgd
from .ranks import run_on_ranks
from ..topics.scaling import StepTiming
from ..topics.timeline import merge_intervals, overlap_fraction
from ..training.data import make_dataset
from ..training.models import make_model
from ..training.timeline import Span, Timeline, TimelineRecorder

WORLD_SIZE = 2
LAUNCH_TIMEOUT_S = 90
BROADCAST_SEED = 100         # rank r builds make_model(seed=BROADCAST_SEED + r)
STEPS, GLOBAL_BATCH_SIZE, LR = 4, 32, 0.5
SAME_COLLECTIVES = ("every rank must call the same collectives, in the same order, with tensors "
                    "of the same shape")


def _run_on_ranks(fn, *args, what: str):
    """fn(*args) on WORLD_SIZE quiet gloo ranks; a crash, a hang or a stub is explained."""
    return run_on_ranks(fn, *args, nprocs=WORLD_SIZE, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint=SAME_COLLECTIVES, crash_hint=_crash_hint)


def _crash_hint(cause) -> str:
    if any(word in cause.summary for word in ("gloo", "Connection", "NCCL")):
        return SAME_COLLECTIVES  # a peer left: the ranks did not call the same collectives
    return "the error is raised in your function: fix it, run its cell again, then the check"


# -- exercise 1: the broadcast at construction ---------------------------------------------------

def _broadcast_on_rank(broadcast_parameters):
    model = make_model(seed=BROADCAST_SEED + dist.get_rank())
    broadcast_parameters(model)
    return parameters_to_vector(model.parameters()).detach().clone()


@grader("broadcast the parameters")
def check_broadcast_parameters(broadcast_parameters):
    what = "broadcast_parameters(model) on 2 ranks"
    results = _run_on_ranks(_broadcast_on_rank, broadcast_parameters, what=what)
    rank0_initial = parameters_to_vector(make_model(seed=BROADCAST_SEED).parameters()).detach()
    ranks_agree = torch.equal(results[0], results[1])
    for rank, got in enumerate(results):
        if torch.equal(got, rank0_initial):
            continue
        if ranks_agree:
            hint = ("the ranks agree, but not on rank 0's weights: averaging (all_reduce) is not "
                    "what DDP does; copy rank 0's tensors with dist.broadcast(tensor, src=0)")
        elif rank == 0:
            hint = "rank 0 must keep its own weights: it is the source of the broadcast (src=0)"
        else:
            copied = [torch.equal(mine, theirs.detach()) for mine, theirs in
                      zip(_split_like(got), make_model(seed=BROADCAST_SEED).parameters())]
            hint = ("some parameters were not copied: broadcast every tensor in model.parameters()"
                    if any(copied) else
                    f"rank {rank} still has its own weights: broadcast each parameter from rank 0, "
                    f"in place (dist.broadcast(param, src=0) under torch.no_grad())")
        expect(False, f"rank {rank}'s parameters after {what}",
               f"rank 0's initial parameters (sum {rank0_initial.sum().item():.6f})",
               f"parameters with sum {got.sum().item():.6f}", hint)


def _split_like(vector):
    """A flat parameter vector of the course model, split back into its tensors."""
    shapes = [p.shape for p in make_model().parameters()]
    sizes = [shape.numel() for shape in shapes]
    return [part.view(shape) for part, shape in zip(vector.split(sizes), shapes)]


def _broadcast_nothing(model):
    pass


def _average_parameters(model):
    with torch.no_grad():
        for param in model.parameters():
            dist.all_reduce(param)
            param /= dist.get_world_size()


def _broadcast_first_parameter_only(model):
    with torch.no_grad():
        dist.broadcast(next(model.parameters()), src=0)


def _broadcast_a_copy(model):
    # broadcasting into a copy leaves the model's own tensors as they were
    for param in model.parameters():
        dist.broadcast(param.detach().clone(), src=0)


# -- exercise 2: DDP by hand ---------------------------------------------------------------------

def _batches():
    """STEPS global batches of the course data, as (X, y) pairs."""
    X, y = make_dataset(STEPS * GLOBAL_BATCH_SIZE, seed=1).tensors
    return list(zip(X.split(GLOBAL_BATCH_SIZE), y.split(GLOBAL_BATCH_SIZE)))


def _by_hand_on_rank(train_step_by_hand):
    """Train with the learner's step and, side by side on the same shards, with torch's DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    ddp_model = DDP(make_model(seed=0))
    ddp_optimizer = torch.optim.SGD(ddp_model.parameters(), lr=LR)
    losses, weights, ddp_weights = [], [], []
    for X, y in _batches():
        X_local, y_local = X[rank::world_size], y[rank::world_size]  # as DistributedSampler deals
        loss = train_step_by_hand(model, optimizer, X_local, y_local)
        try:
            losses.append(float(loss))
        except (TypeError, ValueError, RuntimeError):
            losses.append(None)  # the grader says what to return
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
        ddp_optimizer.zero_grad()
        F.cross_entropy(ddp_model(X_local), y_local).backward()
        ddp_optimizer.step()
        ddp_weights.append(parameters_to_vector(ddp_model.parameters()).detach().clone())
    return losses, weights, ddp_weights


@grader("DDP by hand")
def check_train_step_by_hand(train_step_by_hand):
    what = "train_step_by_hand on 2 ranks"
    # first, so that the ranks fork with torch.optim's imports done (seconds each otherwise)
    single_losses, single_weights = large_batch_sgd(_batches(), LR)
    results = _run_on_ranks(_by_hand_on_rank, train_step_by_hand, what=what)
    for step in range(STEPS):
        before, after = single_weights[step], single_weights[step + 1]
        for rank, (_, weights, ddp_weights) in enumerate(results):
            expect(close(ddp_weights[step], after), f"torch's DDP on rank {rank} at step {step}",
                   "the single-process weights", "other weights",
                   "this machine's DDP disagrees with one process; please report it")
            got = weights[step]
            if close(got, after):
                continue
            ranks_differ = not close(results[0][1][step], results[1][1][step])
            update, expected_update = got - before, after - before
            if ranks_differ:
                hint = ("the ranks' models drifted apart, so their gradients differed: after "
                        "loss.backward(), all-reduce every parameter's .grad (averaging the loss "
                        "value instead does not change the gradients)")
            elif close(update, WORLD_SIZE * expected_update):
                hint = ("the update is world_size times too large: all_reduce sums the gradients; "
                        "divide them by dist.get_world_size()")
            elif close(update, torch.zeros_like(update)):
                hint = "the weights did not change: call optimizer.step() after averaging"
            else:
                hint = ("average each gradient over the ranks: all_reduce(param.grad) (a sum), "
                        "then divide by world_size, between backward() and optimizer.step()")
            expect(False, f"rank {rank}'s weights after step {step}",
                   "the weights of torch's DDP (and of one process on the whole batch)",
                   f"weights off by up to {(got - after).abs().max().item():.2e}", hint)
        returned = [losses[step] for losses, _, _ in results]
        expect(None not in returned, f"what train_step_by_hand returns at step {step}",
               "this rank's loss, a number", "something that is not a number (e.g. None)",
               "end with return loss.item()")
        mean_loss = sum(returned) / WORLD_SIZE
        expect(abs(mean_loss - single_losses[step]) <= 1e-4 * abs(single_losses[step]) + 1e-6,
               f"the ranks' mean loss at step {step}", f"{single_losses[step]:.6f}",
               f"{mean_loss:.6f}", "return this rank's loss on its own shard, as a float")


def _sums_gradients(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
    optimizer.step()
    return loss.item()


def _averages_the_loss(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    dist.all_reduce(loss)  # the value is averaged, but autograd passes the local gradient through
    loss = loss / dist.get_world_size()
    loss.backward()
    optimizer.step()
    return loss.item()


def _forgets_all_reduce(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        param.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item()


def _step_stub(model, optimizer, X, y):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- exercise 3: the sampler's indices -----------------------------------------------------------

SAMPLER_CASES = {  # world_size: [(n_samples, epoch, seed)]: easy first, padding last
    2: [(8, 0, 0), (8, 1, 0)], 3: [(12, 5, 42), (13, 0, 3)], 4: [(10, 2, 7), (10, 0, 1)],
}


def _sampler_indices(n_samples, world_size, rank, epoch, seed):
    from torch.utils.data import DistributedSampler

    sampler = DistributedSampler(range(n_samples), num_replicas=world_size, rank=rank,
                                 shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return list(sampler)


def _indices_on_rank(indices_for_rank, cases):
    """Inside a rank: the learner's indices for every case, as lists of ints (or what came back)."""
    results = []
    for n_samples, epoch, seed in cases:
        got = indices_for_rank(n_samples, epoch, seed=seed)
        try:
            results.append([int(index) for index in got])
        except (TypeError, ValueError):
            results.append(repr(got)[:120])
    return results


@grader("indices for a rank")
def check_indices_for_rank(indices_for_rank):
    for world_size, cases in SAMPLER_CASES.items():
        per_rank = run_on_ranks(_indices_on_rank, indices_for_rank, cases, nprocs=world_size,
                                what=f"indices_for_rank on {world_size} ranks",
                                timeout=LAUNCH_TIMEOUT_S, hang_hint=SAME_COLLECTIVES,
                                crash_hint=_crash_hint)
        for rank, results in enumerate(per_rank):
            for (n_samples, epoch, seed), got in zip(cases, results):
                call = (f"indices_for_rank(n_samples={n_samples}, epoch={epoch}, seed={seed}) on "
                        f"rank {rank} of {world_size}")
                expect(isinstance(got, list), call, "a list of ints", str(got),
                       "return a list of dataset indices")
                expected = _sampler_indices(n_samples, world_size, rank, epoch, seed)
                expect_equal(got, expected, call,
                             _sampler_hint(got, n_samples, world_size, rank, epoch, seed))


def _sampler_hint(got, n_samples, world_size, rank, epoch, seed) -> str:
    per_rank = -(-n_samples // world_size)
    if len(got) != per_rank:
        return (f"each rank gets ceil(n_samples / world_size) = {per_rank} indices: pad the "
                f"permutation with its own first indices until its length divides by world_size")
    if got == _sampler_indices(n_samples, world_size, rank, 0, seed) and epoch != 0:
        return "the permutation changes every epoch: seed the generator with seed + epoch"
    if got == _contiguous_blocks(n_samples, world_size, rank, epoch, seed):
        return ("that is a contiguous block of the permutation; DistributedSampler deals it "
                "round-robin instead: indices[rank::world_size]")
    for other_rank in range(world_size):
        if other_rank != rank and got == _sampler_indices(n_samples, world_size, other_rank, epoch, seed):
            return "that is another rank's share: rank r takes every world_size-th index, from position r"
    return ("draw one permutation with torch.randperm(n_samples, generator=g) where g is a "
            "torch.Generator seeded with seed + epoch (the same on every rank), then deal it "
            "round-robin: indices[rank::world_size]")


def _contiguous_blocks(n_samples, world_size, rank, epoch, seed=0):
    generator = torch.Generator().manual_seed(seed + epoch)
    indices = torch.randperm(n_samples, generator=generator).tolist()
    per_rank = -(-n_samples // world_size)
    indices += indices[: per_rank * world_size - n_samples]
    return indices[rank * per_rank:(rank + 1) * per_rank]


def _ignores_epoch(n_samples, world_size, rank, epoch, seed=0):  # as if set_epoch were never called
    return _sampler_indices(n_samples, world_size, rank, 0, seed)


def _seeds_each_rank(n_samples, world_size, rank, epoch, seed=0):
    generator = torch.Generator().manual_seed(seed + epoch + rank)
    indices = torch.randperm(n_samples, generator=generator).tolist()
    return indices[: -(-n_samples // world_size)]


def _no_padding(n_samples, world_size, rank, epoch, seed=0):
    generator = torch.Generator().manual_seed(seed + epoch)
    return torch.randperm(n_samples, generator=generator).tolist()[rank::world_size]


def _assumes_two_ranks(n_samples, world_size, rank, epoch, seed=0):
    return _sampler_indices(n_samples, 2, rank % 2, epoch, seed)


def _on_this_rank(mistake):
    """A mistake written with rank and world_size as arguments, as the exercise's function: it
    reads them from the process group."""
    def indices_for_rank(n_samples, epoch, seed=0):
        return mistake(n_samples, dist.get_world_size(), dist.get_rank(), epoch, seed)
    return indices_for_rank


# -- exercise 4: the share of the all-reduce that backward hid -----------------------------------

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
    return _run_on_ranks(_record_a_timeline_on_rank, what="recording a timeline for the check")[0]


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
               "under no_sync a step has no all-reduce and no wait: return None when "
               "timeline.select(rank, step, \"allreduce\") is empty")
        return
    got = hidden_share(timeline, rank, step)
    try:
        value = float(got)
    except (TypeError, ValueError, RuntimeError):
        raise GradingError(call, f"a share between 0 and 1 ({expected:.3f})", repr(got)[:120],
                           "return hidden seconds / all-reduce seconds, a number") from None
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
    hidden = _seconds_within(merged, backward.start, wait.start)
    other_rank = (rank + 1) % timeline.world_size
    mistakes = [
        (1 - hidden / total, "that is the share left exposed, after backward stopped computing: "
                             "return the share hidden under it"),
        (100 * hidden / total, "return a share between 0 and 1, not a percentage"),
        (hidden, "that is the hidden time in seconds: divide it by the all-reduce time"),
        (_seconds_within(merged, backward.start, backward.end) / total,
         "the wait at the end of backward hides nothing: backward computes only from "
         "backward.start until wait.start"),
        (sum(_seconds_within([span], backward.start, wait.start) for span in allreduces)
         / sum(end - start for start, end in allreduces),
         "where two buckets all-reduce at the same time, count that time once: merge "
         "overlapping spans before adding up their lengths"),
        (hidden / (backward.end - backward.start),
         "divide by the all-reduce time (the merged spans' length), not by backward's"),
        (overlap_fraction(timeline, other_rank, step),
         "that is another rank's share: read this rank's spans, timeline.select(rank, step, ...)"),
    ]
    for wrong, hint in mistakes:
        if wrong is not None and abs(value - wrong) <= SHARE_TOLERANCE:
            return hint
    return ("merge the bucket all-reduce spans, add up their lengths (the all-reduce time) and "
            "the part of them between backward.start and wait.start (hidden); return "
            "hidden / total")



def _seconds_within(intervals, low, high) -> float:
    return sum(max(0.0, min(end, high) - max(start, low)) for start, end in intervals)


def _wrong_share(mistake):
    """A hidden_share that makes one mistake, for WRONG_ANSWERS."""

    def hidden_share(timeline, rank, step):
        if mistake == "rank 0":
            rank = 0
        allreduces = [(s.start, s.end) for s in timeline.select(rank, step, "allreduce")]
        if not allreduces:
            return 0.0 if mistake == "zero without all-reduce" else None
        [backward] = timeline.select(rank, step, "backward")
        [wait] = timeline.select(rank, step, "wait")
        merged = merge_intervals(allreduces)
        total = sum(end - start for start, end in merged)
        if mistake == "whole backward":
            return _seconds_within(merged, backward.start, backward.end) / total
        if mistake == "sums buckets":
            return (sum(_seconds_within([span], backward.start, wait.start) for span in allreduces)
                    / sum(end - start for start, end in allreduces))
        hidden = _seconds_within(merged, backward.start, wait.start)
        return {"seconds": hidden, "exposed": 1 - hidden / total}.get(mistake, hidden / total)

    return hidden_share


def _share_stub(timeline, rank, step):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- exercise 5: the bucket size that makes a step fastest, measured -----------------------------

BUCKET_WORLD_SIZE = 2
DEFAULT_BUCKET_CAP_MB = 25   # DDP's default cap: the sweep must say whether it is right here
MIN_BUCKET_CAPS = 4
MIN_STEPS_PER_CAP = 20       # timed steps, all rounds together
MIN_BUCKETS = 8              # at the smallest cap: a model with enough gradient tensors to split
BUCKET_TOLERANCE = 0.10      # two caps whose medians are closer are a tie on a busy machine
BUCKET_HINT = ("record it as the exercise says: bucket_sweep = launch(sweep_bucket_caps, "
               "BUCKET_CAPS_MB, nprocs=2)[0], where each rank keeps every StepTiming that "
               "time_ddp_steps(bucket_cap_mb=cap, **BUCKET_STEPS) returns")


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
                       "pass each cap itself to time_ddp_steps(bucket_cap_mb=cap, ...)")
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
               f"{record.world_size}", "launch the sweep on 2 ranks: launch(sweep_bucket_caps, "
               "BUCKET_CAPS_MB, nprocs=2)[0]; in the notebook's own process there is no DDP and "
               "nothing to bucket")
        expect(record.bucket_cap_mb is not None, "a timing of bucket_sweep",
               "timings at the caps you chose", "a timing at DDP's default (bucket_cap_mb=None)",
               "pass every cap of BUCKET_CAPS_MB, as a number, to time_ddp_steps(bucket_cap_mb=cap)")
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
           "time the deep model of the exercise (hidden_layers=48 in BUCKET_STEPS): the course's "
           "2-layer MLP has 4 gradient tensors, too few to split into buckets; and start the "
           "sweep at a cap as small as BUCKET_CAPS_MB's first")
    for cap, (seconds, _) in by_cap.items():
        expect(len(seconds) >= MIN_STEPS_PER_CAP, f"timed steps at bucket_cap_mb={cap:g}",
               f"{MIN_STEPS_PER_CAP} or more, all rounds together (one burst of load must not "
               f"decide)", str(len(seconds)), "3 rounds of time_ddp_steps(steps=8), as "
               "BUCKET_STEPS gives, for every cap")
        expect(all(math.isfinite(value) and value > 0 for value in seconds),
               f"the step times at bucket_cap_mb={cap:g}", "positive seconds",
               repr(seconds)[:120], BUCKET_HINT)


@grader("the fastest bucket size, measured")
def check_best_bucket_cap(bucket_sweep, best_bucket_cap_mb):
    records = _sweep_records(bucket_sweep)
    by_cap = _steps_by_cap(records)
    _expect_a_bucket_sweep(by_cap)
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


# A sweep recorded on 2 gloo ranks of a busy 2-core machine with the exercise's BUCKET_STEPS (ms
# per step; 3 rounds, the caps taking turns): (bucket_cap_mb, buckets per step, 8 timed steps)
RECORDED_BUCKET_ROUNDS = [
    (0.01, 48, (72.8, 58.2, 59.0, 87.6, 62.5, 52.9, 74.8, 47.5)),
    (0.05, 12, (26.8, 30.5, 33.4, 41.0, 36.9, 26.1, 25.3, 26.5)),
    (0.1, 7, (12.3, 8.1, 6.5, 6.6, 6.5, 19.3, 8.8, 6.7)),
    (0.25, 3, (13.0, 11.5, 13.2, 11.5, 11.3, 14.1, 8.0, 7.7)),
    (25, 1, (8.8, 11.2, 7.0, 11.1, 10.7, 10.2, 10.6, 12.2)),
    (0.01, 48, (81.7, 96.2, 93.5, 95.1, 29.9, 37.5, 31.7, 57.7)),
    (0.05, 12, (17.8, 12.9, 30.6, 22.5, 15.1, 17.5, 38.8, 38.1)),
    (0.1, 7, (10.9, 16.4, 25.8, 13.5, 31.6, 21.3, 13.1, 8.7)),
    (0.25, 3, (11.5, 18.8, 11.5, 16.0, 9.6, 11.7, 14.9, 11.0)),
    (25, 1, (10.7, 7.7, 5.3, 6.6, 6.2, 6.4, 8.8, 9.3)),
    (0.01, 48, (96.7, 24.8, 30.8, 28.2, 45.8, 72.0, 48.6, 23.4)),
    (0.05, 12, (27.7, 19.4, 13.0, 12.7, 23.9, 19.5, 22.9, 22.9)),
    (0.1, 7, (12.6, 30.3, 13.7, 19.9, 19.4, 26.6, 12.7, 20.3)),
    (0.25, 3, (7.2, 14.6, 12.0, 8.7, 11.4, 13.7, 11.1, 6.2)),
    (25, 1, (11.4, 23.6, 28.5, 12.5, 6.3, 15.1, 15.3, 12.1)),
]


def recorded_bucket_sweep(world_size=BUCKET_WORLD_SIZE, rounds=3, steps=8, caps=None,
                          buckets_scale=1) -> list:
    """RECORDED_BUCKET_ROUNDS as time_ddp_steps's StepTimings (seconds), optionally cut down."""
    return [StepTiming(seconds=[ms / 1e3 for ms in times[:steps]], world_size=world_size,
                       bucket_cap_mb=cap, buckets=max(1, buckets // buckets_scale)
                       if world_size > 1 else None)
            for index, (cap, buckets, times) in enumerate(RECORDED_BUCKET_ROUNDS)
            if index // 5 < rounds and (caps is None or cap in caps)]


def _medians_of(sweep) -> dict:
    return {cap: statistics.median(seconds) for cap, (seconds, _) in _steps_by_cap(sweep).items()}


def _fastest_cap(sweep=None):
    medians = _medians_of(sweep or recorded_bucket_sweep())
    return min(medians, key=medians.get)


def _fastest_in_the_first_round():
    medians = _medians_of(recorded_bucket_sweep(rounds=1))
    return min(medians, key=medians.get)


def _fastest_step_seconds():
    return min(_medians_of(recorded_bucket_sweep()).values())


WRONG_ANSWERS = {
    check_broadcast_parameters: [
        wrong_answer("does nothing", _broadcast_nothing),
        wrong_answer("averages the parameters with all_reduce", _average_parameters),
        wrong_answer("broadcasts only the first parameter", _broadcast_first_parameter_only),
        wrong_answer("broadcasts into copies of the parameters", _broadcast_a_copy),
    ],
    check_train_step_by_hand: [
        wrong_answer("sums the gradients without dividing by world_size", _sums_gradients),
        wrong_answer("averages the loss instead of the gradients", _averages_the_loss),
        wrong_answer("divides the gradients but never all-reduces them", _forgets_all_reduce),
        wrong_answer("the lesson's stub", _step_stub),
    ],
    check_indices_for_rank: [
        wrong_answer("gives each rank a contiguous block", _on_this_rank(_contiguous_blocks)),
        wrong_answer("ignores the epoch (no set_epoch)", _on_this_rank(_ignores_epoch)),
        wrong_answer("shuffles with a different seed on each rank",
                     _on_this_rank(_seeds_each_rank)),
        wrong_answer("does not pad to a multiple of world_size", _on_this_rank(_no_padding)),
        wrong_answer("assumes 2 ranks", _on_this_rank(_assumes_two_ranks)),
    ],
    check_hidden_share: [
        wrong_answer("counts the wait at the end of backward as hidden",
                     _wrong_share("whole backward")),
        wrong_answer("adds up overlapping buckets twice", _wrong_share("sums buckets")),
        wrong_answer("returns the hidden seconds", _wrong_share("seconds")),
        wrong_answer("returns the exposed share", _wrong_share("exposed")),
        wrong_answer("returns 0.0 for a step without all-reduce",
                     _wrong_share("zero without all-reduce")),
        wrong_answer("reads rank 0's spans for every rank", _wrong_share("rank 0")),
        wrong_answer("the lesson's stub", _share_stub),
    ],
    check_best_bucket_cap: [
        wrong_answer("picks the smallest cap, for the earliest first bucket",
                     recorded_bucket_sweep(), 0.01),
        wrong_answer("chooses by the first round only, which one burst of load decides",
                     recorded_bucket_sweep(), _fastest_in_the_first_round()),
        wrong_answer("reports the fastest median step's seconds, not its cap",
                     recorded_bucket_sweep(), _fastest_step_seconds()),
        wrong_answer("records the sweep in the notebook's process, not on 2 ranks",
                     recorded_bucket_sweep(world_size=1), _fastest_cap()),
        wrong_answer("a sweep of 3 caps", recorded_bucket_sweep(caps=(0.01, 0.1, 25)), 25),
        wrong_answer("a sweep that stops at 0.25 MiB, below DDP's default",
                     recorded_bucket_sweep(caps=(0.01, 0.05, 0.1, 0.25)), 0.25),
        wrong_answer("one round of 5 steps per cap", recorded_bucket_sweep(rounds=1, steps=5),
                     _fastest_cap(recorded_bucket_sweep(rounds=1, steps=5))),
        wrong_answer("the course's 2-layer MLP: too few gradient tensors to bucket",
                     recorded_bucket_sweep(buckets_scale=12), _fastest_cap()),
    ],
}
