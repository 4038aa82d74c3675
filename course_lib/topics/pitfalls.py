"""The pitfalls clinic's snippets: each broken version (``*_broken``) next to its reference fix,
`diagnosis`, which prints a failed run's error as the few lines that name the cause, a slow shared
disk to save on, and two probes: SyncBatchNorm's collectives on CPU ranks, and the seed each
DataLoader worker starts from. The broken versions' comments say what the code means to do, not
what is wrong with it: lesson 08's learner finds that from the run.
"""
import contextlib
import io
import os
import re
import textwrap
import time
from unittest import mock

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler, get_worker_info

# lesson 08 shows launch's own choice of start method, and the threads a forked rank gets, from here
from ..runtime.shared.env import choose_start_method, threads_per_rank  # noqa: F401
from ..runtime.shared.tracebacks import notebook_friendly

# -- reading an error ----------------------------------------------------------------------------

_CPP_LOCATION = re.compile(r"\[/[^\]\s]*\] ?")   # gloo's "[/.../pair.cc:537] " prefix
_PEER_PORT = re.compile(r"(\d+\.\d+\.\d+\.\d+\]?):\d+")
_FRAME = re.compile(r'\s*(?:File "(?P<file>[^"]+)"|(?P<cell>Cell In\[\d+\])),? line (?P<line>\S+) in (?P<fn>\S+)')


def diagnosis(error, max_lines: int = 4, width: int = 96) -> str:
    """A DistributedRunError in a few lines: for a hang, where each rank waits (innermost call
    first); for a crash, each failed rank's exception message. No paths, no ports."""
    lines = [str(error).splitlines()[0]]
    for failure in sorted(error.failures.values(), key=lambda f: f.rank):
        if error.timed_out:
            lines.append(f"rank {failure.rank}: {failure.summary}")
            lines += [f"    in {frame}" for frame in _frames(failure.stack)[:max_lines]]
        else:
            message = _message(failure.traceback) or failure.summary
            wrapped = textwrap.wrap(_CPP_LOCATION.sub("", message), width) or [""]
            wrapped = wrapped[:max_lines] + (["    ..."] if len(wrapped) > max_lines else [])
            lines.append(f"rank {failure.rank}: " + "\n    ".join(wrapped))
    return _PEER_PORT.sub(r"\1:PORT", "\n".join(lines))


def _frames(stack: str) -> list:
    """'all_reduce (distributed_c10d.py)' for each frame of a rank's main thread, innermost first."""
    frames = []
    for line in notebook_friendly(stack).split("\n\n")[0].splitlines():
        found = _FRAME.match(line)
        if found and found["fn"] not in ("wrapper", "_fn", "inner"):
            where = found["cell"] or os.path.basename(found["file"])
            frames.append(f"{found['fn']} ({where})")
    return frames


def _message(traceback_text: str) -> str:
    """The exception's message: what follows the last traceback's frames, on one line."""
    block = traceback_text.rsplit("Traceback (most recent call last):", 1)[-1]
    lines = block.strip("\n").splitlines()
    first = next((i for i, line in enumerate(lines) if line and not line.startswith(" ")), None)
    return " ".join(line.strip() for line in lines[first:]) if first is not None else ""


# -- 1. a collective called on some ranks only ---------------------------------------------------

def log_mean_loss_broken(loss: torch.Tensor) -> torch.Tensor:
    """Print the mean of `loss` over all ranks, from rank 0 only; return it."""
    if dist.get_rank() == 0:                   # one log line per step, not one per rank
        dist.all_reduce(loss)                  # the sum over the ranks...
        loss = loss / dist.get_world_size()    # ...made a mean
        print(f"mean loss {loss.item():.4f}")
    return loss


def log_mean_loss(loss: torch.Tensor) -> torch.Tensor:
    """Every rank joins the collective; only the printing is rank 0's."""
    loss = loss.detach().clone()
    dist.all_reduce(loss)
    loss = loss / dist.get_world_size()
    if dist.get_rank() == 0:
        print(f"mean loss {loss.item():.4f}")
    return loss


# -- 2. parameters that get no gradient ---------------------------------------------------------

