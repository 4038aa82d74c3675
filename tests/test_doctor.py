"""`python -m course_lib doctor`: a readable table, and a non-zero exit when the course cannot run."""
import collections
import subprocess
import sys

import pytest

from course_lib.runtime import doctor

pytestmark = pytest.mark.timeout(120)


def test_doctor_reports_this_machine_and_a_timed_test_launch():
    result = subprocess.run([sys.executable, "-m", "course_lib", "doctor"], capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    for item in ("Python", "torch", "CPU cores", "gloo", "/dev/shm", "launch would use",
                 "test launch (2 ranks, all_reduce)"):
        assert item in result.stdout
    assert "Ready" in result.stdout


def test_doctor_fails_when_torch_is_too_old(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "MIN_TORCH", (99, 0))
    assert doctor.main(["--no-launch"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: the course needs torch>=99.0" in out and "cannot run the course" in out


def test_doctor_fails_when_the_test_launch_fails(monkeypatch, capsys):
    def broken_launch(*args, **kwargs):
        raise RuntimeError("ranks could not meet")

    monkeypatch.setattr(sys.modules["course_lib.runtime.launch"], "launch", broken_launch)
    assert doctor.main([]) == 1
    assert "FAIL: ranks could not meet" in capsys.readouterr().out


def test_a_small_dev_shm_gets_advice(monkeypatch):
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: usage(64 << 20, 0, 64 << 20))
    shm = next(f for f in doctor.diagnose(test_launch=False) if f.item == "/dev/shm")
    assert shm.value == "0.1 GiB" and "SIGBUS" in shm.status and "--shm-size" in shm.status


def test_gpus_are_described_without_initialising_cuda_here(monkeypatch):
    import torch

    monkeypatch.setattr(doctor.env, "gpu_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: pytest.fail("initialised CUDA in the notebook's process"))
    asked = []

    def child(command, **kwargs):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, '[["NVIDIA H200", 150000000000], ["NVIDIA H200", 150000000000]]\n', "")

    monkeypatch.setattr(doctor.subprocess, "run", child)
    assert doctor.gpu_descriptions() == [("NVIDIA H200", 150000000000)] * 2
    assert asked and asked[0][0] == sys.executable
