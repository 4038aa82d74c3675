"""Where and how ranks run: backend and device choice, start method, threads per rank, seeding.

The same choices serve `launch`, the trainers and `python -m course_lib doctor`.
"""
import math
import multiprocessing
import os
import random
import sys
from typing import Optional, Tuple

BACKENDS = ("nccl", "gloo", "mpi", "ucc")


def cpu_cores() -> int:
    """The cores this process may use: its CPU affinity (taskset, a batch system's cpuset), lowered
    by a cgroup CPU quota (a container's limit, a JupyterHub spawner's cpu_limit), rounded up.

    On a shared node this is the learner's share, not the machine: os.cpu_count() counts every core.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return max(1, min(cores, math.ceil(quota))) if quota is not None else cores


def cgroup_cpu_limit(proc_cgroup: str = "/proc/self/cgroup",
                     mountinfo: str = "/proc/self/mountinfo") -> Optional[float]:
    """Cores' worth of CPU time this process's cgroup and its parents allow (quota / period), or
    None where none is set: cgroup v2's cpu.max ("max 100000" is none), v1's cpu.cfs_quota_us (-1)."""
    try:
        with open(proc_cgroup) as file:
            lines = [line.rstrip("\n").split(":", 2) for line in file if line.count(":") >= 2]
        with open(mountinfo) as file:
            mounts = [line.split() for line in file]
    except OSError:
        return None
    limits = []
    for _, controllers, path in lines:
        version = 2 if controllers == "" else 1 if "cpu" in controllers.split(",") else None
        mount_point, folder = _cgroup_folder(mounts, version, path) if version else (None, None)
        while folder is not None:  # the cgroup, then each parent up to the hierarchy's root
            limits.append(_quota_in(folder, version))
            folder = os.path.dirname(folder) if _within(folder, mount_point) and folder != mount_point else None
    limits = [limit for limit in limits if limit is not None]
    return min(limits) if limits else None


def _cgroup_folder(mounts, version: int, path: str) -> Tuple[Optional[str], Optional[str]]:
    """(mount point, folder) of cgroup `path` in its hierarchy (the mount point itself where the
    mount is a container's own view, which does not show the path)."""
    for fields in mounts:
        if "-" not in fields:
            continue
        after = fields[fields.index("-") + 1:]
        if len(after) < 3 or len(fields) < 5:
            continue
        fstype, options = after[0], after[2].split(",")
        if (version == 2 and fstype == "cgroup2") or (version == 1 and fstype == "cgroup" and "cpu" in options):
            mount_root, mount_point = fields[3], fields[4]
            inside = os.path.relpath(path, mount_root) if _within(path, mount_root) else "."
            folder = os.path.normpath(os.path.join(mount_point, inside))
            return mount_point, folder if os.path.isdir(folder) else mount_point
    return None, None


def _within(path: str, folder: str) -> bool:
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")


def _quota_in(folder: str, version: int) -> Optional[float]:
    try:
        if version == 2:
            with open(os.path.join(folder, "cpu.max")) as file:
                quota, period = file.read().split()[:2]
        else:
            with open(os.path.join(folder, "cpu.cfs_quota_us")) as file:
                quota = file.read().strip()
            with open(os.path.join(folder, "cpu.cfs_period_us")) as file:
                period = file.read().strip()
        if quota == "max" or int(quota) <= 0 or int(period) <= 0:
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


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
    """Intra-op threads for each rank: the learner's cores (`cpu_cores`), or OMP_NUM_THREADS where
    set lower (a hub may set it as each learner's share), divided among the ranks.

    A forked rank must use one: once the parent has used torch's OpenMP pool, a forked child that
    runs an op on several threads hangs forever. A spawned rank may share the cores.
    """
    if start_method == "fork":
        return 1
    cores = cpu_cores()
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if limit.isdigit() and int(limit) > 0:
        cores = min(cores, int(limit))
    return max(1, cores // max(1, nprocs))


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
