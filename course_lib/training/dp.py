"""DataParallel's flow, step by step: scatter the batch, replicate the model, run the replicas
in parallel threads, gather the outputs. Runs on CPU "devices" (threads) and on GPUs alike.

The four steps keep the names of torch.nn.parallel's functions, so a learner who reads this
file can then read nn.DataParallel's source:

    chunks   = scatter(inputs, devices)                  # split the batch along dim 0
    replicas = replicate(module, devices[:len(chunks)])  # one model copy per chunk
    outputs  = parallel_apply(replicas, chunks, devices) # one Python thread per replica
    output   = gather(outputs, output_device)            # concatenate on one device

On GPUs, replicate() is torch.nn.parallel.replicate: parameters are broadcast with an autograd
function (Broadcast: comm.broadcast_coalesced forward, comm.reduce_add_coalesced backward; NCCL
when torch has it, plain copies otherwise), so the backward pass sums every replica's gradient
into the original parameters, and the next forward broadcasts them again. On
the CPU all replicas live on one device, so they simply share the original parameters and
autograd sums the gradients for us. Either way, loss.backward() after a DataParallel forward
gives the same gradients as one device computing the whole batch (up to float rounding).

Like nn.DataParallel, each replica sees only its chunk: BatchNorm computes its statistics per
chunk, and only the first replica's buffer updates (running_mean, ...) are kept.
"""
import contextlib
import copy
import threading
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["DataParallel", "ForwardRecord", "ReplicaError", "scatter", "replicate",
           "parallel_apply", "gather"]


class ReplicaError(RuntimeError):
    """A replica's forward raised; the original exception (and traceback) is the __cause__."""


@dataclass
class ForwardRecord:
    """What the last forward did, for drawing the flow: which device got how many samples."""

    devices: list = field(default_factory=list)       # e.g. ["cpu", "cpu"] or ["cuda:0", "cuda:1"]
    chunk_sizes: list = field(default_factory=list)   # samples per replica, e.g. [3, 2]
    output_device: str = ""


def scatter(inputs, devices, dim=0):
    """Split `inputs` into one chunk per device; returns a list with one entry per replica.

    Tensors are cut along `dim` with tensor.chunk (as nn.DataParallel does: 5 rows on 2 devices
    gives 3 + 2, 3 rows on 4 devices gives 3 chunks of 1) and moved to their device. Tuples,
    lists and dicts are scattered element by element; any other object is passed to every
    replica unchanged. The result may be shorter than `devices` when the batch is small.
    """
    if isinstance(inputs, torch.Tensor):
        if inputs.dim() == 0:
            raise ValueError("cannot scatter a 0-dim tensor along dim 0: DataParallel splits "
                             "each input tensor by rows; pass a tensor with a batch dimension")
        _check_input_device(inputs, devices)
        return [chunk.to(device) for chunk, device in zip(inputs.chunk(len(devices), dim), devices)]
    if isinstance(inputs, (tuple, list, dict)) and len(inputs) > 0:
        items = inputs.items() if isinstance(inputs, dict) else inputs
        per_replica = zip(*(scatter(item, devices, dim) for item in items))  # zip: shortest wins
        if isinstance(inputs, tuple) and hasattr(inputs, "_fields"):  # a namedtuple
            return [type(inputs)(*chunk) for chunk in per_replica]
        return [type(inputs)(chunk) for chunk in per_replica]
    return [inputs for _ in devices]


def replicate(module, devices):
    """Return one copy of `module` per device; gradients of every copy flow back to `module`."""
    if devices[0].type == "cuda":
        # Broadcast (an autograd function) copies the parameters; its backward sums the grads.
        return nn.parallel.replicate(module, devices, detach=not torch.is_grad_enabled())
    return [_shallow_copy(module, share_buffers=(index == 0)) for index in range(len(devices))]


def _shallow_copy(module, share_buffers):
    """A replica on the module's own device: the same Parameter objects, its own module tree.

    Sharing parameters is all replication means on one device; autograd then adds up each
    replica's gradient in param.grad. Buffers are shared with the first replica only, so, as in
    nn.DataParallel, only its running statistics are kept and threads never race on a buffer.
    """
    copies = {}
    for original in module.modules():
        replica = copy.copy(original)  # a new object whose __dict__ is a shallow copy
        replica._parameters = original._parameters.copy()
        replica._buffers = {name: buffer if share_buffers or buffer is None else buffer.clone()
                            for name, buffer in original._buffers.items()}
        copies[original] = replica
    for original, replica in copies.items():
        replica._modules = {name: None if child is None else copies[child]
                            for name, child in original._modules.items()}
    return copies[module]


