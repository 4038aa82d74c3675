"""A class graded as a SLURM job array: a task per chunk of learners, each grading them in their
sandboxes on its node into a state file of its own; the submitter merges those files into the
class's one state file as they grow, and reports a task that failed as its learners' errors.

Beside the gradebook (grades.slurm/ for grades.csv), a folder per array submitted (run-*):
manifest.json (the lesson, each task's learners, the limits), grade.sbatch, job (its id), and per
task task-N.jsonl (class_grading's state format, flushed per learner), task-N.out (its log) and
task-N.done. Each task runs `python -m course_lib.authoring.slurm_grading RUN_FOLDER TASK`: this
Python and these folders must be on storage the nodes see, as for run-solutions --slurm.
"""
import json
import math
import re
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from . import class_grading, sandbox, slurm_run
from .class_grading import RANKS_PER_SUBMISSION, StateFile, StateFileError, file_sha256
from .gradebook import ERROR, LearnerGrade
from .submissions import Submission

MANIFEST, JOB_ID = "manifest.json", "job"
LIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
               "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT"}


@dataclass
class ArrayRequest:
    """What each task of the array asks SLURM for, and how the class is cut into tasks."""

    partition: Optional[str] = None   # None: the site's default
    time_limit: Optional[str] = None  # per task; None: enough for its learners at --timeout each
    chunk: int = 1                    # learners per task
    jobs: int = 1                     # submissions a task grades at a time (2 cores each)
    extra: tuple = ()                 # sbatch options passed through as they are, e.g. --account=x


def runs_folder_for(state: Path) -> Path:
    """grades.slurm beside grades.state.jsonl: the arrays submitted for this gradebook."""
    return Path(state).with_name(Path(state).name.replace(".state.jsonl", "") + ".slurm")


def time_limit_for(request: ArrayRequest, timeout_s: float) -> str:
    """--time, or each of a task's rounds of learners at the notebook timeout, plus 5 minutes."""
    if request.time_limit:
        return request.time_limit
    seconds = math.ceil(request.chunk / request.jobs) * timeout_s + 300
    return time.strftime("%H:%M:%S", time.gmtime(seconds)) if seconds < 86400 else \
        f"{int(seconds // 86400)}-" + time.strftime("%H:%M:%S", time.gmtime(seconds % 86400))


class TaskFile(StateFile):
    """A task's state file, read while the task may still be appending to it."""

    def grades(self) -> dict:
        return self._read() if self.path.exists() else {}


class Run:
    """One submitted array: its folder, its tasks' learners, its job id (None until sbatch said)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.manifest = json.loads((self.folder / MANIFEST).read_text(encoding="utf-8"))
        job = self.folder / JOB_ID
        self.job_id = job.read_text().strip() if job.exists() else None
        self.ended = {}  # {task: scontrol's fields}, once the task ended without finishing

    @property
    def tasks(self) -> list:
        return [[item["learner"] for item in chunk] for chunk in self.manifest["chunks"]]

    def task_file(self, task: int) -> Path:
        return self.folder / f"task-{task}.jsonl"

    def log(self, task: int) -> Path:
        return self.folder / f"task-{task}.out"

    def finished(self, task: int) -> bool:
        return (self.folder / f"task-{task}.done").exists()

    def graded(self, solution: Path) -> dict:
        found = {}
        for task in range(len(self.tasks)):
            found.update(TaskFile(self.task_file(task), solution).grades())
        return found

    def live_tasks(self) -> set:
        """Tasks SLURM still holds (pending, running, requeued); each other unfinished one is put
        in `ended` with its last fields ({} once slurmctld forgot it)."""
        unfinished = {task for task in range(len(self.tasks)) if not self.finished(task)}
        if not unfinished or self.job_id is None:  # killed before sbatch answered: nothing to wait for
            self.ended.update({task: {} for task in unfinished})
            return set()
        states = array_tasks(self.job_id)
        live = {task for task in unfinished if states.get(task, {}).get("JobState") in LIVE_STATES}
        self.ended.update({task: states.get(task, {}) for task in unfinished - live})
        for task in live:  # requeued after it was seen ending (pre-empted)
            self.ended.pop(task, None)
        return live


def array_tasks(job_id: str) -> dict:
    """{task: fields} of an array job from `scontrol show job` (pending tasks share one record,
    ArrayTaskId=2-5,7%2); {} once slurmctld has forgotten it."""
    try:
        output = slurm_run.slurm_command("scontrol", "show", "job", "--oneliner", job_id)
    except slurm_run.SlurmError as error:
        if "Invalid job id" in str(error):
            return {}
        raise
    tasks = {}
    for line in output.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S*)", line))
        for task in task_ids(fields.get("ArrayTaskId", "")):
            tasks[task] = fields
    return tasks


def task_ids(text: str) -> list:
    """[2, 3, 4, 5, 7] for SLURM's '2-5,7%2'; [] for ''."""
    ids = []
    for part in filter(None, text.split("%")[0].split(",")):
        first, _, last = part.partition("-")
        ids += range(int(first), int(last or first) + 1)
    return ids


