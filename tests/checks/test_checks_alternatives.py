"""Every grader accepts correct answers written differently from the reference solution.

A grader stricter than its exercise's text teaches the learner that the right idea is wrong. For
each grader this file holds at least two correct answers that use other APIs, other algorithms or
other types than the solution notebook; each must pass. The wrong answers live in each grader
module's WRONG_ANSWERS (tests/checks/test_checks.py rejects them, at least three per grader).
"""
import importlib
import io
import itertools
import math
import os
import pkgutil
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import timedelta
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils import parameters_to_vector, vector_to_parameters
from torch.utils.data import DataLoader, DistributedSampler

import course_lib.checks as checks
from course_lib.checks import lesson00, lesson01, lesson02, lesson03, lesson04, lesson05, \
    lesson06, lesson07, lesson08, lesson09, lesson10, lesson11, lesson12, lesson13, lesson14, \
    passed_line
from course_lib.training.data import make_dataset
from course_lib.topics.collectives import ring_chunks
from course_lib.topics.memory import measure_training_step
from test_capstone import ALTERNATIVE_CONVERSIONS  # scripts that convert lesson 14's file correctly
from test_bucket_measure import BUCKET_ALTERNATIVES  # lesson 04's bucket sweep, answered 2 ways
from test_measured_graders import (ALPHA_BETA_ALTERNATIVES, HEALTH_ALTERNATIVES,  # measured here
                                   SCALING_ALTERNATIVES, THROUGHPUT_ALTERNATIVES, arguments_of)
from test_lesson15_ddp import LESSON15_ALTERNATIVES  # lesson 15's DDP from hooks
from test_lesson16_sharding import LESSON16_ALTERNATIVES  # lesson 16's ZeRO-1 and FSDP
from course_lib.training.checkpoint import write_atomically
from course_lib.training.dp import gather, parallel_apply, replicate, scatter

pytestmark = pytest.mark.timeout(300)

MIN_ALTERNATIVES = 2


def answer(description, *args, **kwargs):
    """A correct answer, as the arguments its grader is called with."""
    return pytest.param(args, kwargs, id=description)


# -- lesson 00 ----------------------------------------------------------------------------------

def whoami_from_the_environment_as_ints():
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def whoami_as_a_list_of_numpy_ints():
    return [np.int64(dist.get_rank()), np.int64(dist.get_world_size())]


# -- lesson 01 ----------------------------------------------------------------------------------

def global_batch_size_by_math_prod(batch_size, grad_accum_steps, world_size):
    return math.prod([batch_size, grad_accum_steps, world_size])


def global_batch_size_as_numpy(batch_size, grad_accum_steps, world_size):
    return np.int64(batch_size) * grad_accum_steps * world_size


# -- lesson 02 ----------------------------------------------------------------------------------

def scatter_with_split_sizes(inputs, devices):
    """torch.split with chunk's size, ceil(rows / devices); containers by explicit loops."""
    if isinstance(inputs, torch.Tensor):
        size = math.ceil(len(inputs) / len(devices))
        return [part.to(device) for part, device in zip(inputs.split(size), devices)]
    if isinstance(inputs, dict):
        scattered = {key: scatter_with_split_sizes(value, devices) for key, value in inputs.items()}
        replicas = min(map(len, scattered.values()))
        return [dict((key, parts[i]) for key, parts in scattered.items()) for i in range(replicas)]
    if isinstance(inputs, (list, tuple)):
        scattered = [scatter_with_split_sizes(item, devices) for item in inputs]
        replicas = min(map(len, scattered))
        return [type(inputs)(parts[i] for parts in scattered) for i in range(replicas)]
    return [inputs] * len(devices)