def parallel_apply(replicas, inputs, devices, kwargs_per_replica=None):
    """Run replicas[i](*inputs[i], **kwargs_per_replica[i]) on devices[i], one thread each.

    Threads inherit the caller's grad mode and autocast state (both are thread-local in
    PyTorch). An exception in a replica is raised here as ReplicaError naming its device.
    """
    if not len(replicas) == len(inputs) == len(devices):
        raise ValueError(f"parallel_apply got {len(replicas)} replicas, {len(inputs)} inputs "
                         f"and {len(devices)} devices; pass one input and one device per replica")
    kwargs_per_replica = kwargs_per_replica or [{} for _ in replicas]
    # Grad mode, autocast and the current stream are thread-local: read them here, in the
    # caller's thread, and set them again in each replica's thread.
    grad_enabled = torch.is_grad_enabled()
    autocast_state = {d.type: (torch.is_autocast_enabled(d.type), torch.get_autocast_dtype(d.type))
                      for d in devices}
    streams = [torch.cuda.current_stream(d) if d.type == "cuda" else None for d in devices]
    results = [None] * len(replicas)

    def run_replica(index):
        device = devices[index]
        args = inputs[index] if isinstance(inputs[index], (tuple, list)) else (inputs[index],)
        try:
            with torch.set_grad_enabled(grad_enabled), _on_device(device, streams[index],
                                                                 autocast_state[device.type]):
                results[index] = replicas[index](*args, **kwargs_per_replica[index])
        except Exception as exc:  # re-raised in the caller's thread below
            results[index] = _Failure(exc)

    if len(replicas) == 1:
        run_replica(0)  # one replica: no thread needed (nn.DataParallel does the same)
    else:
        threads = [threading.Thread(target=run_replica, args=(i,)) for i in range(len(replicas))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for index, result in enumerate(results):
        if isinstance(result, _Failure):
            exc = result.exception
            raise ReplicaError(f"replica {index} on device {devices[index]} raised "
                               f"{type(exc).__name__}: {exc} (its traceback is shown above)"
                               ) from exc
    return results


@dataclass
class _Failure:
    exception: Exception


def _on_device(device, stream, autocast_state):
    """Make `device` current in this thread and enter the caller's autocast state."""
    contexts = contextlib.ExitStack()
    if device.type == "cuda":
        contexts.enter_context(torch.cuda.device(device))
        contexts.enter_context(torch.cuda.stream(stream))
    enabled, dtype = autocast_state
    contexts.enter_context(torch.autocast(device.type, enabled=enabled, dtype=dtype))
    return contexts


def gather(outputs, output_device, dim=0):
    """Concatenate the replicas' outputs on `output_device`, keeping their structure.

    Tensors are concatenated along `dim` (0-dim tensors, such as a loss, become a vector with
    one value per replica, as in nn.DataParallel); tuples, lists and dicts are gathered element
    by element; None stays None; any other object comes back as a list, one per replica.
    """
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        if first.dim() == 0:
            warnings.warn("gathering scalar outputs: returning a vector with one value per "
                          "replica; call .mean() or .sum() on it to get one number")
            outputs = [output.unsqueeze(0) for output in outputs]
        return torch.cat([output.to(output_device) for output in outputs], dim)
    if first is None:
        return None
    if isinstance(first, dict):
        return type(first)((key, gather([output[key] for output in outputs], output_device, dim))
                           for key in first)
    if isinstance(first, (tuple, list)):
        gathered = [gather(list(parts), output_device, dim) for parts in zip(*outputs)]
        is_namedtuple = isinstance(first, tuple) and hasattr(first, "_fields")
        return type(first)(*gathered) if is_namedtuple else type(first)(gathered)
    return list(outputs)


class DataParallel(nn.Module):
    """Split each batch across `devices`, run a replica of `module` on each, gather the outputs.

    devices: None (all GPUs, or two CPU devices without a GPU), a list of "cuda:i" / ints, or
    ["cpu", "cpu", ...]. scatter_fn(inputs, devices) replaces scatter() for inputs that are not
    tensors (a list of graphs, ...): it gets the forward's positional arguments as a tuple and
    returns one tuple of arguments per replica, already on that replica's device.
    """

    def __init__(self, module, devices=None, output_device=None, dim=0, scatter_fn=None):
        super().__init__()
        self.module = module
        self.devices = _as_devices(devices)
        self.output_device = torch.device(output_device) if output_device is not None \
            else self.devices[0]
        self.dim = dim
        self.scatter_fn = scatter_fn
        self.last_forward = ForwardRecord()
        _check_module_device(module, self.devices[0])

    def forward(self, *inputs, **kwargs):
        input_chunks, kwarg_chunks = self._scatter(inputs, kwargs)
        devices = self.devices[:len(input_chunks)]  # a small batch uses fewer devices
        replicas = replicate(self.module, devices)
        outputs = parallel_apply(replicas, input_chunks, devices, kwarg_chunks)
        chunk_sizes = [_batch_size(chunk, self.dim, custom=self.scatter_fn is not None)
                       for chunk in zip(input_chunks, kwarg_chunks)]
        self.last_forward = ForwardRecord([str(d) for d in devices], chunk_sizes,
                                          str(self.output_device))
        return gather(outputs, self.output_device, self.dim)

    def _scatter(self, inputs, kwargs):
        if self.scatter_fn is None:
            input_chunks = scatter(inputs, self.devices, self.dim) if inputs else []
        else:
            input_chunks = _checked_chunks(self.scatter_fn(inputs, self.devices), self.devices)
        kwarg_chunks = scatter(kwargs, self.devices, self.dim) if kwargs else []
        count = max(len(input_chunks), len(kwarg_chunks))
        if count == 0:
            raise ValueError("DataParallel got no inputs to scatter; call it with a batch")
        # As in torch.nn.parallel.scatter_kwargs: pad the shorter list so every replica has both.
        input_chunks = list(input_chunks) + [()] * (count - len(input_chunks))
        kwarg_chunks = list(kwarg_chunks) + [{}] * (count - len(kwarg_chunks))
        return input_chunks, kwarg_chunks


def _checked_chunks(chunks, devices):
    if not isinstance(chunks, (list, tuple)) or not 1 <= len(chunks) <= len(devices):
        got = f"{len(chunks)} chunks" if isinstance(chunks, (list, tuple)) else repr(type(chunks))
        raise ValueError(f"scatter_fn returned {got} for {len(devices)} devices; return a list "
                         f"with one tuple of forward arguments per device (1 to {len(devices)})")
    return [chunk if isinstance(chunk, tuple) else (chunk,) for chunk in chunks]


def _batch_size(chunk, dim, custom=False):
    """How many samples a replica got: the first tensor's size along dim, else len(first input).

    After a custom scatter, a list or tuple first argument holds the samples themselves (graphs,
    say), so its length counts, not the size of the first tensor inside it.
    """
    args, kwargs = chunk
    first = args[0] if args else next(iter(kwargs.values()), None)
    if custom and isinstance(first, (list, tuple)):
        return len(first)
    tensor = _first_tensor(chunk)
    if tensor is not None:
        return tensor.shape[dim] if tensor.dim() > 0 else 1
    return len(first) if hasattr(first, "__len__") else None


def _first_tensor(obj):
    if isinstance(obj, torch.Tensor):
        return obj
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (tuple, list)) else ()
    return next((t for t in map(_first_tensor, items) if t is not None), None)


