"""Lesson 12's SLURM batch script, submitted to a real one-node SLURM (tests/slurm_cluster.py):
`srun torchrun` trains the course model with DDP on 2 ranks, and a job SLURM pre-empts saves its
checkpoint on SIGTERM, is requeued, and resumes to the losses of a run never interrupted.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.authoring.slurm_run import job_info, submit
from course_lib.topics.cluster import slurm_script
from slurm_cluster import slurm_cluster  # noqa: F401  the session's one-node SLURM

pytestmark = pytest.mark.slow
JOB_TIMEOUT_S = 180
STEPS = 24


@pytest.fixture(scope="module", autouse=True)
def this_pythons_torchrun():
    """Jobs get the submitter's environment: put this Python's torchrun first on their PATH."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        yield


def cpu_job(folder: Path, arguments: str, requeue=False) -> Path:
    """Lesson 12's script for one CPU node and 2 ranks (gloo)."""
    script = slurm_script(f"-m course_lib.examples.preemptible_train {arguments}", nodes=1,
                          gpus_per_node=0, nproc_per_node=2, cpus_per_task=os.cpu_count(),
                          job_name="lesson12", time="00:05:00", output=f"{folder}/%x-%j.out",
                          requeue=requeue)
    path = folder / "lesson12.sbatch"
    path.write_text(script)
    return path


def log_of(folder: Path, job_id: str) -> str:
    return (folder / f"lesson12-{job_id}.out").read_text()


@pytest.fixture(scope="module")
def uninterrupted_job(slurm_cluster, tmp_path_factory):
    """Lesson 12's script run to its end: (job id, its fields, its log, rank 0's losses)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    job_id = submit(cpu_job(folder, f"--steps {STEPS} --losses-json {folder}/losses.json"))
    info = slurm_cluster.wait(job_id, JOB_TIMEOUT_S)
    log = log_of(folder, job_id)
    losses = json.loads((folder / "losses.json").read_text()) if info["JobState"] == "COMPLETED" else None
    return job_id, info, log, losses


def test_lesson12_script_trains_with_ddp_on_two_ranks_through_srun_torchrun(slurm_cluster, uninterrupted_job):
    job_id, info, log, losses = uninterrupted_job
    print(log)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    ranks = sorted(line for line in log.splitlines() if re.match(r"\[rank \d\] on ", line))
    assert len(ranks) == 2, log
    for rank, line in enumerate(ranks):
        # srun ran one task (torchrun) on the node; torchrun started both ranks in it
        for expected in [f"SLURM_JOB_ID={job_id}", "SLURM_PROCID=0", "SLURM_NODEID=0",
                         "SLURM_LOCALID=0", f"RANK={rank}", f"LOCAL_RANK={rank}", "GROUP_RANK=0",
                         "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=2", f"on {slurm_cluster.node}"]:
            assert expected in line, (expected, line)
        assert "gloo" in line or "nccl" in line
        # SRUN_CPUS_PER_TASK: the task sees every CPU the job was given, not one
        assert f", {os.cpu_count()} CPUs," in line, line
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert f"[rank 0] finished {STEPS} steps on 2 ranks: loss {losses[0]:.4f} -> {losses[-1]:.4f}" in log


def test_srun_gives_the_task_one_cpu_without_srun_cpus_per_task(slurm_cluster, tmp_path):
    """Why the script exports SRUN_CPUS_PER_TASK: a step that takes only what it asks for (--exact,
    as some sites make the default) gets one CPU per task, since srun no longer inherits
    --cpus-per-task from the batch allocation (Slurm 22.05)."""
    if os.cpu_count() < 2:
        pytest.skip("needs 2 CPUs to tell 1 from all")
    script = tmp_path / "cpus.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --cpus-per-task={os.cpu_count()}\n"
                      f"#SBATCH --output={tmp_path}/cpus.out\n"
                      "srun --exact bash -c 'echo without: $(nproc)'\n"
                      "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK\n"
                      "srun --exact bash -c 'echo with: $(nproc)'\n")
    assert slurm_cluster.wait(submit(script), JOB_TIMEOUT_S)["JobState"] == "COMPLETED"
    output = (tmp_path / "cpus.out").read_text()
    print(output)
    assert output.splitlines() == ["without: 1", f"with: {os.cpu_count()}"]


def wait_for_line(path: Path, pattern: str, job_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if re.search(pattern, text, re.MULTILINE):
            return text
        if job_info(job_id).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
            pytest.fail(f"job {job_id} ended before printing {pattern!r}:\n{text}")
        time.sleep(0.2)
    subprocess.run(["scancel", job_id], timeout=30)
    pytest.fail(f"no {pattern!r} in {timeout_s} s; cancelled job {job_id}:\n{text}")


def test_a_preempted_job_saves_on_sigterm_and_its_requeued_run_resumes_exactly(slurm_cluster, tmp_path,
                                                                                uninterrupted_job):
    steps = STEPS
    job_id = submit(cpu_job(tmp_path, f"--steps {steps} --step-seconds 0.25 --checkpoint-dir "
                                      f"{tmp_path}/checkpoints --losses-json {tmp_path}/losses.json",
                            requeue=True))
    log = tmp_path / f"lesson12-{job_id}.out"
    wait_for_line(log, r"^\[rank 0\] step 3 ", job_id, JOB_TIMEOUT_S)
    # a job of a higher priority tier needs the node's CPUs: SLURM pre-empts ours (SIGTERM) and requeues it
    urgent = tmp_path / "urgent.sbatch"
    urgent.write_text(f"#!/bin/bash\n#SBATCH --partition=urgent --exclusive --output={tmp_path}/urgent.out\n"
                      "echo urgent job ran\n")
    urgent_id = submit(urgent)
    info = slurm_cluster.wait(job_id, JOB_TIMEOUT_S, until=("COMPLETED", "FAILED", "CANCELLED"))
    text = log.read_text()
    print(text)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, text)
    assert slurm_cluster.wait(urgent_id, 30)["JobState"] == "COMPLETED"
    stopped = re.search(r"^\[rank 0\] stopping on SIGTERM after step (\d+): saved step_0*(\d+)\.pt$",
                        text, re.MULTILINE)
    assert stopped and stopped[1] == stopped[2], text
    assert f"[rank 0] resumed from step_{int(stopped[1]):08d}.pt at step {stopped[1]}" in text
    assert re.search(r"SLURM_RESTART_COUNT=1 ", text) and 0 < int(stopped[1]) < steps
    preempted = json.loads((tmp_path / "losses.json").read_text())
    never_stopped = uninterrupted_job[3]
    print("pre-empted and resumed:", preempted)
    print("uninterrupted:         ", never_stopped)
    assert len(preempted) == steps and preempted == never_stopped