def scatter_with_narrow(inputs, devices):
    """Row ranges with tensor.narrow; tuples and lists rebuilt with map."""
    if isinstance(inputs, torch.Tensor):
        rows, step = inputs.shape[0], -(-inputs.shape[0] // len(devices))
        starts = range(0, rows, step)
        return [inputs.narrow(0, start, min(step, rows - start)).to(device)
                for start, device in zip(starts, devices)]
    if isinstance(inputs, dict):
        keys = list(inputs)
        columns = zip(*(scatter_with_narrow(inputs[key], devices) for key in keys))
        return [dict(zip(keys, column)) for column in columns]
    if isinstance(inputs, tuple):
        return list(map(tuple, zip(*(scatter_with_narrow(item, devices) for item in inputs))))
    if isinstance(inputs, list):
        return list(map(list, zip(*(scatter_with_narrow(item, devices) for item in inputs))))
    return [inputs for _ in devices]


def gather_into_a_preallocated_tensor(outputs, output_device):
    if isinstance(outputs[0], tuple):
        return tuple(gather_into_a_preallocated_tensor(list(parts), output_device)
                     for parts in zip(*outputs))
    rows = sum(output.shape[0] for output in outputs)
    result = torch.empty((rows, *outputs[0].shape[1:]), dtype=outputs[0].dtype,
                         device=output_device)
    start = 0
    for output in outputs:
        result[start:start + len(output)] = output.to(output_device)
        start += len(output)
    return result


def gather_by_pairwise_concatenation(outputs, output_device):
    if isinstance(outputs[0], tuple):
        return tuple(map(lambda parts: gather_by_pairwise_concatenation(list(parts), output_device),
                         zip(*outputs)))
    result = outputs[0].to(output_device)
    for output in outputs[1:]:
        result = torch.cat((result, output.to(output_device)))
    return result


def gradients_from_a_summed_loss(model, X, y, devices):
    """Sum of per-replica summed losses, divided by the whole batch: the same mean."""
    for parameter in model.parameters():
        parameter.grad = None
    chunks, labels = scatter(X, devices), scatter(y, devices)
    used = devices[:len(chunks)]
    outputs = parallel_apply(replicate(model, used), chunks, used)
    loss = sum(F.cross_entropy(output, label, reduction="sum")
               for output, label in zip(outputs, labels)) / len(X)
    loss.backward()
    return [parameter.grad for parameter in model.parameters()]


def gradients_with_autograd_grad(model, X, y, devices):
    chunks = scatter(X, devices)
    used = devices[:len(chunks)]
    logits = gather(parallel_apply(replicate(model, used), chunks, used), devices[0])
    loss = F.nll_loss(F.log_softmax(logits, dim=1), y)
    return list(torch.autograd.grad(loss, list(model.parameters())))


def gradients_through_the_course_wrapper(model, X, y, devices):
    """course_lib's DataParallel module runs the four steps itself; a loss summed, then divided."""
    from course_lib.training.dp import DataParallel

    model.zero_grad(set_to_none=True)
    logits = DataParallel(model, devices=devices)(X)
    (F.cross_entropy(logits, y, reduction="sum") / len(y)).backward()
    return [parameter.grad.clone() for parameter in model.parameters()]


# -- lesson 03 ----------------------------------------------------------------------------------

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


# -- lesson 04 ----------------------------------------------------------------------------------

def broadcast_one_flat_vector(model):
    vector = parameters_to_vector(model.parameters()).detach()
    dist.broadcast(vector, src=0)
    with torch.no_grad():
        vector_to_parameters(vector, model.parameters())
    handles = [dist.broadcast(buffer, src=0, async_op=True) for buffer in model.buffers()]
    for handle in handles:
        handle.wait()


def broadcast_the_state_dict_as_objects(model):
    state = [model.state_dict() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(state, src=0)
    model.load_state_dict(state[0])


def train_step_with_one_flat_all_reduce(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    grads = [parameter.grad for parameter in model.parameters()]
    flat = torch.cat([grad.flatten() for grad in grads]) / dist.get_world_size()
    dist.all_reduce(flat)
    start = 0
    for grad in grads:
        grad.copy_(flat[start:start + grad.numel()].view_as(grad))
        start += grad.numel()
    optimizer.step()
    return loss.item()


def train_step_with_all_gather(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for parameter in model.parameters():
        everyone = [torch.empty_like(parameter.grad) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, parameter.grad)
        parameter.grad = torch.stack(everyone).mean(dim=0)
    optimizer.step()
    return float(loss)


def indices_from_distributed_sampler(n_samples, epoch, seed=0, drop_last=False):
    sampler = DistributedSampler(range(n_samples), shuffle=True, seed=seed,  # the group's rank
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    return list(sampler)


def indices_with_a_cycle(n_samples, epoch, seed=0, drop_last=False):
    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])  # torchrun's
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(n_samples, generator=generator)
    rows = n_samples // world_size if drop_last else math.ceil(n_samples / world_size)
    total = rows * world_size
    if total == 0:
        return torch.empty(0, dtype=torch.long)
    padded = torch.tensor(list(itertools.islice(itertools.cycle(order.tolist()), total)))
    return padded.view(-1, world_size)[:, rank]  # a tensor, not a list


def hidden_share_by_sampling_time(timeline, rank, step):
    """A million instants across the all-reduces: which are all-reducing, and which of those
    backward was still computing. Approximate (the grader allows 0.01); a numpy float."""
    allreduces = timeline.select(rank, step, "allreduce")
    if len(allreduces) == 0:
        return None
    backward = timeline.select(rank, step, "backward")[0]
    wait = timeline.select(rank, step, "wait")[0]
    first, last = min(s.start for s in allreduces), max(s.end for s in allreduces)
    instants = np.linspace(first, last, 1_000_001)
    busy = np.zeros(instants.shape, dtype=bool)
    for span in allreduces:
        busy |= (instants >= span.start) & (instants < span.end)
    computing = (instants >= backward.start) & (instants < wait.start)
    return np.mean(busy & computing) / np.mean(busy)  # a numpy float


def hidden_share_by_a_sweep(timeline, rank, step):
    """Walk the span boundaries in time order, counting the buckets in flight; a 0-dim tensor."""
    spans = [span for span in timeline.spans if span.rank == rank and span.step == step]
    edges = sorted([(s.start, +1) for s in spans if s.lane == "comm"]
                   + [(s.end, -1) for s in spans if s.lane == "comm"])
    if not edges:
        return None
    computing_until = next(s.start for s in spans if s.phase == "wait")
    in_flight, previous, hidden, total = 0, None, 0.0, 0.0
    for time, change in edges:
        if in_flight > 0:
            total += time - previous
            hidden += max(0.0, min(time, computing_until) - previous)
        in_flight, previous = in_flight + change, time
    return torch.tensor(hidden / total)


# -- lesson 05 ----------------------------------------------------------------------------------

def accumulation_grouped_with_exit_stack(ddp_model, optimizer, micro_batches, grad_accum_steps):
    losses = []
    groups = zip(*[iter(micro_batches)] * grad_accum_steps)
    for group in groups:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for index, (X, y) in enumerate(group):
            with ExitStack() as stack:
                if index < grad_accum_steps - 1:
                    stack.enter_context(ddp_model.no_sync())
                loss = F.cross_entropy(ddp_model(X), y).div(grad_accum_steps)
                loss.backward()
            total += loss.detach()
        optimizer.step()
        losses.append(total)  # 0-dim tensors: float() of each gives the number
    return losses


def accumulation_by_mean_of_losses(ddp_model, optimizer, micro_batches, grad_accum_steps):
    losses, pending = [], []
    for X, y in micro_batches:
        pending.append((X, y))
        if len(pending) < grad_accum_steps:
            continue
        values = []
        with ddp_model.no_sync():
            for X_micro, y_micro in pending[:-1]:
                loss = F.cross_entropy(ddp_model(X_micro), y_micro)
                (loss * (1 / grad_accum_steps)).backward()
                values.append(loss.item())
        loss = F.cross_entropy(ddp_model(pending[-1][0]), pending[-1][1])
        (loss * (1 / grad_accum_steps)).backward()
        values.append(loss.item())
        optimizer.step()
        for parameter in ddp_model.parameters():
            parameter.grad = None
        losses.append(statistics.fmean(values))
        pending = []
    return losses


def accumulation_around_ddp(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """The first micro-batches through the wrapped module itself, which DDP never sees (so no
    hook, no all-reduce); the last through DDP, whose backward all-reduces the sum."""
    losses, step_loss = [], 0.0
    for micro_step, (X, y) in enumerate(micro_batches):
        last = micro_step % grad_accum_steps == grad_accum_steps - 1
        model = ddp_model if last else ddp_model.module
        loss = F.cross_entropy(model(X), y)
        loss.mul(1 / grad_accum_steps).backward()
        step_loss += loss.item() / grad_accum_steps
        if last:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(np.float32(step_loss))
            step_loss = 0.0
    return losses


# -- lesson 06 ----------------------------------------------------------------------------------

def round_trip_with_half_and_float(grads, scale):
    return grads.mul(scale).half().float().div(scale)


def round_trip_through_numpy(grads, scale):
    with np.errstate(over="ignore"):  # large values overflow to inf, as in the cast to fp16
        scaled = (grads.numpy() * np.float32(scale)).astype(np.float16)
    return torch.from_numpy(scaled.astype(np.float32) / np.float32(scale))


def amp_step_with_amp_autocast(model, optimizer, scaler, X, y, max_norm):
    for parameter in model.parameters():
        parameter.grad = None
    with torch.amp.autocast("cpu", dtype=torch.float16):
        logits = model(X)
        loss = F.cross_entropy(logits, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(parameters, max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach())


def amp_step_zeroing_after_the_step(model, optimizer, scaler, X, y, max_norm):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(X), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    model.zero_grad()  # ready for the next step
    return loss.detach()  # a 0-dim tensor


def amp_accumulation_zeroing_at_the_end(model, optimizer, scaler, micro_batches, max_norm):
    losses = []
    for X, y in micro_batches:
        with torch.autocast(device_type=X.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(X), y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach().float())
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return torch.stack(losses).mean().item()


def amp_accumulation_weighted_by_samples(model, optimizer, scaler, micro_batches, max_norm):
    model.zero_grad(set_to_none=True)
    samples = sum(len(X) for X, _ in micro_batches)
    total = 0.0
    for X, y in micro_batches:
        with torch.autocast(device_type=X.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(X), y, reduction="sum") / samples
        scaler.scale(loss).backward()
        total += loss.item()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total


def amp_accumulation_clipping_by_hand(model, optimizer, scaler, micro_batches, max_norm):
    # clips by hand after unscale_, with torch.linalg norms; returns a 0-dim tensor
    for parameter in model.parameters():
        parameter.grad = None
    losses = []
    for X, y in micro_batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(X), y)
        scaler.scale(loss * (1 / len(micro_batches))).backward()
        losses.append(loss.detach())
    scaler.unscale_(optimizer)
    grads = [p.grad for p in model.parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for grad in grads:
        grad.mul_(factor)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()

# -- lesson 07 ----------------------------------------------------------------------------------

def atomic_save_with_named_temporary_file(state, path):
    path = Path(path)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".saving-", delete=False) as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    Path(file.name).replace(path)


def atomic_save_by_name_then_fsync(state, path):
    temporary = f"{path}.partial"
    torch.save(state, temporary)
    descriptor = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.rename(temporary, path)


def save_with_all_gather_of_rng_tensors(path, ddp_model, optimizer, step):
    mine = torch.get_rng_state()
    states = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(states, mine)
    if dist.get_rank() == 0:
        state = {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "step": step, "rng": torch.stack(states)}
        lesson07.reference_atomic_save(state, path)
    dist.barrier()


def load_rng_from_a_stacked_tensor(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.random.set_rng_state(state["rng"][dist.get_rank()].clone())
    return state["step"]


def save_with_gather_object_to_rank0(path, ddp_model, optimizer, step):
    rank = dist.get_rank()
    states = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(torch.get_rng_state(), states, dst=0)
    if rank == 0:
        write_atomically({"weights": ddp_model.module.state_dict(), "optim": optimizer.state_dict(),
                          "step": step, "rng_per_rank": {str(r): s for r, s in enumerate(states)}},
                         path)
    dist.all_reduce(torch.zeros(1))  # a barrier of our own: every rank waits for rank 0's save


def load_rng_from_a_dict(path, model, optimizer):
    state = torch.load(path, map_location=torch.device("cpu"), weights_only=True)
    model.load_state_dict(state["weights"], strict=True)
    optimizer.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng_per_rank"][str(dist.get_rank())])
    return int(state["step"])


def prune_with_glob_and_regex(directory, keep_last):
    numbered = []
    for path in Path(directory).glob("step_*.pt"):
        match = re.fullmatch(r"step_(\d+)\.pt", path.name)
        if match:
            numbered.append((int(match.group(1)), path))
    numbered.sort()
    for _, path in numbered[:-keep_last] if keep_last else numbered:
        path.unlink()


def prune_with_listdir_and_remove(directory, keep_last):
    def step_of(name):
        if name.startswith("step_") and name.endswith(".pt") and name[5:-3].isdigit():
            return int(name[5:-3])
        return None

    names = [name for name in os.listdir(directory) if step_of(name) is not None]
    newest_first = sorted(names, key=step_of, reverse=True)
    for name in newest_first[keep_last:]:
        os.remove(os.path.join(directory, name))


def atomic_save_from_bytes_with_os_write(state, path):
    buffer = io.BytesIO()
    torch.save(state, buffer)  # serialise in memory, then write the bytes by hand
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(descriptor, buffer.getvalue())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)


def save_with_serialization_save_and_mkstemp(path, ddp_model, optimizer, step):
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, torch.random.get_rng_state())
    if dist.get_rank() == 0:
        descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".partial")
        with os.fdopen(descriptor, "wb") as file:
            torch.serialization.save({"model": ddp_model.module.state_dict(), "step": step,
                                      "optimizer": optimizer.state_dict(), "rng": states}, file)
            file.flush()
            os.fsync(file.fileno())
        os.rename(temporary, path)
    dist.monitored_barrier() if dist.get_backend() == "gloo" else dist.barrier()


def load_with_the_default_weights_only(path, model, optimizer):
    state = torch.load(path, map_location="cpu")  # weights_only=True is the default since 2.6
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]

def load_on_rank0_and_broadcast(path, model, optimizer):
    # only rank 0 reads the file; the others get the state by broadcast
    received = [torch.load(path, map_location="cpu", weights_only=True)
                if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(received, src=0)
    state = received[0]
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]

# -- lesson 08 ----------------------------------------------------------------------------------

def mean_loss_with_all_gather_printed_to_stderr(loss):
    everyone = [torch.zeros_like(loss) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, loss.detach())
    mean = torch.stack(everyone).mean()
    if dist.get_rank() == 0:
        print(f"[step] loss averaged over ranks: {mean.item():.6f}", file=sys.stderr)
    return mean


def mean_loss_printing_the_tensor(loss):
    total = loss.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    mean = total / dist.get_world_size()
    if not dist.get_rank():
        print(mean)
    return mean.item()


def wrap_with_static_graph(model):
    return DDP(model, static_graph=True)


def wrap_after_freezing_the_unused_branch(model):
    model.unused_head.requires_grad_(False)  # DDP only waits for parameters that need a gradient
    return DDP(model)


def indices_with_a_new_sampler_each_epoch(dataset, epochs=3, batch_size=4):
    seen = []
    for epoch in range(epochs):
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)
        sampler.set_epoch(epoch)
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        seen.append([index for (batch,) in loader for index in batch.tolist()])
    return seen


