"""Lesson 03's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import numpy as np
import torch
import torch.distributed as dist

from course_lib.checks import lesson03
from course_lib.checks.lesson03.alpha_beta import SWEEP_WORLD_SIZE
from course_lib.topics.collectives import _send_right_receive_left, naive_all_reduce, ring_chunks
from course_lib.topics.cost_model import AllReduceSweep, fit_alpha_beta
from course_lib.topics.global_loss import (contrastive_loss, gather_keeping_grad,
                                          global_contrastive_loss)
from test_measured_graders import ALPHA_BETA_ALTERNATIVES, RECORDED_SWEEP

from . import answer, wrong_answer


def ring_with_isend_irecv(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size

    def exchange(outgoing, incoming):
        requests = [dist.isend(outgoing.contiguous(), right), dist.irecv(incoming, left)]
        for request in requests:
            request.wait()

    for step in range(world_size - 1):
        incoming = torch.empty_like(chunks[(rank - step - 1) % world_size])
        exchange(chunks[(rank - step) % world_size], incoming)
        chunks[(rank - step - 1) % world_size].add_(incoming)
    for step in range(world_size - 1):
        incoming = torch.empty_like(chunks[(rank - step) % world_size])
        exchange(chunks[(rank - step + 1) % world_size], incoming)
        chunks[(rank - step) % world_size].copy_(incoming)
    return tensor


def ring_with_batched_p2p_ops(tensor):
    """Even and odd ranks in one batch_isend_irecv per step; the chunk index owned after the
    reduce-scatter is (rank + 1) % world_size."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for phase in ("reduce", "gather"):
        for step in range(world_size - 1):
            shift = 0 if phase == "reduce" else 1
            send_index, receive_index = (rank - step + shift) % world_size, \
                (rank - step - 1 + shift) % world_size
            incoming = torch.empty_like(chunks[receive_index])
            operations = [dist.P2POp(dist.isend, chunks[send_index].contiguous(), right),
                          dist.P2POp(dist.irecv, incoming, left)]
            for request in dist.batch_isend_irecv(operations):
                request.wait()
            if phase == "reduce":
                chunks[receive_index] += incoming
            else:
                chunks[receive_index][:] = incoming
    return tensor


ALTERNATIVES = {
    lesson03.check_collective_puzzle: [
        answer("a tuple", (63, 66, 69)),
        answer("numpy floats", np.array([63.0, 66.0, 69.0])),
    ],
    lesson03.check_ring_all_reduce: [
        answer("dist.isend/irecv", ring_with_isend_irecv),
        answer("batch_isend_irecv", ring_with_batched_p2p_ops),
    ],
    lesson03.check_measure_alpha_beta: ALPHA_BETA_ALTERNATIVES,  # measured when the test runs
}


# Wrong answers

def _calls_dist_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor


def _course_ring(tensor):
    from course_lib.topics.collectives import ring_all_reduce
    return ring_all_reduce(tensor)


def _stub(tensor):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


