"""course_lib.runtime.shared.env: the backend, start method, threads and device each rank gets (logic, on CPU)."""
import pytest
import torch
import torch.distributed as dist

from course_lib.runtime.shared import env


@pytest.fixture
def gpus(monkeypatch):
    """Pretend this machine has N GPUs and an NCCL build."""
    def pretend(count):
        monkeypatch.setattr(env, "gpu_count", lambda: count)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    return pretend


def test_nccl_when_every_rank_can_own_a_gpu_else_gloo_with_the_reason(gpus):
    gpus(2)
    assert env.choose_backend(2) == ("nccl", "2 CUDA GPUs, one per rank")
    assert env.choose_backend(3) == ("gloo", "3 ranks but only 2 GPUs, ranks run on the CPU")
    gpus(0)
    assert env.choose_backend(2) == ("gloo", "no CUDA GPU, ranks run on the CPU")


def test_asking_for_nccl_without_enough_gpus_says_what_to_do(gpus):
    gpus(1)
    with pytest.raises(ValueError, match="nprocs=2 but found 1 GPU; use backend='gloo' or nprocs=1"):
        env.choose_backend(2, "nccl")
    assert env.choose_backend(1, "nccl") == ("nccl", "as requested")


def test_fork_unless_cuda_is_initialised_then_spawn(monkeypatch):
    assert env.choose_start_method() == ("fork", "fast, and sees functions defined in this notebook")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert env.choose_start_method()[0] == "spawn"
    with pytest.raises(RuntimeError, match="Use start_method='spawn'"):
        env.choose_start_method("fork")


def test_forked_ranks_get_one_thread_spawned_ones_share_the_cores(monkeypatch):
    monkeypatch.setattr(env, "cpu_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert env.threads_per_rank(2, "fork") == 1
    assert env.threads_per_rank(2, "spawn") == 4
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert env.threads_per_rank(2, "spawn") == 2


def test_each_rank_computes_on_its_own_gpu_under_nccl(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert env.device_for_rank(3, "nccl") == torch.device("cuda", 3)
    assert env.device_for_rank(1, "gloo") == torch.device("cpu")