def wrap_model_broken(model: torch.nn.Module) -> torch.nn.Module:
    return DDP(model)


def wrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """DDP that finds, after each forward, the parameters the loss will not reach."""
    return DDP(model, find_unused_parameters=True)


# -- 3. forgetting set_epoch --------------------------------------------------------------------

def indices_per_epoch_broken(dataset, epochs: int = 3, batch_size: int = 4) -> list:
    """The sample indices this rank sees, one list per epoch (dataset items are (index,))."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    seen = []
    for epoch in range(epochs):                 # each rank its share, shuffled
        seen.append([i for (batch,) in loader for i in batch.tolist()])
    return seen


def indices_per_epoch(dataset, epochs: int = 3, batch_size: int = 4) -> list:
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)                 # before iterating: a new order every epoch
        seen.append([i for (batch,) in loader for i in batch.tolist()])
    return seen


# -- 4. rank 0 saves, the others read ----------------------------------------------------------

def save_checkpoint_broken(model: torch.nn.Module, path: str) -> None:
    """Save the model's weights to `path`; the ranks hold the same weights: one writer is enough."""
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)


def save_checkpoint_everywhere(model: torch.nn.Module, path: str) -> None:
    torch.save(model.state_dict(), path)         # every rank writes the same file at once


def save_checkpoint(model: torch.nn.Module, path: str) -> None:
    """Rank 0 writes; nobody returns before the file is complete, so any rank may load it."""
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()



# -- replicas that drift apart, values that are not finite -----------------------------------------

def replica_health_check_local(model: torch.nn.Module, loss: torch.Tensor) -> str:
    """Each rank looks at its own numbers only: it cannot see a replica drift, and a NaN stops
    the rank that has it while the others wait for it in their next collective."""
    values = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    if not (torch.isfinite(values).all() and torch.isfinite(loss.detach())):
        raise FloatingPointError("loss or weights not finite")
    return "ok"


def fingerprint(model: torch.nn.Module) -> torch.Tensor:
    """One float64 number for the parameters: each value weighted by its position, so a sign flip,
    two values swapped, or any small change moves it (a plain sum misses the swap)."""
    values = torch.cat([parameter.detach().flatten() for parameter in model.parameters()]).double()
    positions = torch.arange(1, len(values) + 1, dtype=torch.float64, device=values.device)
    return (values * (1 + positions / len(values))).sum()


def replica_health_check(model: torch.nn.Module, loss: torch.Tensor) -> str:
    """"ok", "diverged" or "non-finite", the same on every rank, from one all-reduce (MAX) of
    [fingerprint, -fingerprint, not-finite flag]: the largest and the smallest fingerprint, and
    whether any rank saw a NaN or an infinity. Every rank then stops, or goes on, together."""
    values = torch.cat([parameter.detach().flatten() for parameter in model.parameters()])
    not_finite = ~(torch.isfinite(values).all() & torch.isfinite(loss.detach()))
    mine = fingerprint(model)
    summary = torch.stack([mine, -mine, not_finite.double()])
    dist.all_reduce(summary, op=dist.ReduceOp.MAX)
    if summary[2] > 0:
        return "non-finite"
    return "ok" if summary[0] == -summary[1] else "diverged"