def _reduce_scatter_only(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(world_size - 1):
        send_index, receive_index = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = torch.empty_like(chunks[receive_index])
        _send_right_receive_left(chunks[send_index], right, incoming, left)
        chunks[receive_index] += incoming
    return tensor  # each rank holds one summed chunk; the all-gather half is missing


def _straight_to_each_owner(tensor):
    """Reduce-scatter and all-gather with each chunk sent straight to the rank that owns it: the
    right sums and bytes, but every rank talks to every other, not a ring."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    for owner in range(world_size):
        for peer in range(world_size):
            if peer != owner and rank == owner:
                incoming = torch.empty_like(chunks[owner])
                dist.recv(incoming, src=peer)
                chunks[owner] += incoming
            elif peer != owner and rank == peer:
                dist.send(chunks[owner].contiguous(), dst=owner)
    for owner in range(world_size):
        for peer in range(world_size):
            if peer != owner and rank == owner:
                dist.send(chunks[owner].contiguous(), dst=peer)
            elif peer != owner and rank == peer:
                dist.recv(chunks[owner], src=owner)
    return tensor


def _passes_whole_tensors(tensor):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    passing = tensor.clone()
    for _ in range(world_size - 1):  # right sums, but N - 1 whole tensors per rank
        incoming = torch.empty_like(tensor)
        _send_right_receive_left(passing, right, incoming, left)
        tensor += incoming
        passing = incoming
    return tensor


def _report(sweep, alpha, beta):
    return sweep, alpha, beta, SWEEP_WORLD_SIZE * alpha / beta


def _reference_report(sweep=RECORDED_SWEEP):
    return _report(sweep, *fit_alpha_beta(*zip(*sweep), SWEEP_WORLD_SIZE))


def _unweighted_line(sweep=RECORDED_SWEEP):
    sizes, seconds = np.array(sweep).T
    slope, intercept = np.polyfit(sizes, seconds, 1)
    return _report(sweep, intercept / 2, slope)


def _line_without_the_ring(sweep=RECORDED_SWEEP):
    sizes, seconds = np.array(sweep).T
    slope, intercept = np.polyfit(sizes, seconds, 1, w=1 / seconds)
    return _report(sweep, intercept, slope)


def _changed(change):
    """The reference report of the example sweep, with (alpha, beta, latency) changed."""
    recorded, alpha, beta, below = _reference_report()
    return (recorded, *change(alpha, beta, below))


def _converted_record():
    """A sweep dressed as measure_all_reduce's record, its times turned into milliseconds."""
    record = AllReduceSweep((nbytes, seconds * 1e3) for nbytes, seconds in RECORDED_SWEEP)
    record.repeats, record.world_size, record.backend = [[t] for _, t in record], 2, "gloo"
    record.clock, record.seal = ((0.0, 0.0), (1.0, 1.0)), "0" * 64
    return _reference_report(record)


WRONG_ANSWERS = {
    lesson03.check_collective_puzzle: [
        wrong_answer("forgets the broadcast", [33, 36, 39]),
        wrong_answer("forgets that each rank adds its rank", [60, 63, 66]),
        wrong_answer("gives every rank the sum of all chunks, as all_reduce would",
                     [198, 198, 198]),
        wrong_answer("one number short", [63, 66]),
    ],
    lesson03.check_ring_all_reduce: [
        wrong_answer("calls dist.all_reduce", _calls_dist_all_reduce),
        wrong_answer("gathers on rank 0, then broadcasts", naive_all_reduce),
        wrong_answer("does only the reduce-scatter half", _reduce_scatter_only),
        wrong_answer("passes whole tensors around the ring", _passes_whole_tensors),
        wrong_answer("reduce-scatter and all-gather straight to each chunk's owner, not a ring",
                     _straight_to_each_owner),
        wrong_answer("the unfinished stub", _stub),
        wrong_answer("calls the course's ring_all_reduce, which the lesson shows", _course_ring),
    ],
    lesson03.check_measure_alpha_beta: [
        wrong_answer("a plain least-squares line: the large messages' noise swamps alpha",
                     *_unweighted_line()),
        wrong_answer("keeps the line's intercept, forgetting the ring's 2 (N - 1)",
                     *_line_without_the_ring()),
        wrong_answer("swaps alpha and beta", *_changed(lambda a, b, n: (b, a, 2 * b / a))),
        wrong_answer("latency_bound_below = alpha / beta, forgetting N",
                     *_changed(lambda a, b, n: (a, b, a / b))),
        wrong_answer("a sweep of 3 sizes", *_reference_report(RECORDED_SWEEP[::4])),
        wrong_answer("a sweep that stops at 64 KiB, before bandwidth shows",
                     *_reference_report(RECORDED_SWEEP[:8])),
        wrong_answer("made up: a typed-in sweep, fitted right", *_reference_report()),
        wrong_answer("wrong unit: alpha in microseconds",
                     *_changed(lambda a, b, n: (a * 1e6, b, n * 1e6))),
        wrong_answer("made up: a record whose times were turned into milliseconds",
                     *_converted_record()),
    ],
}


# -- the global loss (check_global_loss) ---------------------------------------------------------

def _rank_rows(queries):
    return dist.get_rank() * len(queries)


def _loss_with_nn_functional(queries, keys):
    import warnings

    import torch.distributed.nn.functional as dist_nn

    with warnings.catch_warnings():  # deprecated in torch 2.13 for _functional_collectives
        warnings.simplefilter("ignore", FutureWarning)
        all_keys = torch.cat(dist_nn.all_gather(keys))
    return contrastive_loss(queries, all_keys, first_label=_rank_rows(queries))


def _loss_reduced_to_the_global_mean(queries, keys):
    """The global loss itself on every rank: each rank's mean all-reduced (differentiably) and
    divided by N. Every rank backwards it, and the all-reduce's backward sums the N seeds."""
    import torch.distributed._functional_collectives as funcol

    all_keys = funcol.all_gather_single(keys.contiguous(), 0, dist.group.WORLD)
    local = contrastive_loss(queries, all_keys, first_label=_rank_rows(queries))
    return funcol.all_reduce(local, "sum", dist.group.WORLD) / dist.get_world_size()


class _GatherSummingGradients(torch.autograd.Function):
    """A hand-written differentiable all-gather: backward all-reduces the gradient of the whole
    gathered tensor and keeps this rank's rows (the sum of what every rank's loss sent them)."""

    @staticmethod
    def forward(ctx, tensor):
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, tensor.contiguous())
        return torch.cat(gathered)

    @staticmethod
    def backward(ctx, gradient):
        gradient = gradient.contiguous()
        dist.all_reduce(gradient)
        return gradient.chunk(dist.get_world_size())[dist.get_rank()]


