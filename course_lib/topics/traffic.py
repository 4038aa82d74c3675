"""Counting what a rank sends: `with count_traffic() as traffic:` records the bytes this rank
sends and receives point-to-point, and the names of the collectives it calls.

It grades the ring all-reduce exercise: a ring sends about 2 (N - 1) / N times the tensor's
bytes per rank, the naive all-reduce makes rank 0 send (N - 1) times as much, and a solution
that just calls dist.all_reduce shows up in traffic.collectives.

    with count_traffic() as traffic:
        ring_all_reduce(tensor)
    traffic.bytes_sent, traffic.bytes_received, traffic.collectives

How it works: while the block runs, torch.distributed's functions (send, recv, isend, irecv,
batch_isend_irecv and the collectives below) are replaced, on the torch.distributed module
and on torch.distributed.distributed_c10d, by wrappers that record the call and then call the
original. On exit the originals are put back, even after an exception.

Limits, so that you read the numbers right:
- It sees calls made through the module, `dist.send(...)` or `torch.distributed.send(...)`.
  A name bound before the block (`from torch.distributed import send`) is not seen, nor are
  calls made from C++ (DDP's gradient all-reduce runs in its C++ Reducer).
- Bytes are counted for point-to-point calls only: tensor.numel() * tensor.element_size() as
  requested (a recv counts its buffer's size), without any protocol overhead. For collectives
  only the name is recorded: the bytes on the wire depend on the algorithm the backend picks.
- Only the outermost call is counted: dist.send is built on dist.isend, and counts once;
  dist.all_gather_object counts as the all_gather it makes.
- It counts this process only: each rank has its own Traffic. Return it from the function you
  launch to compare ranks. Blocks cannot be nested.
"""
import contextlib
import functools
import inspect
import threading
from collections import Counter
from dataclasses import dataclass, field

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

__all__ = ["count_traffic", "Traffic", "POINT_TO_POINT", "COLLECTIVES"]

POINT_TO_POINT = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
               "gather", "scatter", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
               "all_to_all_single", "barrier")
_SENDS, _RECEIVES = ("send", "isend"), ("recv", "irecv")


@dataclass
class Traffic:
    """What one rank did inside a count_traffic block (picklable: return it from a rank)."""

    rank: int = 0
    bytes_sent_to: Counter = field(default_factory=Counter)        # peer rank -> bytes
    bytes_received_from: Counter = field(default_factory=Counter)  # peer rank -> bytes
    collectives: list = field(default_factory=list)                # names, in call order

    @property
    def bytes_sent(self):
        return sum(self.bytes_sent_to.values())

    @property
    def bytes_received(self):
        return sum(self.bytes_received_from.values())


_state = threading.local()  # .counting: True while a wrapper is running, to count calls once
_active = []                # the Traffic of the open block, if any


@contextlib.contextmanager
def count_traffic():
    """Record this rank's point-to-point bytes and collective calls inside the block."""
    if _active:
        raise RuntimeError("count_traffic() is already counting in this process; close the "
                           "first block before opening another (blocks cannot be nested)")
    traffic = Traffic(rank=dist.get_rank() if dist.is_initialized() else 0)
    patched = []  # (module, name, original)
    for name in POINT_TO_POINT + COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:  # not in this torch version
            continue
        wrapper = _wrap(name, original, traffic)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                patched.append((module, name, original))
                setattr(module, name, wrapper)
    _active.append(traffic)
    try:
        yield traffic
    finally:
        for module, name, original in patched:
            setattr(module, name, original)
        _active.clear()


def _wrap(name, original, traffic):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if getattr(_state, "counting", False):  # called from inside another counted call
            return original(*args, **kwargs)
        _state.counting = True
        try:
            if name == "batch_isend_irecv":
                return _batch_isend_irecv(original, *args, **kwargs, traffic=traffic)
            _record(name, signature.bind(*args, **kwargs).arguments, traffic)
            return original(*args, **kwargs)
        finally:
            _state.counting = False

    return wrapper


def _record(name, arguments, traffic):
    if name in _SENDS:
        peer = _peer(arguments, "dst")
        traffic.bytes_sent_to[peer] += _nbytes(arguments["tensor"])
    elif name in _RECEIVES:
        peer = _peer(arguments, "src")
        traffic.bytes_received_from[peer] += _nbytes(arguments["tensor"])
    else:
        traffic.collectives.append(name)


def _batch_isend_irecv(original, p2p_op_list, traffic):
    # The original tells sends from receives with `op.op is isend`, comparing against the
    # module attribute we replaced: hand it ops that name the current (wrapped) functions,
    # then give the caller's ops back their own.
    own_ops = [op.op for op in p2p_op_list]
    for op in p2p_op_list:
        name = op.op.__name__
        key = "dst" if name == "isend" else "src"
        peers = {key: op.peer, f"group_{key}": getattr(op, "group_peer", None)}
        _record(name, {"tensor": op.tensor, **peers}, traffic)
        op.op = getattr(c10d, name)
    try:
        return original(p2p_op_list)
    finally:
        for op, own_op in zip(p2p_op_list, own_ops):
            op.op = own_op


def _peer(arguments, key):
    peer = arguments.get(key)
    if peer is None:  # torch >= 2.6 also accepts a rank within the group
        peer = arguments.get(f"group_{key}")
    return "any" if peer is None else int(peer)


def _nbytes(tensor):
    return tensor.numel() * tensor.element_size()