def indices_straight_from_the_sampler(dataset, epochs=3, batch_size=4):
    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(),
                                 rank=dist.get_rank(), shuffle=True, seed=0)
    orders = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        orders.append([int(dataset[index][0]) for index in sampler])
    return orders


def save_then_monitored_barrier(model, path):
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    dist.monitored_barrier()


def wrap_only_the_body(model):
    return DDP(model.body)  # forward is the body's: DDP gets only what trains


def save_atomically_then_all_reduce(model, path):
    if dist.get_rank() == 0:
        partial = f"{path}.partial"
        torch.save(model.state_dict(), partial)
        os.replace(partial, path)  # the name points at a complete file, or at the old one
    dist.all_reduce(torch.zeros(1))  # every rank: returns once rank 0 has renamed


def save_then_broadcast_a_flag(model, path):
    done = torch.zeros(1)
    if dist.get_rank() == 0:
        torch.save({name: tensor.cpu() for name, tensor in model.state_dict().items()}, path)
        done += 1
    dist.broadcast(done, src=0)  # the others block here until rank 0 has saved


# -- lesson 09 ----------------------------------------------------------------------------------

def all_reduce_seconds_from_the_cost_model(n_parameters, world_size, alpha, beta,
                                           bytes_per_parameter=4):
    from course_lib.topics.cost_model import ring_all_reduce_time

    return ring_all_reduce_time(n_parameters * bytes_per_parameter, world_size, alpha, beta)