class _GatherOwnGradientOnly(_GatherSummingGradients):
    """The old GatherLayer mistake: backward keeps this rank's rows of its own gradient only."""

    @staticmethod
    def backward(ctx, gradient):
        return gradient.chunk(dist.get_world_size())[dist.get_rank()]


def _loss_with_hand_written_function(queries, keys):
    return contrastive_loss(queries, _GatherSummingGradients.apply(keys),
                            first_label=_rank_rows(queries))


def _plain_all_gather(queries, keys):
    gathered = [torch.empty_like(keys) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, keys.detach().contiguous())
    return contrastive_loss(queries, torch.cat(gathered), first_label=_rank_rows(queries))


def _plain_all_gather_own_rows_put_back(queries, keys):
    gathered = [torch.empty_like(keys) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, keys.detach().contiguous())
    gathered[dist.get_rank()] = keys  # the local rows keep their graph; the others' do not
    return contrastive_loss(queries, torch.cat(gathered), first_label=_rank_rows(queries))


def _local_negatives(queries, keys):
    return contrastive_loss(queries, keys)


def _labels_not_offset(queries, keys):
    return contrastive_loss(queries, gather_keeping_grad(keys))


def _detached_keys_gathered(queries, keys):
    return contrastive_loss(queries, gather_keeping_grad(keys.detach()),
                            first_label=_rank_rows(queries))


def _scaled_by_world_size(queries, keys):
    return dist.get_world_size() * contrastive_loss(queries, gather_keeping_grad(keys),
                                                    first_label=_rank_rows(queries))


def _own_gradient_only(queries, keys):
    return contrastive_loss(queries, _GatherOwnGradientOnly.apply(keys),
                            first_label=_rank_rows(queries))


def _returns_a_float(queries, keys):
    return contrastive_loss(queries, gather_keeping_grad(keys), first_label=_rank_rows(queries)).item()


ALTERNATIVES[lesson03.check_global_loss] = [
    answer("torch.distributed.nn.functional.all_gather", _loss_with_nn_functional),
    answer("the global mean all-reduced on every rank", _loss_reduced_to_the_global_mean),
    answer("a hand-written autograd.Function", _loss_with_hand_written_function),
]
WRONG_ANSWERS[lesson03.check_global_loss] = [
    wrong_answer("dist.all_gather into a list", _plain_all_gather),
    wrong_answer("dist.all_gather, its own rows put back", _plain_all_gather_own_rows_put_back),
    wrong_answer("negatives from this rank only", _local_negatives),
    wrong_answer("labels not offset by the rank", _labels_not_offset),
    wrong_answer("gathers detached keys", _detached_keys_gathered),
    wrong_answer("multiplied by the world size", _scaled_by_world_size),
    wrong_answer("a gather whose backward keeps its own gradient only", _own_gradient_only),
    wrong_answer("returns loss.item()", _returns_a_float),
    wrong_answer("calls the course's own", global_contrastive_loss),
]
