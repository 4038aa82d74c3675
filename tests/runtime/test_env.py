"""course_lib.runtime.shared.env: the backend, start method, threads and device each rank gets (logic, on CPU)."""
import shutil
import subprocess
import sys

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
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # a hub's share for this learner: divided among the ranks
    assert env.threads_per_rank(2, "spawn") == 2
    assert env.threads_per_rank(8, "spawn") == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "16")  # more than the cores: the cores decide
    assert env.threads_per_rank(2, "spawn") == 4


def fake_cgroups(tmp_path, proc_cgroup: str, mounts: list, files: dict):
    """/proc/self/cgroup, /proc/self/mountinfo and the cgroup files, under tmp_path."""
    for relative, text in files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    (tmp_path / "cgroup").write_text(proc_cgroup)
    lines = [f"{30 + i} 25 0:{26 + i} {root} {tmp_path / point} rw,nosuid - {fstype} cgroup rw,{options}"
             for i, (root, point, fstype, options) in enumerate(mounts)]
    (tmp_path / "mountinfo").write_text("20 1 8:1 / / rw - ext4 /dev/sda1 rw\n" + "\n".join(lines) + "\n")
    return env.cgroup_cpu_limit(str(tmp_path / "cgroup"), str(tmp_path / "mountinfo"))


def test_a_cgroup_v2_quota_and_its_parents_lowest(tmp_path):
    v2 = [("/", "cg", "cgroup2", "nsdelegate")]
    spawner = {"cg/hub.slice/learner/cpu.max": "150000 100000\n", "cg/hub.slice/cpu.max": "max 100000\n"}
    assert fake_cgroups(tmp_path, "0::/hub.slice/learner\n", v2, spawner) == 1.5
    parent = {**spawner, "cg/hub.slice/cpu.max": "100000 100000\n"}
    assert fake_cgroups(tmp_path, "0::/hub.slice/learner\n", v2, parent) == 1.0
    unlimited = {"cg/hub.slice/learner/cpu.max": "max 100000\n", "cg/hub.slice/cpu.max": "max 100000\n"}
    assert fake_cgroups(tmp_path, "0::/hub.slice/learner\n", v2, unlimited) is None


def test_a_cgroup_v1_quota_including_a_containers_own_view(tmp_path):
    v1 = [("/", "cpu", "cgroup", "cpu,cpuacct"), ("/", "memory", "cgroup", "memory")]
    files = {"cpu/docker/abc/cpu.cfs_quota_us": "250000\n", "cpu/docker/abc/cpu.cfs_period_us": "100000\n",
             "memory/docker/abc/cpu.cfs_quota_us": "100000\n"}  # not the cpu hierarchy: not read
    cgroups = "5:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n"
    assert fake_cgroups(tmp_path, cgroups, v1, files) == 2.5
    # inside the container the mount's root is its own cgroup, and the path is not below the mount
    container = [("/docker/abc", "cpu", "cgroup", "cpu,cpuacct")]
    files = {"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}
    assert fake_cgroups(tmp_path, "4:cpu,cpuacct:/docker/abc\n", container, files) == 0.5
    files["cpu/cpu.cfs_quota_us"] = "-1\n"
    assert fake_cgroups(tmp_path, "4:cpu,cpuacct:/docker/abc\n", container, files) is None


def test_the_cores_are_the_affinity_lowered_by_the_quota_rounded_up(monkeypatch):
    monkeypatch.setattr(env.os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(env, "cgroup_cpu_limit", lambda: 2.5)
    assert env.cpu_cores() == 3
    monkeypatch.setattr(env, "cgroup_cpu_limit", lambda: 0.2)
    assert env.cpu_cores() == 1
    monkeypatch.setattr(env, "cgroup_cpu_limit", lambda: 64.0)
    assert env.cpu_cores() == 8
    monkeypatch.setattr(env, "cgroup_cpu_limit", lambda: None)
    assert env.cpu_cores() == 8
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert env.threads_per_rank(2, "spawn") == 4


PINNED_TO_ONE_CORE = """
import warnings
from course_lib.runtime.shared import env
from course_lib import launch
print("cores", env.cpu_cores(), "threads", env.threads_per_rank(1, "spawn"))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    launch(lambda: None, nprocs=2, output="none")
print("warned", [str(w.message).split(":")[0] for w in caught])
"""


@pytest.mark.slow  # a fresh Python imports torch on one core; the fast tier has the logic above
@pytest.mark.skipif(not shutil.which("taskset"), reason="needs taskset (util-linux)")
@pytest.mark.timeout(120)
def test_a_kernel_pinned_to_one_core_gets_one_and_the_warning_says_so():
    result = subprocess.run(["taskset", "-c", "0", sys.executable, "-c", PINNED_TO_ONE_CORE],
                            capture_output=True, text=True, timeout=100)
    assert result.returncode == 0, result.stderr
    assert "cores 1 threads 1" in result.stdout
    assert "warned ['2 ranks on 1 CPU cores']" in result.stdout


def test_each_rank_computes_on_its_own_gpu_under_nccl(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert env.device_for_rank(3, "nccl") == torch.device("cuda", 3)
    assert env.device_for_rank(1, "gloo") == torch.device("cpu")
