"""Reference collectives built from point-to-point sends: the naive all-reduce through rank 0,
then the ring all-reduce (reduce-scatter, then all-gather) that NCCL and gloo use for big tensors.

Run them inside a rank (under course_lib.runtime.launcher.launch or torchrun). The byte counter that grades the
ring exercise lives in course_lib.topics.traffic, the alpha-beta cost model in course_lib.topics.cost_model;
both are re-exported here so a lesson needs one import:

    from course_lib.topics.collectives import ring_all_reduce, count_traffic, ring_all_reduce_time
"""
import torch
import torch.distributed as dist

from .cost_model import (algorithm_bandwidth, bus_bandwidth, fit_alpha_beta, measure_all_reduce,
                         naive_all_reduce_time, ring_all_reduce_time, tree_all_reduce_time)
from .traffic import Traffic, count_traffic

__all__ = ["naive_all_reduce", "ring_all_reduce", "ring_chunks", "collective_puzzle",
           "count_traffic", "Traffic", "ring_all_reduce_time", "naive_all_reduce_time",
           "tree_all_reduce_time", "fit_alpha_beta", "algorithm_bandwidth", "bus_bandwidth",
           "measure_all_reduce"]


def naive_all_reduce(tensor):
    """Sum `tensor` over all ranks, in place: every rank sends to rank 0, which sends back the sum.

    Correct, but rank 0 receives and sends (world_size - 1) whole tensors: its link is the
    bottleneck, and the time grows with the number of ranks.
    """
    _check_contiguous(tensor, "naive_all_reduce")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank != 0:
        dist.send(tensor, dst=0)
        dist.recv(tensor, src=0)
        return tensor
    received = torch.empty_like(tensor)
    for source in range(1, world_size):
        dist.recv(received, src=source)
        tensor += received
    for destination in range(1, world_size):
        dist.send(tensor, dst=destination)
    return tensor


def ring_chunks(tensor, world_size):
    """The tensor's elements cut into world_size views of sizes that differ by at most one."""
    return list(tensor.view(-1).tensor_split(world_size))


def ring_all_reduce(tensor):
    """Sum `tensor` over all ranks, in place, passing chunks around a ring of ranks.

    The flat tensor is cut into world_size chunks. Every step, each rank sends one chunk to its
    right neighbour while receiving one from its left neighbour:
      1. reduce-scatter, world_size - 1 steps: add the received chunk to our own copy of it;
         afterwards rank r holds the full sum of chunk (r + 1) % world_size;
      2. all-gather, world_size - 1 steps: pass the summed chunks on, overwriting our copy.
    Each rank sends 2 (world_size - 1) / world_size times the tensor's bytes: always less than
    two tensors, however many ranks there are. That is why the ring wins for large tensors.
    """
    _check_contiguous(tensor, "ring_all_reduce")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    received = torch.empty_like(chunks[0])  # tensor_split puts the larger chunks first

    for step in range(world_size - 1):  # reduce-scatter
        send_index, receive_index = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = received[:chunks[receive_index].numel()]
        _send_right_receive_left(chunks[send_index], right, incoming, left)
        chunks[receive_index] += incoming

    for step in range(world_size - 1):  # all-gather
        send_index, receive_index = (rank - step + 1) % world_size, (rank - step) % world_size
        _send_right_receive_left(chunks[send_index], right, chunks[receive_index], left)
    return tensor


def _send_right_receive_left(outgoing, right, incoming, left):
    # Post the send and the receive together, then wait: with blocking calls, every rank would
    # wait in send() for its neighbour to receive, and the ring would deadlock. Batching them
    # (rather than two isend/irecv calls) also lets NCCL run both at once on GPUs. An empty
    # chunk (fewer elements than ranks) is neither sent nor received: sender and receiver agree,
    # because they handle the same chunk index in the same step.
    operations = []
    if outgoing.numel() > 0:
        operations.append(dist.P2POp(dist.isend, outgoing, right))
    if incoming.numel() > 0:
        operations.append(dist.P2POp(dist.irecv, incoming, left))
    for request in dist.batch_isend_irecv(operations) if operations else []:
        request.wait()


def _check_contiguous(tensor, name):
    if not tensor.is_contiguous():
        raise ValueError(f"{name} works on the tensor's memory in place, but this tensor is "
                         "not contiguous; call it on tensor.contiguous() and copy the result back")


def collective_puzzle():
    """Run on 3 ranks. What does `out` hold on each rank at the end?"""
    rank = dist.get_rank()
    x = torch.arange(3.0) + 10 * rank     # rank 0: [0, 1, 2], rank 1: [10, 11, 12], rank 2: ...
    dist.broadcast(x, src=2)
    x += rank
    out = torch.zeros(1)
    dist.reduce_scatter(out, list(x.chunk(3)))
    return out