def all_reduce_seconds_per_step(n_parameters, world_size, alpha, beta, bytes_per_parameter=4):
    steps = 2 * (world_size - 1)
    chunk_bytes = n_parameters * bytes_per_parameter / world_size
    return np.float64(steps * (alpha + chunk_bytes * beta))


def plan_by_decreasing_batch(global_batch_size, max_batch_size, world_size):
    per_rank, remainder = divmod(global_batch_size, world_size)
    if remainder:
        raise ValueError("the global batch does not split evenly over the ranks")
    for batch_size in range(min(max_batch_size, per_rank), 0, -1):
        if per_rank % batch_size == 0:
            return [batch_size, per_rank // batch_size]


def plan_from_divisors(global_batch_size, max_batch_size, world_size):
    if global_batch_size % world_size != 0:
        raise ValueError(f"{global_batch_size} does not divide by {world_size}")
    per_rank = global_batch_size // world_size
    steps = next(k for k in itertools.count(math.ceil(per_rank / max_batch_size))
                 if per_rank % k == 0)
    return np.int64(per_rank // steps), np.int64(steps)


# -- lesson 10 ----------------------------------------------------------------------------------

def lesson10_measurement():
    """A real measurement of lesson 10's loader (fewer steps than the lesson's 20, to be quick)."""
    from course_lib.topics.input_pipeline import SlowDataset, device_step, measure_data_wait

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    return measure_data_wait(DataLoader(dataset, batch_size=32, shuffle=True), device_step(0.020),
                             steps=6, warmup=1)


LESSON10_MEASUREMENT = lesson10_measurement()


def loader_report_with_numpy(measurement):
    data, compute = np.float64(measurement["data"]), np.float64(measurement["compute"])
    share = data / (data + compute)
    return measurement, share, np.ceil(1.5 * data / compute).astype(np.int64)


def loader_report_from_data_wait_share(measurement):
    from course_lib.topics.input_pipeline import data_wait_share

    share = data_wait_share(measurement)
    workers = -(-1.5 * measurement["data"] // measurement["compute"])  # a ceiling by floor division
    return measurement, Fraction(share).limit_denominator(10**9), int(workers)


def loader_with_an_explicit_distributed_sampler():
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), seed=7)
    return DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=4, prefetch_factor=4,
                      persistent_workers=True)