def _as_devices(devices):
    if devices is None:
        gpu_count = torch.cuda.device_count()
        if gpu_count == 0:
            return [torch.device("cpu")] * 2  # two CPU "devices": the flow, run by threads
        return [torch.device("cuda", i) for i in range(gpu_count)]
    devices = [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in devices]
    if not devices:
        raise ValueError("DataParallel needs at least one device, e.g. devices=['cpu', 'cpu']")
    if len({d.type for d in devices}) > 1:
        raise ValueError(f"devices={[str(d) for d in devices]} mixes device types; use only "
                         "GPUs (['cuda:0', 'cuda:1']) or only CPUs (['cpu', 'cpu'])")
    if devices[0].type == "cuda":
        devices = [torch.device("cuda", d.index or 0) for d in devices]
        found = torch.cuda.device_count()
        if any(d.index >= found for d in devices):
            raise ValueError(f"devices={[str(d) for d in devices]} but {found} GPU(s) are "
                             "visible; pass fewer devices, or devices=['cpu', 'cpu'] without GPUs")
        if len(set(devices)) < len(devices):
            raise ValueError(f"devices={[str(d) for d in devices]} repeats a GPU; list each once")
    elif devices[0].type != "cpu":
        raise ValueError(f"DataParallel runs on 'cuda' or 'cpu' devices, got {devices[0]}")
    return devices


def _check_module_device(module, first_device):
    for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
        if not _same_device(tensor.device, first_device):
            raise ValueError(f"DataParallel replicates the module from devices[0]={first_device}, "
                             f"but {name} is on {tensor.device}; call module.to('{first_device}') "
                             "before wrapping it")


def _check_input_device(tensor, devices):
    if not (tensor.device.type == "cpu" or _same_device(tensor.device, devices[0])):
        raise ValueError(f"an input tensor is on {tensor.device}, but DataParallel scatters from "
                         f"devices[0]={devices[0]}; move the batch there (or leave it on the CPU)")


def _same_device(a, b):
    return a.type == b.type and (a.type == "cpu" or (a.index or 0) == (b.index or 0))