def batch_script(run: Path, root: Path, tasks: int, request: ArrayRequest, time_limit: str) -> str:
    """The array: task N runs this module on the node for the learners of chunk N."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name=grade-{run.name}", f"#SBATCH --array=0-{tasks - 1}",
             "#SBATCH --nodes=1", "#SBATCH --ntasks=1",
             f"#SBATCH --cpus-per-task={request.jobs * RANKS_PER_SUBMISSION}",
             f"#SBATCH --time={time_limit}", f"#SBATCH --output={run}/task-%a.out"]
    lines += [f"#SBATCH --partition={request.partition}"] if request.partition else []
    lines += [f"#SBATCH {option}" for option in request.extra]
    command = [slurm_run.PYTHON, "-m", "course_lib.authoring.slurm_grading", str(run)]
    lines += ["", "set -euo pipefail", f"cd {shlex.quote(str(root))}",
              " ".join(shlex.quote(part) for part in command) + ' "$SLURM_ARRAY_TASK_ID"']
    return "\n".join(lines) + "\n"


def submit_array(folder: Path, solution: Path, pending: list, request: ArrayRequest, timeout_s: float,
                 cell_timeout_s: float, limits) -> Run:
    """Write a run folder for the `pending` submissions, a task per `chunk` of them, and sbatch it;
    SlurmError, and no folder left, where SLURM refuses."""
    folder.mkdir(exist_ok=True)
    run = folder / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{len(list(folder.glob('run-*')))}"
    run.mkdir()
    chunks = [pending[start:start + request.chunk] for start in range(0, len(pending), request.chunk)]
    kept_limits = {key: value for key, value in asdict(limits).items() if key != "processes"} \
        if limits is not None else None  # the node counts its own cores for the process cap
    manifest = {"solution": str(Path(solution).resolve()), "timeout_s": timeout_s,
                "cell_timeout_s": cell_timeout_s, "jobs": request.jobs, "sandbox": kept_limits,
                "chunks": [[{"learner": item.learner, "notebook": str(Path(item.notebook).resolve()),
                             "notes": list(item.notes)} for item in chunk] for chunk in chunks]}
    (run / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    script = run / "grade.sbatch"
    script.write_text(batch_script(run, Path(solution).resolve().parents[1], len(chunks), request,
                                   time_limit_for(request, timeout_s)))
    try:
        job_id = slurm_run.submit(script)
    except slurm_run.SlurmError:
        for path in run.iterdir():  # refused: no task will ever read it
            path.unlink()
        run.rmdir()
        raise
    (run / JOB_ID).write_text(job_id)
    return Run(run)


def grade_class_on_slurm(solution: Path, submissions, request: ArrayRequest, *, state: Path,
                         resume: bool = False, timeout_s: float, cell_timeout_s: float, sandbox=None,
                         on_graded=None, say=print, poll_s: float = 1.0) -> list:
    """class_grading.grade_class's contract, through a job array: a LearnerGrade per submission
    with a notebook, merged into `state` as the tasks give them. With `resume`, grades kept in
    `state` or in the task files of earlier arrays count, and learners of tasks still pending or
    running are waited for, not submitted again. Ctrl-C cancels the arrays it waits for."""
    slurm_run.slurm_command("sbatch", "--version")  # no SLURM here: say so before writing anything
    gradable = [submission for submission in submissions if submission.notebook is not None]
    folder = runs_folder_for(state)
    if not resume and folder.exists() and any(folder.iterdir()):
        raise StateFileError(f"{folder} holds the arrays of an earlier --slurm run: add --resume to "
                             f"keep their grades, or delete it (scancel its jobs first) to grade "
                             f"everyone again")
    journal = StateFile(state, solution)
    shas = {submission.learner: file_sha256(submission.notebook) for submission in gradable}
    grades = {learner: grade for learner, grade in journal.start(resume).items()
              if shas.get(learner) == grade.sha256}
    runs = [Run(path) for path in sorted(folder.glob("run-*")) if (path / MANIFEST).exists()] \
        if resume else []

    def merge() -> None:  # each new grade of a task: into the one state file, then counted
        for run in runs:
            for learner, grade in run.graded(solution).items():
                if learner not in grades and shas.get(learner) == grade.sha256:
                    grades[learner] = grade
                    journal.append(grade)
                    if on_graded:
                        on_graded(grade, len(grades), len(gradable))

    if on_graded and grades:
        on_graded(None, len(grades), len(gradable))
    merge()
    live = {run: run.live_tasks() for run in runs}
    waiting = [run for run in runs if live[run]]
    in_flight = {learner for run in waiting for task in live[run] for learner in run.tasks[task]}
    for run in waiting:
        say(f"following job {run.job_id} submitted earlier ({run.folder.name}): its learners are "
            f"not submitted again")
    pending = [item for item in gradable if item.learner not in grades and item.learner not in in_flight]
    try:
        if pending:
            run = submit_array(folder, solution, pending, request, timeout_s, cell_timeout_s, sandbox)
            runs.append(run)
            waiting.append(run)
            say(f"submitted job {run.job_id}: {len(run.tasks)} task(s) of up to {request.chunk} "
                f"learner(s) (partition {request.partition or 'default'}, "
                f"{request.jobs * RANKS_PER_SUBMISSION} CPUs and time limit "
                f"{time_limit_for(request, timeout_s)} each): {run.folder}")
        _wait(waiting, merge, say, poll_s)
    except KeyboardInterrupt:  # every array this run waits for, one sbatch answered a moment ago too
        known = {run.folder for run in runs}
        for run in waiting + [Run(path) for path in folder.glob("run-*") if path not in known]:
            if run.job_id:
                slurm_run.cancel(run.job_id)
        merge()
        raise
    for run in reversed(runs):  # the latest array's word on a learner first
        for task, learners in enumerate(run.tasks):
            for learner in learners:
                if learner not in grades and learner in shas:
                    grades[learner] = _not_graded(learner, run, task, gradable)
    return [grades.get(item.learner) or _not_graded(item.learner, None, None, gradable)
            for item in gradable]


def _wait(waiting: list, merge, say, poll_s: float) -> None:
    """Until no task of `waiting` is live: merge what the tasks wrote, say each change of counts."""
    shown = None
    while True:
        live = {run.job_id: run.live_tasks() for run in waiting}
        merge()  # after the states: a task seen ended has written all it will
        counts = ", ".join(f"job {job}: {len(tasks)} task(s) pending or running"
                           for job, tasks in live.items() if tasks)
        if not counts:
            return
        if counts != shown:
            say(counts)
            shown = counts
        time.sleep(poll_s)


def _not_graded(learner: str, run: Optional[Run], task, gradable) -> LearnerGrade:
    """An error row: the task that should have graded the learner ended without it, and why."""
    submission = next(item for item in gradable if item.learner == learner)
    job = slurm_run.Job(f"{run.job_id}_{task}", run.folder / "grade.sbatch", run.log(task), None) \
        if run is not None else None
    if run is None:
        why = "no task graded this version of the notebook (it changed while an array graded it)"
    elif run.finished(task):  # its grading crashed: the log says how
        tail = "\n".join(job.log.read_text(errors="replace").splitlines()[-15:]) \
            if job.log.exists() else "(empty)"
        why = f"SLURM task {job.id} finished without grading it. The end of its log {job.log}:\n{tail}"
    else:
        why = f"not graded: its SLURM task {slurm_run.why_no_report(job, run.ended.get(task, {}))}"
    why += "\nRun again with --resume to grade it again."
    return LearnerGrade(learner, str(submission.notebook), ERROR, notes=list(submission.notes) + [why],
                        sha256=file_sha256(submission.notebook))


# -- the node's side: one task of the array ----------------------------------------------------------

def run_task(run_folder: Path, task: int) -> int:
    """Grade chunk `task` of the run's manifest into its task file, then mark the task done."""
    run = Run(run_folder)
    manifest = run.manifest
    limits = manifest["sandbox"]
    if limits is not None:
        missing = sandbox.why_unavailable()
        if missing:
            print(f"cannot grade sealed on this node: {missing}", file=sys.stderr)
            return 2
        limits = sandbox.Limits(**limits)
    chunk = [Submission(item["learner"], Path(item["notebook"]), item["notes"])
             for item in manifest["chunks"][task]]

    def say(grade, done, total):
        if grade is not None:
            print(f"[{done}/{total}] {grade.learner}: {grade.status}"
                  + "".join(f"\n    {note}" for note in grade.notes if grade.status == ERROR), flush=True)

    class_grading.grade_class(Path(manifest["solution"]), chunk, timeout_s=manifest["timeout_s"],
                              cell_timeout_s=manifest["cell_timeout_s"], jobs=manifest["jobs"],
                              sandbox=limits, state=run.task_file(task), resume=True, on_graded=say)
    (run.folder / f"task-{task}.done").write_text("")
    return 0


if __name__ == "__main__":
    sys.exit(run_task(Path(sys.argv[1]), int(sys.argv[2])))
