"""Where and how ranks run: backend and device choice, start method, threads per rank, seeding.

The same choices serve `launch`, the trainers and `python -m course_lib doctor`.
"""
import multiprocessing
import os
import random
import sys
from typing import Optional, Tuple

BACKENDS = ("nccl", "gloo", "mpi", "ucc")


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def gpu_count() -> int:
    """CUDA devices, counted without initialising CUDA in this process (so fork stays safe).

    `torch.cuda.is_available()` would call cudaGetDeviceCount, which initialises the CUDA driver
    here: ranks forked afterwards cannot use the GPU (torch's docs of `is_available`).
    `torch.cuda.device_count()` asks NVML instead until CUDA is initialised; only where NVML cannot
    be loaded (no NVIDIA driver, so no GPU to lose) does it fall back to cudaGetDeviceCount.
    """
    import torch

    return torch.cuda.device_count()


def choose_backend(nprocs: int, backend: Optional[str] = None) -> Tuple[str, str]:
    """(backend, why): NCCL when every rank can own a GPU, gloo otherwise."""
    import torch.distributed as dist

    gpus = gpu_count()
    if backend is None:
        if gpus >= nprocs and dist.is_nccl_available():
            return "nccl", f"{gpus} CUDA GPU{'s' if gpus != 1 else ''}, one per rank"
        if gpus == 0:
            return "gloo", "no CUDA GPU, ranks run on the CPU"
        if not dist.is_nccl_available():
            return "gloo", "this PyTorch build has no NCCL"
        return "gloo", f"{nprocs} ranks but only {gpus} GPU{'s' if gpus != 1 else ''}, ranks run on the CPU"
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not a torch.distributed backend; use 'nccl' (GPUs), "
                         f"'gloo' (CPU) or None to choose")
    if backend == "nccl":
        if gpus < nprocs:
            raise ValueError(f"backend='nccl' needs one GPU per rank: nprocs={nprocs} but found {gpus} "
                             f"GPU{'s' if gpus != 1 else ''}; use backend='gloo'"
                             + (f" or nprocs={gpus}" if gpus else ""))
        if not dist.is_nccl_available():
            raise ValueError("backend='nccl' but this PyTorch build has no NCCL; use backend='gloo'")
    elif not dist.is_backend_available(backend):
        raise ValueError(f"backend={backend!r} is not available in this PyTorch build; use 'gloo'")
    return backend, "as requested"


def choose_start_method(requested: Optional[str] = None) -> Tuple[str, str]:
    """(method, why): fork where it is safe (Linux, CUDA not yet initialised here), else spawn."""
    import torch

    methods = multiprocessing.get_all_start_methods()
    if requested is not None:
        if requested not in ("fork", "spawn"):
            raise ValueError(f"start_method={requested!r}: use 'fork', 'spawn' or None to choose")
        if requested == "fork" and "fork" not in methods:
            raise ValueError(f"start_method='fork' is not available on {sys.platform}; use 'spawn'")
        if requested == "fork" and torch.cuda.is_initialized():
            raise RuntimeError("start_method='fork' after CUDA was initialised in this process: the ranks "
                               "could not use the GPU. Use start_method='spawn', or restart the kernel "
                               "and launch before any CUDA call")
        return requested, "as requested"
    if not sys.platform.startswith("linux"):
        return "spawn", f"fork is not safe on {sys.platform}"
    if torch.cuda.is_initialized():
        return "spawn", "CUDA is already initialised in this process"
    return "fork", "fast, and sees functions defined in this notebook"


def threads_per_rank(nprocs: int, start_method: str) -> int:
    """Intra-op threads for each rank.

    A forked rank must use one: once the parent has used torch's OpenMP pool, a forked child that
    runs an op on several threads hangs forever. A spawned rank may share the cores.
    """
    if start_method == "fork":
        return 1
    share = max(1, cpu_cores() // max(1, nprocs))
    limit = os.environ.get("OMP_NUM_THREADS", "")
    return min(share, int(limit)) if limit.isdigit() and int(limit) > 0 else share


def device_for_rank(local_rank: int = None, backend: Optional[str] = None):
    """The device a rank computes on: cuda:LOCAL_RANK under NCCL, the CPU otherwise."""
    import torch

    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if backend is None:
        import torch.distributed as dist

        backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else None
    if backend == "nccl" or (backend is None and gpu_count() > 0):
        return torch.device("cuda", local_rank % max(1, gpu_count()))
    return torch.device("cpu")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy (when installed) and torch on every device."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass
