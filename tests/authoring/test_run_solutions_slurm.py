"""`python -m course_lib run-solutions --slurm` on the local one-node SLURM (tests/slurm_cluster.py):
it writes the batch script, submits it, follows the job and prints the node's report; and where
SLURM is absent or refuses, it says why instead of waiting.
"""
import re
import shutil
from pathlib import Path

import pytest

from course_lib.authoring import slurm_run
from course_lib.authoring.commands import run_solutions_main
from slurm_cluster import slurm_cluster  # noqa: F401  the session's one-node SLURM

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def course(tmp_path):
    shutil.copytree(FIXTURES, tmp_path / "course")
    return tmp_path / "course"


def run_on_slurm(course, *options):
    return run_solutions_main(["--root", str(course), "--slurm", "--partition", "cpu",
                               "--cpus-per-task", "1", "--time", "00:05:00", "--timeout", "120",
                               *options])


@pytest.mark.slow
def test_run_solutions_through_slurm_prints_the_nodes_report(slurm_cluster, course, capsys):
    assert run_on_slurm(course) == 0
    out = capsys.readouterr().out
    print(out)
    job_id = re.search(r"^submitted job (\d+) \(1 notebooks, partition cpu, 0 GPUs, 1 CPUs, "
                       r"time limit 00:05:00\): (\S+\.sbatch)$", out, re.MULTILINE)
    assert job_id, out
    script = Path(job_id[2]).read_text()
    assert "#SBATCH --partition=cpu" in script and "--gpus-per-node" not in script
    assert f"job {job_id[1]}: RUNNING on {slurm_cluster.node}" in out  # its state while it waits
    assert re.search(rf"^job {job_id[1]}: RUNNING on \S+: \[1/1\] (running|pass) 01_circle\.ipynb", out,
                     re.MULTILINE), out  # and which notebook
    assert f"job {job_id[1]}: COMPLETED" in out
    header, row = out.splitlines()[-2:]
    assert header.startswith("notebook") and header.endswith("device")  # the table of a local run
    device = r"(cpu x\d+ \(gloo\)|\d+x .+ \((nccl|gloo).*\))"  # what describe_device says on the node
    assert re.match(rf"01_circle\.ipynb\s+pass\s+[\d.]+\s+{slurm_cluster.node}: {device}$", row), row


def test_no_sbatch_on_path_says_so_at_once(course, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder with no SLURM in it
    assert run_on_slurm(course) == 2
    err = capsys.readouterr().err
    assert "`sbatch` is not on PATH: this machine has no SLURM client" in err, err
    assert not (course / slurm_run.RUNS_FOLDER).exists()


@pytest.mark.slow
def test_a_partition_that_does_not_exist_is_refused_with_slurms_words(slurm_cluster, course, capsys):
    assert run_solutions_main(["--root", str(course), "--slurm", "--partition", "nowhere",
                               "--cpus-per-task", "1", "--time", "00:05:00"]) == 2
    err = capsys.readouterr().err
    assert "SLURM refused the job" in err and "invalid partition specified: nowhere" in err, err


@pytest.mark.slow
def test_a_job_that_fails_on_the_node_shows_its_state_and_its_log(slurm_cluster, course, capsys,
                                                                   monkeypatch):
    monkeypatch.setattr(slurm_run, "PYTHON", "/nonexistent/python")  # not on the node's file system
    assert run_on_slurm(course) == 1
    captured = capsys.readouterr()
    print(captured.out, captured.err)
    assert re.search(r"job \d+ ended FAILED \(exit code 127:0, reason NonZeroExitCode\) on \S+ before it "
                     r"wrote its report", captured.err), captured.err
    assert "/nonexistent/python: No such file or directory" in captured.err
