"""`python -m course_lib check NN CLASS --slurm` on the local one-node SLURM (tests/slurm_cluster.py):
the class graded as a job array gives the gradebook local grading gives, a submitter killed while
its tasks run is resumed without grading anyone twice, and a task that fails is each of its
learners' error row, with the task's log. The class is the fixture course's tiny lesson.
"""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from course_lib.authoring import slurm_grading, slurm_run
from course_lib.authoring.commands import check_main
from slurm_cluster import slurm_cluster  # noqa: F401  the session's one-node SLURM
from test_gradebook import comparable, kill_once_graded, state_records, write
from test_grading import FIXTURES, LESSON, solved

CLASS = {"ann": solved, "bob": lambda: solved(wrong_area=True), "cy": None}  # right, wrong, broken
SLURM = ["--slurm", "--partition", "cpu", "--time", "00:05:00", "--timeout", "120"]


@pytest.fixture
def sealing():
    from course_lib.authoring import sandbox
    return [] if sandbox.why_unavailable() == "" else ["--no-sandbox"]


def make_class(folder: Path, learners=CLASS) -> Path:
    for learner, notebook in learners.items():
        if notebook is None:  # broken: not JSON, so graded at once, without a kernel
            (folder / learner).mkdir(parents=True)
            (folder / learner / LESSON.name).write_text('{"cells": [')
        else:
            write(notebook(), folder / learner / LESSON.name)
    return folder


def csv_rows(path: Path) -> dict:
    with open(path, newline="", encoding="utf-8-sig") as file:
        return {row["learner"]: row for row in csv.DictReader(file)}


def test_array_task_ids_and_time_limits_read_as_slurm_writes_them():
    assert slurm_grading.task_ids("2-5,7%2") == [2, 3, 4, 5, 7]
    assert slurm_grading.task_ids("0") == [0] and slurm_grading.task_ids("") == []
    request = slurm_grading.ArrayRequest(chunk=5, jobs=2)
    assert slurm_grading.time_limit_for(request, 900) == "00:50:00"  # 3 rounds of 900 s, + 300 s
    assert slurm_grading.time_limit_for(slurm_grading.ArrayRequest(chunk=100), 900) == "1-01:05:00"
    assert slurm_grading.runs_folder_for(Path("/x/grades.state.jsonl")) == Path("/x/grades.slurm")


