"""Finding why a distributed run hangs, computes the wrong thing or is slow (lesson 13): each
exercise's broken run (``*_broken``) next to its reference fix, the slow dataset one of them reads,
and torch's flight recorder read from inside a rank, as NCCL's watchdog would dump it on a cluster.
"""
import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ..runtime.rank.collective_log import own_entries
from ..training.data import make_dataset

# -- the flight recorder, read from a rank ------------------------------------------------------

TRACE_PREFIX = "trace_rank_"  # torchfrtrace reads one file per rank, <prefix><rank>


def dump_collectives_after(seconds: float, folder: str) -> None:
    """In a rank: after `seconds`, write what torch's flight recorder holds for this rank to
    folder/trace_rank_<rank>, from a thread of its own (the main thread may be stuck in a
    collective). The file is the pickle NCCL's watchdog writes on a timeout; gloo records too
    (torch 2.8 and later), but only a call like this one writes it."""
    rank = dist.get_rank()

    def dump():
        with open(os.path.join(folder, f"{TRACE_PREFIX}{rank}"), "wb") as file:
            pickle.dump(_own_dump(), file)

    timer = threading.Timer(seconds, dump)
    timer.daemon = True
    timer.start()


def _own_dump() -> dict:
    """This rank's flight-recorder dump, less the entries a fork inherited from its parent."""
    import torch._C._distributed_c10d as c10d

    dump = pickle.loads(c10d._dump_fr_trace())  # private, as torch's own debug server calls it
    dump["entries"] = own_entries(dump["entries"])
    return dump


def _entries(dump: dict) -> list:
    return [(entry["collective_seq_id"], entry["profiling_name"], entry["input_sizes"],
             entry["input_dtypes"], "completed" if entry["retired"] else entry["state"])
            for entry in dump["entries"]]


def collectives_recorded_here() -> list:
    """In a rank: [(call number, op, input sizes, dtypes, state)] its flight recorder holds now."""
    return _entries(_own_dump())


def recorded_collectives(folder: str) -> dict:
    """{rank: [(call number, op, input shapes, dtypes, state)]} from the dumps in `folder`."""
    table = {}
    for rank, path in _dump_files(folder).items():
        with open(path, "rb") as file:
            table[rank] = _entries(pickle.load(file))
    return table


def _dump_files(folder: str) -> dict:
    """{rank: path} of the dumps in `folder`, by rank."""
    return {int(name[len(TRACE_PREFIX):]): os.path.join(folder, name)
            for name in sorted(os.listdir(folder)) if name.startswith(TRACE_PREFIX)}


def torchfrtrace(folder: str, timeout: float = 120) -> str:
    """What `torchfrtrace <folder>` (torch's analyser of flight-recorder dumps) prints about the
    dumps in `folder`, up to each collective's stack.

    torchfrtrace was written for NCCL's dumps, which name each process group in "pg_config";
    gloo's name the default group "" there (torch 2.13), so that torchfrtrace cannot find it. We
    copy the name each recorded collective carries into pg_config first, in place. The default
    group's ranks are the ranks that dumped: a rank forked from a process that had a group of its
    own before finds "[]" there."""
    files = _dump_files(folder)
    dumped = str(sorted(files))
    for path in files.values():
        with open(path, "rb") as file:
            dump = pickle.load(file)
        ranks = next(iter(dump["pg_config"].values()), {}).get("ranks", "[]")
        groups = {entry["process_group"] for entry in dump["entries"]}
        dump["pg_config"] = {uid: {"name": uid, "desc": desc,
                                   "ranks": dumped if desc == "default_pg" else ranks}
                             for uid, desc in groups}
        with open(path, "wb") as file:
            pickle.dump(dump, file)
    command = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", folder]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in (done.stdout + done.stderr).splitlines()
             if "tabulate is not installed" not in line]
    shown = []
    for line in lines:
        if line.startswith("collective stack trace"):
            break
        shown.append(line)
    return "\n".join(shown).strip()


# -- exercise 1: the run hangs at the end of the first epoch ------------------------------------

def end_of_epoch_broken(epoch_loss, lr):
    total = torch.tensor([epoch_loss])
    shared_lr = torch.tensor([lr])
    if dist.get_rank() == 0:
        dist.all_reduce(total)                  # add up every rank's loss
        dist.broadcast(shared_lr, src=0)        # send rank 0's learning rate
    else:
        dist.broadcast(shared_lr, src=0)        # receive rank 0's learning rate
        dist.all_reduce(total)                  # add this rank's loss
    return total.item() / dist.get_world_size(), shared_lr.item()