def loader_with_a_hand_made_share_and_more_workers():
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(1)).tolist()
    share = order[dist.get_rank()::dist.get_world_size()]  # a list is a sampler too
    return DataLoader(dataset, batch_size=32, sampler=share, num_workers=6)


def loader_with_a_batch_sampler():
    from torch.utils.data import BatchSampler
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    batches = BatchSampler(DistributedSampler(dataset), 32, False)
    return DataLoader(dataset, batch_sampler=batches, num_workers=4)


def loader_over_a_subset():
    from torch.utils.data import Subset
    from course_lib.topics.input_pipeline import SlowDataset

    dataset = SlowDataset(features_path=lesson10._features_file("right"))
    share = Subset(dataset, range(dist.get_rank(), len(dataset), dist.get_world_size()))
    return DataLoader(share, batch_size=32, shuffle=True, num_workers=5)


# -- lesson 11 ----------------------------------------------------------------------------------

def zero_bytes_with_branches(stage, world_size):
    if stage == 0:
        return 16.0
    if stage == 1:
        return 4 + 12 / world_size
    if stage == 2:
        return 2 + 14 / world_size
    return 16 / world_size


def zero_bytes_from_what_is_sharded(stage, world_size):
    parts = {"weights": (2, 3), "gradients": (2, 2), "optimizer state": (12, 1)}
    return sum(Fraction(size, world_size) if stage >= sharded_from else size
               for size, sharded_from in parts.values())  # a Fraction


def largest_batch_by_bisection():
    # Measure real steps, and bisect on the batch size: no model of the memory at all
    def step_bytes(batch_size):
        model = lesson11.make_model(seed=0, hidden=256)
        X, y = torch.zeros(batch_size, 16), torch.zeros(batch_size, dtype=torch.long)
        return measure_training_step(model, torch.optim.Adam(model.parameters()), X, y).total

    low, high = 1, 4096  # step_bytes(low) fits, step_bytes(high) does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if step_bytes(middle) <= 1_000_000 else (low, middle)
    return low