def test_no_sbatch_on_path_says_so_and_leaves_no_state(tmp_path, capsys, monkeypatch, sealing):
    make_class(tmp_path / "class", {"ann": solved})
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder with no SLURM in it
    assert check_main(["1", str(tmp_path / "class"), "--csv", str(tmp_path / "grades.csv"),
                       *SLURM, *sealing]) == 2
    assert "`sbatch` is not on PATH: this machine has no SLURM client" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["class"]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_class_through_a_job_array_killed_and_resumed_gives_local_gradings_gradebook(
        slurm_cluster, tmp_path, monkeypatch, sealing, capsys):
    make_class(tmp_path / "class")
    state = tmp_path / "slurm" / "grades.state.jsonl"
    state.parent.mkdir()
    command = [sys.executable, "-m", "course_lib", "check", "1", str(tmp_path / "class"),
               "--csv", str(tmp_path / "slurm" / "grades.csv"), "--chunk", "2",
               "--sbatch-option=--comment=passed-through", *SLURM, *sealing]
    submitter = subprocess.Popen(command, cwd=FIXTURES, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
    kill_once_graded(submitter, state)  # once its first grade is merged: the tasks go on without it
    first = state_records(state)
    said = submitter.stdout.read()
    submitter.stdout.close()
    assert "submitted job" in said and "2 task(s) of up to 2 learner(s)" in said, said
    [run] = (tmp_path / "slurm" / "grades.slurm").iterdir()
    job_id = (run / "job").read_text()
    script = (run / "grade.sbatch").read_text()
    for line in ("--array=0-1", "--cpus-per-task=2", "--partition=cpu", "--time=00:05:00",
                 "--comment=passed-through"):
        assert f"#SBATCH {line}\n" in script, script
    assert len(first) == 1 and not (tmp_path / "slurm" / "grades.csv").exists()

    monkeypatch.chdir(FIXTURES)
    assert check_main(["1", str(tmp_path / "class"), "--csv", str(tmp_path / "slurm" / "grades.csv"),
                       "--chunk", "2", "--resume", *SLURM, *sealing]) == 1
    out = capsys.readouterr().out
    assert f"following job {job_id} submitted earlier" in out and "submitted job" not in out, out
    assert list((tmp_path / "slurm" / "grades.slurm").iterdir()) == [run], "an array submitted again"
    resumed = state_records(state)
    tasks = {}
    for task_file in run.glob("task-*.jsonl"):
        tasks.update(state_records(task_file))
    assert {learner: record["graded_at"] for learner, record in resumed.items()} == {
        learner: record["graded_at"] for learner, record in tasks.items()}, "graded twice"
    [(learner, record)] = first.items()
    assert resumed[learner] == record

    assert check_main(["1", str(tmp_path / "class"), "--csv", str(tmp_path / "local.csv"), *sealing]) == 1
    assert comparable(resumed) == comparable(state_records(tmp_path / "local.state.jsonl"))
    assert [(resumed[name]["status"], resumed[name]["passed"]) for name in CLASS] == [
        ("graded", {"check_circle_area": True, "check_unit_circle_area": True}),
        ("graded", {"check_circle_area": False, "check_unit_circle_area": True}),  # pi * 1 == pi
        ("error", {})]
    assert "not a readable notebook" in resumed["cy"]["notes"][0]
    varying = ("graded at", "seconds", "submission")
    strip = {learner: {key: value for key, value in row.items() if key not in varying}
             for learner, row in csv_rows(tmp_path / "slurm" / "grades.csv").items()}
    assert strip == {learner: {key: value for key, value in row.items() if key not in varying}
                     for learner, row in csv_rows(tmp_path / "local.csv").items()}


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_task_that_fails_on_its_node_is_its_learners_error_rows_with_its_log(
        slurm_cluster, tmp_path, monkeypatch, sealing, capsys):
    make_class(tmp_path / "class", {"ann": solved, "bob": solved})
    monkeypatch.setattr(slurm_run, "PYTHON", "/nonexistent/python")  # not on the node's file system
    monkeypatch.chdir(FIXTURES)
    assert check_main(["1", str(tmp_path / "class"), "--csv", str(tmp_path / "grades.csv"),
                       "--json", str(tmp_path / "grades.json"), *SLURM, *sealing]) == 1
    rows = csv_rows(tmp_path / "grades.csv")
    assert {learner: (row["status"], row["total"]) for learner, row in rows.items()} == {
        "ann": ("error", "0"), "bob": ("error", "0")}
    for learner, row in rows.items():
        assert "ended FAILED (exit code 127:0, reason NonZeroExitCode)" in row["notes"], row["notes"]
        assert "/nonexistent/python: No such file or directory" in row["notes"]
        assert "--resume" in row["notes"]
    assert len(json.loads((tmp_path / "grades.json").read_text())["learners"]) == 2
    # an error is not a grade: the state file keeps none, so --resume grades them again
    assert state_records(tmp_path / "grades.state.jsonl") == {}
    assert os.path.getsize(tmp_path / "grades.state.jsonl") > 0


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ctrl_c_of_the_submitter_cancels_the_array(slurm_cluster, tmp_path, sealing):
    make_class(tmp_path / "class", {"ann": solved})
    submitter = subprocess.Popen(
        [sys.executable, "-m", "course_lib", "check", "1", str(tmp_path / "class"), "--csv",
         str(tmp_path / "grades.csv"), *SLURM, *sealing], cwd=FIXTURES, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    try:
        runs = tmp_path / "grades.slurm"
        while not list(runs.glob("run-*/job")):
            assert submitter.poll() is None, submitter.stdout.read()
            time.sleep(0.1)
        [job] = runs.glob("run-*/job")
        slurm_cluster.wait(job.read_text(), 100, until=("RUNNING",))
        submitter.send_signal(signal.SIGINT)
        assert submitter.wait(timeout=60) == 130
    finally:
        if submitter.poll() is None:
            submitter.kill()
            submitter.wait()
    said = submitter.stdout.read()
    submitter.stdout.close()
    assert "interrupted: cancelled the class's SLURM jobs" in said, said
    assert slurm_cluster.wait(job.read_text(), 30, until=("CANCELLED",))["JobState"] == "CANCELLED"
