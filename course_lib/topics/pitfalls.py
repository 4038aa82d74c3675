"""The pitfalls clinic's snippets: each broken version (``*_broken``) next to its reference fix,
and `diagnosis`, which prints a failed run's error as the few lines that name the cause.
"""
import os
import re
import textwrap

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ..runtime.tracebacks import notebook_friendly

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
    if dist.get_rank() == 0:
        dist.all_reduce(loss)                  # rank 1 never calls it: rank 0 waits for it
        loss = loss / dist.get_world_size()
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
    return DDP(model)  # the second backward fails: unused_head never got a gradient


def wrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """DDP that finds, after each forward, the parameters the loss will not reach."""
    return DDP(model, find_unused_parameters=True)


# -- 3. forgetting set_epoch --------------------------------------------------------------------

def indices_per_epoch_broken(dataset, epochs: int = 3, batch_size: int = 4) -> list:
    """The sample indices this rank sees, one list per epoch (dataset items are (index,))."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    seen = []
    for epoch in range(epochs):                 # the sampler shuffles with seed + epoch...
        seen.append([i for (batch,) in loader for i in batch.tolist()])
    return seen                                  # ...but its epoch stays 0: one order, always


def indices_per_epoch(dataset, epochs: int = 3, batch_size: int = 4) -> list:
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    seen = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)                 # before iterating: a new order every epoch
        seen.append([i for (batch,) in loader for i in batch.tolist()])
    return seen


# -- 4. every rank saving -----------------------------------------------------------------------

def save_checkpoint_broken(model: torch.nn.Module, path: str) -> None:
    torch.save(model.state_dict(), path)         # every rank writes the same file at once


def save_checkpoint(model: torch.nn.Module, path: str) -> None:
    """Rank 0 writes; nobody returns before the file is complete, so any rank may load it."""
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), path)
    dist.barrier()