def largest_batch_from_two_measurements():
    steps = {}
    for batch_size in (64, 192):
        model = lesson11.make_model(seed=0, hidden=256)
        X, y = torch.randn(batch_size, 16), torch.randint(0, 4, (batch_size,))
        steps[batch_size] = measure_training_step(model, torch.optim.Adam(model.parameters()), X, y)
    per_sample = (steps[192].activations - steps[64].activations) // 128  # the slope
    fixed = steps[64].total - 64 * per_sample  # model state and the batch's scalar
    return np.int64((1_000_000 - fixed) // per_sample)


def recipes_with_filter(n_parameters, gpu_memory_bytes, world_size, activation_bytes):
    from course_lib.topics.memory import estimate_memory

    def fits(recipe):
        estimate = estimate_memory(n_parameters, recipe.optimizer, recipe.precision,
                                   recipe.strategy, world_size, activation_bytes)
        return estimate.total <= gpu_memory_bytes

    return list(filter(fits, lesson11.RECIPES))


def recipes_as_a_tuple_of_plain_tuples(n_parameters, gpu_memory_bytes, world_size,
                                       activation_bytes):
    from course_lib.topics.memory import estimate_memory

    kept = []
    for optimizer, precision, strategy in ((r.optimizer, r.precision, r.strategy)
                                           for r in lesson11.RECIPES):
        if estimate_memory(n_parameters, optimizer, precision, strategy, world_size,
                           activation_bytes).fits(gpu_memory_bytes):
            kept.append(tuple(lesson11.Recipe(optimizer=optimizer, precision=precision,
                                              strategy=strategy)))
    return tuple(kept)


# -- lesson 12 ----------------------------------------------------------------------------------

def global_rank_by_counting(node_rank, local_rank, nproc_per_node):
    return sum(nproc_per_node for _ in range(node_rank)) + local_rank


def global_rank_as_numpy(node_rank, local_rank, nproc_per_node):
    return np.ravel_multi_index((node_rank, local_rank), (node_rank + 1, nproc_per_node))


def ranks_on_my_node_from_a_tensor():
    node_ranks = torch.zeros(dist.get_world_size(), dtype=torch.long)
    mine = torch.tensor([int(os.environ["GROUP_RANK"])])
    dist.all_gather(list(node_ranks.split(1)), mine)  # views: each rank's slot of node_ranks
    return torch.nonzero(node_ranks == mine).flatten()  # a tensor of ranks


def ranks_on_my_node_from_local_ranks():
    # My node's first rank is my rank minus my LOCAL_RANK; LOCAL_WORLD_SIZE says how many follow
    first = dist.get_rank() - int(os.environ["LOCAL_RANK"])
    return tuple(np.arange(first, first + int(os.environ["LOCAL_WORLD_SIZE"])))  # numpy ints


# -- lesson 13 ----------------------------------------------------------------------------------

def end_of_epoch_with_all_gather_and_an_object(epoch_loss, lr):
    losses = [torch.zeros(1, dtype=torch.float64) for _ in range(dist.get_world_size())]
    dist.all_gather(losses, torch.tensor([epoch_loss], dtype=torch.float64))
    shared = [lr]
    dist.broadcast_object_list(shared, src=0)  # rank 0's float, pickled
    return torch.cat(losses).mean(), shared[0]  # a 0-d tensor and a float


def end_of_epoch_in_one_all_reduce(epoch_loss, lr):
    # Rank 0 adds its lr, the others add 0: the sum is rank 0's lr
    values = torch.tensor([epoch_loss / dist.get_world_size(),
                           lr if dist.get_rank() == 0 else 0.0], dtype=torch.float64)
    dist.all_reduce(values)
    return [np.float64(values[0]), values[1].item()]  # a list


def load_data_with_a_broadcast_as_barrier(folder):
    path = Path(folder) / "data.pt"
    if dist.get_rank() == 0 and not path.exists():
        X, y = make_dataset(n_samples=256).tensors
        torch.save((X, y), str(path))
    dist.broadcast(torch.zeros(1), src=0)  # no rank passes it before rank 0 reaches it
    return list(torch.load(str(path)))


def load_data_written_atomically(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.isfile(path):
        partial = path + ".partial"
        torch.save(make_dataset(n_samples=256).tensors, partial)
        os.replace(partial, path)
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    X, y = torch.load(path)
    return X, y


def load_data_renamed_whole_while_the_others_poll(folder):
    # no barrier: rank 0 writes elsewhere and renames, so the name appears only on a whole file
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.exists(path):
        with tempfile.NamedTemporaryFile(dir=folder, delete=False) as partial:
            torch.save(make_dataset(n_samples=256).tensors, partial)
        os.replace(partial.name, path)
    while not os.path.exists(path):
        time.sleep(0.01)
    return torch.load(path)


def step_and_loss_with_all_gather(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    every = [torch.zeros(()) for _ in range(dist.get_world_size())]
    dist.all_gather(every, loss.detach())
    return torch.stack(every).mean()  # a 0-d tensor


def step_and_loss_weighted_by_samples(model, optimizer, X, y):
    optimizer.zero_grad()
    output = model(X)
    F.cross_entropy(output, y).backward()
    optimizer.step()
    totals = torch.tensor([F.cross_entropy(output.detach(), y, reduction="sum").item(), len(y)],
                          dtype=torch.float64)
    dist.all_reduce(totals)  # the summed loss and the number of samples of the global batch
    return float(totals[0] / totals[1])


def hand_ddp_dividing_before_each_all_reduce(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        param.grad /= dist.get_world_size()
        dist.all_reduce(param.grad)
    optimizer.step()
    return loss.item()


def hand_ddp_with_a_scaled_loss(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    (loss / dist.get_world_size()).backward()  # each rank's share of the mean: the sum is the mean
    grads = [param.grad for param in model.parameters()]
    flat = parameters_to_vector(grads)
    dist.all_reduce(flat)
    vector_to_parameters(flat, grads)  # into the same gradient tensors
    optimizer.step()
    return loss


def add_noise_from_a_spawn_key(X, step, seed=0):
    sequence = np.random.SeedSequence(seed, spawn_key=(step, int(os.environ["RANK"])))
    generator = np.random.Generator(np.random.PCG64(sequence))
    return X + torch.from_numpy(generator.normal(0.0, 0.1, size=tuple(X.shape))).to(X.dtype)


def add_noise_from_python_random_seeded_by_text(X, step, seed=0):
    import random

    generator = random.Random(f"{seed}/{step}/{dist.get_rank()}")  # text: all of it seeds (sha512)
    return X + 0.1 * torch.tensor([generator.gauss(0.0, 1.0) for _ in range(X.numel())],
                                  dtype=X.dtype).view(X.shape)


def loader_with_three_workers_and_more_prefetch(dataset):
    sampler = DistributedSampler(dataset, num_replicas=int(os.environ["WORLD_SIZE"]),
                                 rank=int(os.environ["RANK"]), shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=3, prefetch_factor=4)


class ThreadedBatches:
    """Each batch's 16 reads at once, in threads (a read sleeps, so the GIL is free): no workers."""

    def __init__(self, dataset):
        self.dataset, self.sampler = dataset, DistributedSampler(dataset, shuffle=True, seed=0)
        self.pool = ThreadPoolExecutor(16)

    def __iter__(self):
        indices = list(self.sampler)
        for start in range(0, len(indices), 16):
            samples = list(self.pool.map(self.dataset.__getitem__, indices[start:start + 16]))
            yield torch.stack([X for X, _ in samples]), torch.stack([y for _, y in samples])


def wrap_with_static_graph(model):
    return DDP(model, static_graph=True)


def wrap_with_bucket_views(model):
    return DDP(model, find_unused_parameters=False, gradient_as_bucket_view=True, bucket_cap_mb=1)


ALTERNATIVES = {
    lesson00.check_whoami: [
        answer("environment strings made ints", whoami_from_the_environment_as_ints),
        answer("a list of numpy ints", whoami_as_a_list_of_numpy_ints),
    ],
    lesson00.check_where_output_goes: [
        answer("tuples", ("[rank0] rank 0 has total 1",), (1, 2), 0),
        answer("numpy results, a float total", ["[rank0] rank 0 has total 1"], np.array([1, 2]),
               0.0),
    ],
    lesson01.check_throughput: THROUGHPUT_ALTERNATIVES,
    lesson01.check_global_batch_size: [
        answer("math.prod", global_batch_size_by_math_prod),
        answer("a numpy integer", global_batch_size_as_numpy),
    ],
    lesson02.check_scatter_batch: [
        answer("torch.split with ceil sizes", scatter_with_split_sizes),
        answer("tensor.narrow and map", scatter_with_narrow),
    ],
    lesson02.check_gather_outputs: [
        answer("copies into a preallocated tensor", gather_into_a_preallocated_tensor),
        answer("concatenates pairwise", gather_by_pairwise_concatenation),
    ],
    lesson02.check_data_parallel_gradients: [
        answer("summed per-replica losses over the batch size", gradients_from_a_summed_loss),
        answer("torch.autograd.grad with nll_loss", gradients_with_autograd_grad),
        answer("the course's DataParallel module, a summed loss",
               gradients_through_the_course_wrapper),
    ],
    lesson03.check_collective_puzzle: [
        answer("a tuple", (63, 66, 69)),
        answer("numpy floats", np.array([63.0, 66.0, 69.0])),
    ],
    lesson03.check_ring_all_reduce: [
        answer("dist.isend/irecv", ring_with_isend_irecv),
        answer("batch_isend_irecv", ring_with_batched_p2p_ops),
    ],
    lesson03.check_measure_alpha_beta: ALPHA_BETA_ALTERNATIVES,
    lesson04.check_broadcast_parameters: [
        answer("one flat vector", broadcast_one_flat_vector),
        answer("broadcast_object_list of the state_dict", broadcast_the_state_dict_as_objects),
    ],
    lesson04.check_train_step_by_hand: [
        answer("one flat all-reduce, divided first", train_step_with_one_flat_all_reduce),
        answer("all_gather and mean", train_step_with_all_gather),
    ],
    lesson04.check_indices_for_rank: [
        answer("DistributedSampler itself, rank from the group", indices_from_distributed_sampler),
        answer("itertools.cycle padding, a tensor, rank from the environment",
               indices_with_a_cycle),
    ],
    lesson04.check_hidden_share: [
        answer("sampling a million instants, a numpy float", hidden_share_by_sampling_time),
        answer("a sweep over the span boundaries, a tensor", hidden_share_by_a_sweep),
    ],
    lesson04.check_best_bucket_cap: BUCKET_ALTERNATIVES,
    lesson05.check_train_with_accumulation: [
        answer("groups with an ExitStack, tensor losses", accumulation_grouped_with_exit_stack),
        answer("buffers a group, mean of undivided losses", accumulation_by_mean_of_losses),
        answer("the first micro-batches around DDP, through its module, numpy losses",
               accumulation_around_ddp),
    ],
    lesson06.check_fp16_round_trip: [
        answer(".half() and .float()", round_trip_with_half_and_float),
        answer("through numpy", round_trip_through_numpy),
    ],
    lesson06.check_amp_step: [
        answer("torch.amp.autocast, grads set to None by hand", amp_step_with_amp_autocast),
        answer("zeroes after the step, returns a tensor", amp_step_zeroing_after_the_step),
    ],
    lesson06.check_amp_accumulation_step: [
        answer("zeroes at the end, mean of losses", amp_accumulation_zeroing_at_the_end),
        answer("summed losses over all samples", amp_accumulation_weighted_by_samples),
        answer("clips by hand after unscale_, a tensor loss", amp_accumulation_clipping_by_hand),
    ],
    lesson07.check_atomic_save: [
        answer("NamedTemporaryFile in the folder, Path.replace",
               atomic_save_with_named_temporary_file),
        answer("torch.save by name, fsync a descriptor, os.rename",
               atomic_save_by_name_then_fsync),
        answer("bytes from memory, os.write and fsync", atomic_save_from_bytes_with_os_write),
    ],
    lesson07.check_resume: [
        answer("all_gather of RNG tensors, one stacked tensor", save_with_all_gather_of_rng_tensors,
               load_rng_from_a_stacked_tensor),
        answer("gather_object to rank 0, other keys, all_reduce as barrier",
               save_with_gather_object_to_rank0, load_rng_from_a_dict),
        answer("torch.serialization.save, mkstemp, monitored_barrier; default weights_only",
               save_with_serialization_save_and_mkstemp, load_with_the_default_weights_only),
        answer("rank 0 loads and broadcasts the state", lesson07.reference_save_training_state,
               load_on_rank0_and_broadcast),
    ],
    lesson07.check_prune_checkpoints: [
        answer("glob and a regex", prune_with_glob_and_regex),
        answer("listdir, newest first, os.remove", prune_with_listdir_and_remove),
    ],
    lesson08.check_log_mean_loss: [
        answer("all_gather, printed to stderr", mean_loss_with_all_gather_printed_to_stderr),
        answer("prints the tensor, returns a float", mean_loss_printing_the_tensor),
    ],
    lesson08.check_wrap_model: [
        answer("static_graph=True", wrap_with_static_graph),
        answer("freezes the unused branch before wrapping", wrap_after_freezing_the_unused_branch),
        answer("wraps only the body", wrap_only_the_body),
    ],
    lesson08.check_indices_per_epoch: [
        answer("a new sampler each epoch, set_epoch", indices_with_a_new_sampler_each_epoch),
        answer("iterates the sampler, no loader", indices_straight_from_the_sampler),
    ],
    lesson08.check_save_checkpoint: [
        answer("monitored_barrier", save_then_monitored_barrier),
        answer("a broadcast as the barrier", save_then_broadcast_a_flag),
        answer("written atomically, an all_reduce as the barrier", save_atomically_then_all_reduce),
    ],
    lesson09.check_scaling_efficiency: SCALING_ALTERNATIVES,
    lesson09.check_all_reduce_seconds: [
        answer("the course's cost model", all_reduce_seconds_from_the_cost_model),
        answer("per ring step, a numpy float", all_reduce_seconds_per_step),
    ],
    lesson09.check_accumulation_plan: [
        answer("decreasing batch sizes, a list", plan_by_decreasing_batch),
        answer("divisors from the ceiling, numpy ints", plan_from_divisors),
    ],
    lesson10.check_loader_measurement: [
        answer("numpy floats and a numpy integer", *loader_report_with_numpy(LESSON10_MEASUREMENT)),
        answer("data_wait_share, a Fraction, a ceiling by floor division",
               *loader_report_from_data_wait_share(LESSON10_MEASUREMENT)),
    ],
    lesson10.check_fast_loader: [
        answer("DistributedSampler told its rank, persistent workers",
               loader_with_an_explicit_distributed_sampler),
        answer("a hand-made share as the sampler, 6 workers",
               loader_with_a_hand_made_share_and_more_workers),
        answer("batch_sampler=BatchSampler(DistributedSampler(dataset), 32, False)",
               loader_with_a_batch_sampler),
        answer("a Subset of this rank's share, shuffled, 5 workers", loader_over_a_subset),
    ],
    lesson11.check_zero_bytes_per_parameter: [
        answer("branches", zero_bytes_with_branches),
        answer("what is sharded, a Fraction", zero_bytes_from_what_is_sharded),
    ],
    lesson11.check_largest_batch: [
        answer("bisection on measured steps", largest_batch_by_bisection()),
        answer("the slope of two measurements, a numpy integer",
               largest_batch_from_two_measurements()),
    ],
    lesson11.check_recipes_that_fit: [
        answer("filter and .total", recipes_with_filter),
        answer("a tuple of plain tuples", recipes_as_a_tuple_of_plain_tuples),
    ],
    lesson12.check_global_rank: [
        answer("counting nodes", global_rank_by_counting),
        answer("numpy's ravel_multi_index", global_rank_as_numpy),
    ],
    lesson12.check_ranks_on_my_node: [
        answer("all_gather of a tensor, a tensor back", ranks_on_my_node_from_a_tensor),
        answer("from LOCAL_RANK and LOCAL_WORLD_SIZE, numpy ints",
               ranks_on_my_node_from_local_ranks),
    ],
    lesson12.check_health_check: HEALTH_ALTERNATIVES,
    lesson13.check_end_of_epoch: [
        answer("all_gather and broadcast_object_list", end_of_epoch_with_all_gather_and_an_object),
        answer("one all_reduce of both, a list", end_of_epoch_in_one_all_reduce),
    ],
    lesson13.check_load_data: [
        answer("pathlib, a broadcast as the barrier", load_data_with_a_broadcast_as_barrier),
        answer("written atomically, monitored_barrier", load_data_written_atomically),
        answer("renamed whole, the others poll for the name",
               load_data_renamed_whole_while_the_others_poll),
    ],
    lesson13.check_step_and_loss: [
        answer("all_gather of the losses, a 0-d tensor", step_and_loss_with_all_gather),
        answer("summed losses over all samples", step_and_loss_weighted_by_samples),
    ],
    lesson13.check_hand_ddp_step: [
        answer("divides each gradient, then all_reduce", hand_ddp_dividing_before_each_all_reduce),
        answer("a scaled loss, parameters_to_vector", hand_ddp_with_a_scaled_loss),
    ],
    lesson13.check_add_noise: [
        answer("numpy's SeedSequence with a spawn key", add_noise_from_a_spawn_key),
        answer("Python's random seeded by text", add_noise_from_python_random_seeded_by_text),
    ],
    lesson13.check_make_loader: [
        answer("3 workers, a sampler told its rank, prefetch 4",
               loader_with_three_workers_and_more_prefetch),
        answer("no workers: threads read each batch", ThreadedBatches),
    ],
    lesson13.check_wrap_for_ddp: [
        answer("static_graph=True", wrap_with_static_graph),
        answer("find_unused_parameters=False, bucket views", wrap_with_bucket_views),
    ],
    lesson14.check_capstone: [answer(name, path) for name, path in ALTERNATIVE_CONVERSIONS.items()],
}
ALTERNATIVES.update(LESSON15_ALTERNATIVES)
ALTERNATIVES.update(LESSON16_ALTERNATIVES)
# the slow tier: the capstone runs the learner's script under torchrun; the loader grader times
# several loaders in turns
SLOW_GRADERS = {lesson14.check_capstone, lesson13.check_make_loader}

ALTERNATIVE_CASES = [
    pytest.param(check, *case.values, id=f"{check.__module__.rsplit('.', 1)[-1]}.{check.__name__}:"
                                         f"{case.id}", marks=[pytest.mark.slow] if check in SLOW_GRADERS else [])
    for check, cases in ALTERNATIVES.items() for case in cases
]


def all_graders():
    """Every @grader function of course_lib/checks/lessonNN.py."""
    modules = [importlib.import_module(f"{checks.__name__}.{info.name}")
               for info in pkgutil.iter_modules(checks.__path__) if info.name.startswith("lesson")]
    return [value for module in modules for value in vars(module).values()
            if hasattr(value, "exercise") and getattr(value, "__module__", None) == module.__name__]


@pytest.mark.parametrize("check, args, kwargs", ALTERNATIVE_CASES)
def test_grader_accepts_an_alternative_correct_answer(check, args, kwargs, capsys):
    check(*arguments_of(args), **kwargs)
    assert capsys.readouterr().out == passed_line(check.exercise) + "\n"


def test_every_grader_has_two_alternative_correct_answers():
    short = [f"{check.__module__}.{check.__name__} has {len(ALTERNATIVES.get(check, []))}"
             for check in all_graders() if len(ALTERNATIVES.get(check, [])) < MIN_ALTERNATIVES]
    assert not short, ("add correct answers written differently from the solution: "
                       + "; ".join(short))