def end_of_epoch(epoch_loss, lr):
    total, shared_lr = torch.tensor([epoch_loss]), torch.tensor([lr])
    dist.all_reduce(total)               # every rank, in the same order: first the loss...
    dist.broadcast(shared_lr, src=0)     # ...then the learning rate
    return total.item() / dist.get_world_size(), shared_lr.item()


# -- exercise 2: the run hangs at start-up, from the second run on ------------------------------

DATA_SAMPLES = 256


def load_data_broken(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0:
        if not os.path.exists(path):                          # the first run builds the file
            torch.save(make_dataset(n_samples=256).tensors, path)
            dist.barrier()                                    # the file is complete
    else:
        dist.barrier()                                        # wait until rank 0's file is complete
    return torch.load(path)


def load_data(folder):
    path = os.path.join(folder, "data.pt")
    if dist.get_rank() == 0 and not os.path.exists(path):    # only rank 0 looks, and builds it
        torch.save(make_dataset(n_samples=256).tensors, path)
    dist.barrier()                                            # every rank, every run
    return torch.load(path)


# -- exercise 3: the dashboard's loss is not the loss of the run --------------------------------

def step_and_loss_broken(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    return loss.item()                          # the number the dashboard logs (from rank 0)


def step_and_loss(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)                       # every rank's loss on its own shard...
    return mean.item() / dist.get_world_size()  # ...averaged: the loss of the global batch


# -- exercise 4: data parallel by hand diverges on 2 ranks --------------------------------------

def hand_ddp_step_broken(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    grads = [param.grad for param in model.parameters()]
    flat = torch.cat([grad.flatten() for grad in grads])  # one all_reduce a step, not one a tensor
    dist.all_reduce(flat)
    for grad, reduced in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(reduced.view_as(grad))
    optimizer.step()
    return loss.item()


def hand_ddp_step(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(X), y)
    loss.backward()
    grads = [param.grad for param in model.parameters()]
    flat = torch.cat([grad.flatten() for grad in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()                             # a sum of N gradients, made a mean
    for grad, reduced in zip(grads, flat.split([grad.numel() for grad in grads])):
        grad.copy_(reduced.view_as(grad))
    optimizer.step()
    return loss.item()


# -- exercise 5: augmentation that adds less variety on 2 ranks ---------------------------------

NOISE_STD = 0.1


def add_noise_broken(X, step, seed=0):
    generator = torch.Generator().manual_seed(1000 * seed + step)  # a run can be repeated
    return X + 0.1 * torch.randn(X.shape, generator=generator)


def add_noise(X, step, seed=0):
    # one stream per (seed, step, rank): NumPy's SeedSequence mixes all three numbers, whatever
    # their size, into the generator's 128-bit state. torch's CPU generator keeps only 32 bits of
    # a seed, and a sum like 1000 * seed + step * world_size + rank repeats at step 500.
    generator = np.random.default_rng([seed, step, dist.get_rank()])
    return X + 0.1 * torch.from_numpy(generator.standard_normal(tuple(X.shape))).to(X.dtype)


# -- exercise 6: the steps wait for data --------------------------------------------------------

READ_SECONDS = 0.002   # reading one sample from storage (a sleep: the CPU is free meanwhile)
STEP_SECONDS = 0.010   # a training step on the device (a sleep too: see topics.input_pipeline)
BATCH_SIZE = 16


class SamplesOnDisk(Dataset):
    """The course's data, each sample read from storage in READ_SECONDS (a sleep)."""

    def __init__(self, n_samples: int = 640, read_seconds: float = READ_SECONDS):
        self.X, self.y = make_dataset(n_samples=n_samples, seed=5).tensors
        self.read_seconds = read_seconds

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        time.sleep(self.read_seconds)
        return self.X[index], self.y[index]


def make_loader_broken(dataset):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    return DataLoader(dataset, batch_size=16, sampler=sampler)


def make_loader(dataset):
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    # 4 workers read 4 batches at once: one every 32 / 4 = 8 ms, faster than a 10 ms step
    return DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=4,
                      persistent_workers=True)


# -- exercise 7: DDP steps slower than they should be, and a warning ----------------------------

def wrap_for_ddp_broken(model):
    return DDP(model, find_unused_parameters=True)


def wrap_for_ddp(model):
    return DDP(model)  # every parameter gets a gradient every step: nothing to search for
