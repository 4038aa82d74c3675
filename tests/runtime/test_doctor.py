"""`python -m course_lib doctor`: a readable table, and a non-zero exit when the course cannot run."""
import collections
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.runtime.launcher import capacity, doctor

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_doctor_reports_this_machine_and_a_timed_test_launch():
    result = subprocess.run([sys.executable, "-m", "course_lib", "doctor"], capture_output=True,
                            text=True, timeout=100)
    assert result.returncode == 0, result.stdout + result.stderr
    for item in ("Python", "torch", "CPU cores", "gloo", "/dev/shm", "launch would use",
                 "test launch (2 ranks, all_reduce)", "lesson step (20 DDP steps, 2 ranks)",
                 "learners this node serves", "This node serves about"):
        assert item in result.stdout
    assert "Ready" in result.stdout


def test_doctor_fails_when_torch_is_too_old(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "MIN_TORCH", (99, 0))
    assert doctor.main(["--no-launch"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: the course needs torch>=99.0" in out and "cannot run the course" in out


@pytest.mark.parametrize("version, status", [
    ("2.3.1", "FAIL: the course needs torch>=2.4 (tested: 2.4 to 2.15)"),
    ("2.4.0", "ok"), ("2.13.0+cpu", "ok"), ("2.15.0+cu132", "ok"), ("2.15.2rc1", "ok"),
    ("2.16.0", "WARN: newer than the course is tested on (2.4 to 2.15); if a lesson fails, "
               "pip install 'torch<2.16' and tell us"),
    ("2.16.0.dev20270101+cpu", "WARN"), ("3.0.0", "WARN"),
])
def test_torch_outside_the_tested_range_is_a_warning_or_a_failure(monkeypatch, version, status):
    monkeypatch.setattr(doctor, "MIN_TORCH", (2, 4))
    monkeypatch.setattr(doctor, "NEWEST_TESTED_TORCH", (2, 15))
    assert doctor.torch_status(version).startswith(status)


def test_doctor_warns_but_passes_on_a_torch_newer_than_the_tested_range(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "NEWEST_TESTED_TORCH", (2, 3))
    assert doctor.main(["--no-launch"]) == 0
    out = capsys.readouterr().out
    torch_row = next(line for line in out.splitlines() if line.startswith("torch "))
    assert "WARN: newer than the course is tested on" in torch_row
    assert "Ready to try: read the WARN lines above." in out


def test_the_tested_range_starts_at_the_declared_lower_bounds():
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"torch>={".".join(map(str, doctor.MIN_TORCH))}"' in pyproject
    assert f'requires-python = ">={".".join(map(str, doctor.MIN_PYTHON))}"' in pyproject
    assert doctor.MIN_TORCH <= doctor.NEWEST_TESTED_TORCH


def test_doctor_fails_when_the_test_launch_fails(monkeypatch, capsys):
    def broken_launch(*args, **kwargs):
        raise RuntimeError("ranks could not meet")

    import course_lib.runtime.launcher.launch  # imported by the test itself: it runs alone too

    monkeypatch.setattr(course_lib.runtime.launcher.launch, "launch", broken_launch)
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


@pytest.mark.parametrize("at_once_s, measured, target_s, served", [
    (1.0, 2, 2.0, 4),   # 2 learners at once took 1 s: 4 at once take about 2 s
    (0.7, 2, 2.0, 5),   # rounded down: 5.7 learners are 5
    (5.0, 2, 2.0, 0),   # too slow even for those measured
    (0.5, 8, 1.0, 16),
])
def test_the_learners_served_grow_with_the_target_and_shrink_with_the_time_at_once(at_once_s, measured,
                                                                                    target_s, served):
    assert capacity.learners_served(at_once_s, measured, target_s) == served


@pytest.fixture
def measured_without_launching(monkeypatch):
    ping = [doctor.Finding("test launch (2 ranks, all_reduce)", "0.20 s", "ok")]
    monkeypatch.setattr(doctor, "_launch_findings", lambda nprocs: ping)
    asked = []

    def measure(target_s):
        asked.append(target_s)
        return capacity.Capacity(0.31, 0.62, 2, capacity.learners_served(0.62, 2, target_s), target_s)
    monkeypatch.setattr(capacity, "measure", measure)
    return asked


def test_doctor_says_how_many_learners_the_node_serves_and_on_what_assumption(measured_without_launching, capsys):
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "0.31 s alone, 0.62 s with 2 learners at once" in out
    assert ("This node serves about 6 learners at <= 2 s per lesson step (20 DDP steps on 2 ranks: 0.31 s "
            "alone, 0.62 s with 2 learners at once), if every learner runs a lesson step at the same moment") in out
    assert doctor.main(["--target", "0.5"]) == 0
    assert "serves about 1 learner at <= 0.5 s per lesson step" in capsys.readouterr().out
    assert measured_without_launching == [2.0, 0.5]


def test_doctor_without_a_launch_measures_no_class(measured_without_launching, capsys):
    assert doctor.main(["--no-launch"]) == 0
    assert measured_without_launching == [] and "serves" not in capsys.readouterr().out


def test_the_lesson_step_trains_the_courses_model():
    from course_lib import make_model

    shapes = lambda model: [tuple(p.shape) for p in model.parameters()]  # noqa: E731
    assert shapes(capacity.lesson_model()) == shapes(make_model())


@pytest.mark.slow  # K learners each launching 2 ranks, forked from this process
def test_learners_at_once_each_time_their_own_lesson_steps():
    seconds = capacity.lesson_steps_at_once(2, rounds=1)
    assert len(seconds) == 2 and all(0 < s < 60 for s in seconds)
