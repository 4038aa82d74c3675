"""The three ways one training loop can use devices: single, DP (one process, many devices), DDP.

A strategy wraps the model, says how the data is split, and how ranks agree; the loop stays the same.
"""
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch import nn

from ..runtime.shared.env import gpu_count

if dist.is_available():
    import torch.distributed.nn  # noqa: F401  now: imported after init (DDP does it), it pins the group

STRATEGIES = ("single", "dp", "ddp")


def make_strategy(name: str, device=None):
    if name == "single":
        return SingleDevice(device)
    if name == "dp":
        return DataParallelStrategy()
    if name == "ddp":
        return DistributedDataParallelStrategy(device)
    raise ValueError(f"strategy={name!r} is not one of {STRATEGIES}")


def default_device() -> torch.device:
    return torch.device("cuda" if gpu_count() > 0 else "cpu")


class SingleDevice:
    """One process, one device: the baseline every other strategy must match."""

    rank = 0
    world_size = 1   # how many replicas split the global batch
    num_shards = 1   # how many data shards the sampler makes (one per process)

    def __init__(self, device=None):
        self.device = torch.device(device) if device else default_device()
        self.devices = [self.device]  # every device this process computes on

    def wrap(self, model: nn.Module, config) -> nn.Module:
        return model.to(self.device)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    def no_sync(self, model: nn.Module):
        return nullcontext()

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather(self, obj) -> list:
        return [obj]

    def barrier(self) -> None:
        pass


class DataParallelStrategy(SingleDevice):
    """One process drives several devices: nn.DataParallel on 2+ GPUs, course_lib.training.dp otherwise.

    The loader yields batch_size x replicas samples; DataParallel scatters them, one slice per device.
    """

    def __init__(self):
        super().__init__(device="cuda:0" if gpu_count() > 0 else "cpu")
        self.world_size = max(gpu_count(), 1)

    def wrap(self, model: nn.Module, config) -> nn.Module:
        model = model.to(self.device)
        if torch.cuda.device_count() >= 2:
            wrapped = nn.DataParallel(model)
            self.devices = [torch.device("cuda", index) for index in wrapped.device_ids]
        else:
            from . import dp  # the course's readable DataParallel, which also runs on CPU

            wrapped = dp.DataParallel(model)
            self.devices = [torch.device(device) for device in wrapped.devices]
        self.world_size = len(self.devices)
        return wrapped

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module


class DistributedDataParallelStrategy:
    """One process per device; DDP all-reduces gradients during backward; a DistributedSampler shards data."""

    def __init__(self, device=None):
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(
                "strategy='ddp' needs a process group, and none is initialised. Launch the "
                "training function with course_lib.launch(fn, nprocs=2) in a notebook, or the "
                "script with `torchrun --nproc_per_node=2 ...` (or `python -m course_lib train "
                "--nprocs 2`); for one process use strategy='single'")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.num_shards = self.world_size
        self.backend = dist.get_backend()
        local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        if self.backend == "nccl":
            check_gpus_for_nccl(int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)))
            self.device = torch.device("cuda", local_rank)
            torch.cuda.set_device(self.device)
        else:
            self.device = torch.device(device) if device else torch.device("cpu")
        self.devices = [self.device]

    def wrap(self, model: nn.Module, config) -> nn.Module:
        if config.sync_batchnorm:
            if self.device.type != "cuda":
                raise ValueError(
                    "sync_batchnorm=True needs GPUs: torch's SyncBatchNorm has no CPU kernel. "
                    "On CPU leave it False (each rank keeps its own BatchNorm statistics)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = model.to(self.device)
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(
            model, device_ids=device_ids, find_unused_parameters=config.find_unused_parameters)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module

    def no_sync(self, model: nn.Module):
        # Gradients of non-final micro-batches stay local; the last backward all-reduces their sum.
        return model.no_sync()

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor / self.world_size

    def gather(self, obj) -> list:
        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def barrier(self) -> None:
        dist.barrier()


def check_gpus_for_nccl(processes_per_node: int) -> None:
    """NCCL needs one GPU per process on each node; say what to do instead when there are too few."""
    found = torch.cuda.device_count()
    if found < processes_per_node:
        raise RuntimeError(
            f"backend='nccl' with {processes_per_node} processes per node needs "
            f"{processes_per_node} GPUs, found {found}; use backend='gloo' (CPU) or fewer processes")
