"""Counting what a rank sends: `with count_traffic() as traffic:` records the bytes this rank
sends and receives point-to-point, and the collectives it runs with the bytes it hands each.

It grades the ring all-reduce exercise: a ring sends about 2 (N - 1) / N times the tensor's
bytes per rank, the naive all-reduce makes rank 0 send (N - 1) times as much, and a solution
that just calls dist.all_reduce shows up in traffic.collectives.

    with count_traffic() as traffic:
        ring_all_reduce(tensor)
    traffic.bytes_sent, traffic.bytes_received, traffic.collectives, traffic.collective_bytes

How it works: it counts below the Python API, where the process group runs each operation.
Every torch.distributed call (dist.send, an `isend` imported by name, batch_isend_irecv,
dist.all_reduce, DDP's gradient all-reduce from its C++ Reducer) ends in one operation of
torch's `c10d` operator namespace (`c10d::send`, `c10d::allreduce_`...), and every operator
passes through the dispatcher. While the block runs, a dispatch mode (PyTorch's hook for seeing
each operator call) records those, and lets every call through unchanged.

Limits, so that you read the numbers right:
- Point-to-point bytes are tensor.numel() * tensor.element_size() as requested (a recv counts
  its buffer's size), without any protocol overhead. For a collective, `collective_bytes` adds up
  per name the bytes of the tensors this rank hands in: the tensor itself for all_reduce,
  broadcast and reduce (which work in place), the input for the others, nothing for a barrier.
  That is the payload, not the bytes on the wire, which depend on the algorithm the backend picks
  (course_lib.topics.cost_model turns a payload into a ring's bytes per rank).
  Names are the collective's, whichever form was called: all_gather_into_tensor and the
  all_gather inside all_gather_object count as "all_gather".
- It counts this thread's calls (and the backward passes it runs), in this process: each rank
  has its own Traffic. Return it from the function you launch to compare ranks. Blocks cannot
  be nested. Torch's functional collectives (DTensor's, torch.compile's) are not counted; FSDP2's
  are (torch 2.13's fully_shard calls dist.all_gather_single and dist.reduce_scatter_single).

DataParallel moves tensors between the GPUs of one process, not between ranks, through
torch.nn.parallel.comm. `watch_data_parallel_comm()` records those calls, and runs torch's own
replicate and its backward without GPUs (on the "meta" device):

    with watch_data_parallel_comm() as calls:
        replicas = torch.nn.parallel.replicate(model_on_meta, [0, 1, 2, 3])
        ...forward each replica, one loss, loss.backward()...
    calls  # [broadcast_coalesced of P bytes to devices [1, 2, 3], reduce_add_coalesced of 4 x P]
"""
import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch.distributed as dist
# The documented way to write a dispatch mode is this module, underscore and all ("Extending
# PyTorch: extending all torch API with modes"); the course's torch (2.8 and newer; tested on
# 2.8, 2.13 and 2.15) has the same API.
from torch.nn.parallel import comm as data_parallel_comm
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["count_traffic", "Traffic", "POINT_TO_POINT", "COLLECTIVES",
           "watch_data_parallel_comm", "CommCall"]

POINT_TO_POINT = ("send", "recv")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "gather", "scatter",
               "reduce_scatter", "all_to_all", "barrier")

# The c10d operators that torch.distributed's functions call, and the collective each one is.
# Each function picks its operator (dist.all_gather_object runs _allgather_base_ today; older
# torch ran allgather_); the operators have kept these names on every torch the course supports.
_COLLECTIVE_OF_OPERATOR = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast", "reduce_": "reduce",
    "allgather_": "all_gather", "_allgather_base_": "all_gather",
    "allgather_coalesced_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "gather_": "gather", "scatter_": "scatter",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "barrier": "barrier", "monitored_barrier_": "barrier",
}
# Where each operator takes the tensors a rank hands in: the in-place ones their first argument,
# the others (output first, then input) their second; a barrier's tensor is a placeholder.
_IN_PLACE_OPERATORS = ("allreduce_", "allreduce_coalesced_", "broadcast_", "reduce_")
_NO_PAYLOAD_OPERATORS = ("barrier", "monitored_barrier_")


@dataclass
class Traffic:
    """What one rank did inside a count_traffic block (picklable: return it from a rank)."""

    rank: int = 0
    bytes_sent_to: Counter = field(default_factory=Counter)        # peer rank -> bytes
    bytes_received_from: Counter = field(default_factory=Counter)  # peer rank -> bytes
    collectives: list = field(default_factory=list)                # names, in call order
    collective_bytes: Counter = field(default_factory=Counter)     # name -> bytes handed in

    @property
    def bytes_sent(self):
        return sum(self.bytes_sent_to.values())

    @property
    def bytes_received(self):
        return sum(self.bytes_received_from.values())


_active = []  # the Traffic of the open block, if any


