"""The launcher never initialises CUDA in the notebook's process before it forks the ranks.

A parent that called cudaGetDeviceCount (what `torch.cuda.is_available()` does by default) forks
children that cannot use the GPU. On this CPU machine we fake a CUDA build whose NVML sees no GPU,
and make every CUDA entry point raise in the parent (not in the ranks, which inherit the fakes).
"""
import importlib
import os

import pytest
import torch
import torch.distributed as dist

from course_lib import DistributedSession, launch, spawn
from course_lib.runtime.shared import env


@pytest.fixture
def cuda_must_not_start_here(monkeypatch):
    parent = os.getpid()
    lazy_init = torch.cuda._lazy_init

    def device_count_by_the_driver():
        if os.getpid() == parent:
            raise AssertionError("cudaGetDeviceCount called in the launcher's process before fork")
        return 0

    def initialise():
        if os.getpid() == parent:
            raise AssertionError("CUDA initialised in the launcher's process before fork")
        return lazy_init()

    # What launch preloads for its forks, imported before the fake: under a fake CUDA build, torch's
    # own imports look for CUDA functions this CPU build lacks.
    importlib.import_module("torch._dynamo")
    # a CUDA build (torch.cuda._is_compiled looks for this function) on a node whose NVML finds no GPU
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", device_count_by_the_driver, raising=False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 0)
    monkeypatch.setattr(torch.cuda, "_lazy_init", initialise)
    assert torch.cuda._is_compiled()


def _sum_of_ranks():
    total = torch.tensor(float(dist.get_rank() + 1))
    dist.all_reduce(total)
    return total.item()


def _sum_of_ranks_own_group(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        return _sum_of_ranks()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_counting_gpus_and_choosing_backend_and_device_leave_cuda_alone(cuda_must_not_start_here):
    assert env.gpu_count() == 0
    assert env.choose_backend(2)[0] == "gloo"
    assert env.device_for_rank(0) == torch.device("cpu")
    assert env.choose_start_method()[0] == "fork"


@pytest.mark.timeout(120)
def test_launch_spawn_and_a_session_fork_without_touching_cuda(cuda_must_not_start_here):
    assert launch(_sum_of_ranks, nprocs=2, timeout=90, output="none") == [3.0, 3.0]
    assert spawn(_sum_of_ranks_own_group, args=(2,), nprocs=2, timeout=90, output="none") == [3.0, 3.0]
    with DistributedSession(nprocs=2, timeout=90, output="none") as session:
        assert session.run(_sum_of_ranks) == [3.0, 3.0]