@contextlib.contextmanager
def slow_disk(seconds: float = 1.0, rank: int = 0, pieces: int = 2):
    """In a rank: while inside, `torch.save` on `rank` writes as a busy shared file system does:
    the file in `pieces` flushed pieces over `seconds` (it exists, torn, meanwhile).
    Yields a list that receives when each of that rank's saves ended (time.perf_counter())."""
    real_save, saves_ended = torch.save, []

    def save(obj, f, *args, **kwargs):
        if dist.get_rank() != rank:
            return real_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        size = -(-len(data) // pieces)
        with contextlib.ExitStack() as stack:
            file = stack.enter_context(open(f, "wb")) if isinstance(f, (str, os.PathLike)) else f
            for start in range(0, len(data), size):
                if start:
                    time.sleep(seconds / (pieces - 1))
                file.write(data[start:start + size])
                file.flush()  # the bytes so far are in the file, for any reader to see
        saves_ended.append(time.perf_counter())

    with mock.patch.object(torch, "save", save):
        yield saves_ended


# -- 5. SyncBatchNorm's collectives, on the CPU -------------------------------------------------

@contextlib.contextmanager
def sync_batchnorm_on_cpu():
    """Run torch's own SyncBatchNorm code (torch/nn/modules/_functions.py, with its collectives)
    on CPU tensors, for counting and checking them on gloo. Not for training.

    SyncBatchNorm refuses the CPU in its forward (a device check in nn/modules/batchnorm.py), and
    five of the kernels it calls exist for GPUs only (`torch.batch_norm_stats` has no CPU kernel).
    Inside this block the device check accepts "cpu" and those five kernels are replaced by the
    reference arithmetic below; every collective is torch's, unchanged.
    """
    kernels = {"batch_norm_stats": _stats, "batch_norm_gather_stats_with_counts": _gather_stats,
               "batch_norm_elemt": _normalise, "batch_norm_backward_reduce": _backward_reduce,
               "batch_norm_backward_elemt": _backward_input}
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch._C, "_get_privateuse1_backend_name",
                                              lambda: "cpu"))
        for name, kernel in kernels.items():
            stack.enter_context(mock.patch.object(torch, name, kernel))
        yield


def _per_channel(tensor, x):
    """A (C,) tensor shaped to broadcast over x's channel dimension, 1."""
    return tensor.view(1, -1, *([1] * (x.dim() - 2)))


def _sum_but_channel(x):
    return x.sum(dim=[d for d in range(x.dim()) if d != 1])


def _stats(x, eps):
    count = x.numel() // x.size(1)
    mean = _sum_but_channel(x) / count
    variance = _sum_but_channel((x - _per_channel(mean, x)) ** 2) / count
    return mean, (variance + eps).rsqrt()


def _gather_stats(x, means, invstds, running_mean, running_var, momentum, eps, counts):
    counts = counts.view(-1, 1).to(means.dtype)
    total = counts.sum()
    mean = (counts * means).sum(0) / total
    variance = (counts * (invstds.pow(-2) - eps + (means - mean) ** 2)).sum(0) / total
    if running_mean is not None:  # the unbiased variance, as BatchNorm keeps it
        running_mean.mul_(1 - momentum).add_(momentum * mean)
        running_var.mul_(1 - momentum).add_(momentum * variance * total / (total - 1))
    return mean, (variance + eps).rsqrt()


def _normalise(x, weight, bias, mean, invstd, eps):
    y = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        y = y * _per_channel(weight, x)
    return y + _per_channel(bias, x) if bias is not None else y


def _backward_reduce(grad_output, x, mean, invstd, weight, input_g, weight_g, bias_g):
    sum_dy = _sum_but_channel(grad_output)
    sum_dy_xmu = _sum_but_channel(grad_output * (x - _per_channel(mean, x)))
    return sum_dy, sum_dy_xmu, sum_dy_xmu * invstd, sum_dy


def _backward_input(grad_output, x, mean, invstd, weight, sum_dy, sum_dy_xmu, counts):
    total = counts.sum()  # sum_dy and sum_dy_xmu arrive summed over all ranks
    scale = invstd if weight is None else invstd * weight
    xmu = x - _per_channel(mean, x)
    return (grad_output - _per_channel(sum_dy / total, x)
            - xmu * _per_channel(invstd ** 2 * sum_dy_xmu / total, x)) * _per_channel(scale, x)


# -- 6. seeding: what each DataLoader worker starts from ----------------------------------------

class WorkerSeed(Dataset):
    """Item i: (which worker made it, that worker's torch seed, a random "augmentation" value it
    drew). Lives here rather than in a notebook so that spawned workers can import it."""

    def __init__(self, n_samples: int = 4):
        self.n_samples = n_samples

    def __len__(self) -> int:
        return self.n_samples

    def __getitem__(self, index):
        worker = get_worker_info()  # None in the main process
        return worker.id if worker else -1, torch.initial_seed(), torch.rand(()).item()