@contextlib.contextmanager
def count_traffic():
    """Record this rank's point-to-point bytes and collective calls inside the block."""
    if _active:
        raise RuntimeError("count_traffic() is already counting in this process; close the "
                           "first block before opening another (blocks cannot be nested)")
    traffic = Traffic(rank=dist.get_rank() if dist.is_initialized() else 0)
    _active.append(traffic)
    try:
        with _CountingMode(traffic):
            yield traffic
    finally:
        _active.clear()


class _CountingMode(TorchDispatchMode):
    """Sees every operator call on this thread; records the c10d ones, then runs each as is."""

    def __init__(self, traffic):
        super().__init__()
        self.traffic = traffic

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            _record(func.name().split("::", 1)[1], args, self.traffic)
        return func(*args, **(kwargs or {}))


def _record(operator, args, traffic):
    # Point-to-point operators take (tensors, process_group, peer's rank in that group, tag).
    if operator == "send":
        traffic.bytes_sent_to[_global_rank(args[1], args[2])] += _nbytes(args[0])
    elif operator == "recv_":
        traffic.bytes_received_from[_global_rank(args[1], args[2])] += _nbytes(args[0])
    elif operator == "recv_any_source_":
        traffic.bytes_received_from["any"] += _nbytes(args[0])
    elif operator in _COLLECTIVE_OF_OPERATOR:
        name = _COLLECTIVE_OF_OPERATOR[operator]
        traffic.collectives.append(name)
        if operator not in _NO_PAYLOAD_OPERATORS:
            handed_in = args[0] if operator in _IN_PLACE_OPERATORS else args[1]
            traffic.collective_bytes[name] += _nbytes(handed_in)


def _global_rank(process_group, group_rank):
    """The peer's rank in the default group: what dist.get_rank() says on that peer."""
    try:
        return dist.get_global_rank(dist.ProcessGroup.unbox(process_group), group_rank)
    except (AttributeError, RuntimeError, ValueError):  # a group torch.distributed did not make
        return group_rank


def _nbytes(tensors):
    """Bytes of a tensor, or of a list of tensors or of lists of them (Tensor[][])."""
    if isinstance(tensors, (list, tuple)):
        return sum(_nbytes(item) for item in tensors)
    return tensors.numel() * tensors.element_size()


@dataclass
class CommCall:
    """One call DataParallel made to torch.nn.parallel.comm, as watch_data_parallel_comm saw it."""

    name: str      # "broadcast_coalesced" (replicate, forward) or "reduce_add_coalesced" (backward)
    tensors: int   # tensors per device
    nbytes: int    # bytes per device: all of them together
    devices: list  # broadcast: [source, destinations...]; reduce: one entry per replica summed

    def __str__(self):
        if self.name == "broadcast_coalesced":
            return (f"broadcast_coalesced: {self.tensors} tensors, {self.nbytes:,} bytes, "
                    f"from device {self.devices[0]} to devices {self.devices[1:]}")
        return (f"reduce_add_coalesced: {len(self.devices)} replicas' gradients, {self.nbytes:,} "
                f"bytes each, summed into the model's own .grad (on device_ids[0])")


@contextlib.contextmanager
def watch_data_parallel_comm():
    """Record DataParallel's copies, running torch's own replicate and its backward without GPUs.

    torch.nn.parallel.replicate copies the parameters with comm.broadcast_coalesced (inside the
    autograd function Broadcast), and Broadcast's backward sums the replicas' gradients with
    comm.reduce_add_coalesced. On GPUs both run NCCL's broadcast and reduce when torch was built
    with NCCL, and plain copies otherwise (torch/csrc/cuda/comm.cpp, torch/nn/parallel/comm.py).
    Inside this block both are stand-ins that record each call and return what the real ones
    return, on any device. Use a model on the "meta" device: Broadcast refuses CPU tensors.
    Everything else (replicate, the autograd functions, when backward reaches the reduce) is
    torch's. Yields a list of CommCall records in call order; append your own notes to it.
    """
    calls = []
    originals = data_parallel_comm.broadcast_coalesced, data_parallel_comm.reduce_add_coalesced

    def broadcast_coalesced(tensors, devices, buffer_size=None):
        calls.append(CommCall("broadcast_coalesced", len(tensors), _nbytes(tensors), list(devices)))
        # As torch's: the first device keeps the original tensors, every other gets a copy.
        return [list(tensors)] + [[tensor.detach().clone() for tensor in tensors]
                                  for _ in devices[1:]]

    def reduce_add_coalesced(inputs, destination=None, buffer_size=None):
        calls.append(CommCall("reduce_add_coalesced", len(inputs[0]), _nbytes(inputs[0]),
                              [tensors[0].get_device() for tensors in inputs]))
        return tuple(sum(same_tensor[1:], same_tensor[0].clone()) for same_tensor in zip(*inputs))

    data_parallel_comm.broadcast_coalesced = broadcast_coalesced
    data_parallel_comm.reduce_add_coalesced = reduce_add_coalesced
    try:
        yield calls
    finally:
        data_parallel_comm.broadcast_coalesced, data_parallel_comm.reduce_add_coalesced = originals
