"""run-solutions through SLURM: write a batch script, submit it with sbatch, follow the job (queued,
running, which notebook) until it ends, or say why SLURM would not run it.

The node runs the same `python -m course_lib run-solutions` (this Python, this course folder: both
must be on storage the node sees, as a cluster's home usually is) and writes its report as JSON
(run_solutions.write_report). Plain functions: commands.py says what happens as they run.
"""
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

RUNS_FOLDER = ".run-solutions"  # in the course folder: the batch scripts, logs and reports
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
COMMAND_TIMEOUT_S = 120  # sbatch and scontrol retry an unreachable controller, then give up
PYTHON = sys.executable  # the Python the node runs: this one, seen through the shared file system


class SlurmError(RuntimeError):
    """SLURM is absent, refused the job, or the job ended without a result: the message says which."""


@dataclass
class JobRequest:
    """What the batch job asks SLURM for."""

    partition: Optional[str] = None  # None: the site's default
    gpus_per_node: int = 0           # 0: a CPU node
    cpus_per_task: int = 4
    time_limit: str = "01:00:00"     # SLURM's HH:MM:SS


@dataclass
class Job:
    """A submitted run-solutions job and its files (in the course's RUNS_FOLDER)."""

    id: str
    script: Path
    log: Path      # what the job prints; follow() reads the notebook it is at from it
    report: Path   # the node's report, once the run ends


def batch_script(root: Path, folder: Path, numbers: list, request: JobRequest, timeout_s: float,
                 write: bool = False) -> str:
    """The job: this Python runs run-solutions on the node, for the notebooks asked for."""
    lines = ["#!/bin/bash", "#SBATCH --job-name=run-solutions", "#SBATCH --nodes=1",
             "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={request.cpus_per_task}"]
    if request.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={request.gpus_per_node}")
    lines.append(f"#SBATCH --time={request.time_limit}")
    if request.partition:
        lines.append(f"#SBATCH --partition={request.partition}")
    lines += [f"#SBATCH --output={folder}/run-solutions-%j.out", "", "set -euo pipefail",
              f"cd {shlex.quote(str(root))}"]
    command = [PYTHON, "-m", "course_lib", "run-solutions", "--root", str(root),
               "--timeout", f"{timeout_s:g}"] + (["--only", ",".join(numbers)] if numbers else [])
    command += ["--write"] if write else []
    lines.append(" ".join(shlex.quote(part) for part in command)
                 + f' --report-json {shlex.quote(str(folder))}/run-solutions-"$SLURM_JOB_ID".json')
    return "\n".join(lines) + "\n"


def slurm_command(*command, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run a SLURM command; its stdout, or SlurmError with what it said."""
    if not shutil.which(command[0]):
        raise SlurmError(f"`{command[0]}` is not on PATH: this machine has no SLURM client. Run "
                         f"--slurm on the cluster's login node, or run without --slurm here")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(command)}` got no answer in {timeout_s:g} s: is slurmctld "
                         f"running and reachable?") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip() or f"exit code {done.returncode}"
        raise SlurmError(f"`{' '.join(command[:2])}` failed: {said}")
    return done.stdout


def submit(script: Path) -> str:
    """sbatch the script; the job's id."""
    try:
        output = slurm_command("sbatch", "--parsable", str(script))
    except SlurmError as error:
        raise SlurmError(f"SLURM refused the job: {error}") from None
    return output.strip().split(";")[0]


def job_info(job_id: str) -> dict:
    """The job's fields from `scontrol show job` (JobState, Reason, NodeList, ExitCode, ...);
    {} once slurmctld has forgotten it (MinJobAge after it ended)."""
    try:
        output = slurm_command("scontrol", "show", "job", "--oneliner", job_id)
    except SlurmError as error:
        if "Invalid job id" in str(error):
            return {}
        raise
    return dict(re.findall(r"(\w+)=(\S*)", output))


def cancel(job_id: str) -> None:
    try:
        slurm_command("scancel", job_id)
    except SlurmError:
        pass  # it ended on its own meanwhile


def follow(job_id: str, log: Path, say=print, poll_s: float = 0.5, run_limit_s: float = None) -> dict:
    """Poll the job until it ends, saying each change of state and the log's latest notebook line;
    returns its last fields. A job pending waits as long as the queue makes it; one running past
    run_limit_s (a backstop: SLURM ends it at its time limit) is cancelled, and SlurmError says so."""
    shown, running_since = None, None
    while True:
        info = job_info(job_id)
        state = info.get("JobState", "GONE")
        if state == "RUNNING":  # where, and the notebook it is at
            detail = f" on {info.get('NodeList')}{latest_progress(log)}"
        elif state == "PENDING":  # why it waits: Priority, Resources, BeginTime (requeued), ...
            detail = f" ({info['Reason']})" if info.get("Reason", "None") != "None" else ""
        else:
            detail = f" (exit code {info['ExitCode']})" if "ExitCode" in info else ""
        line = f"job {job_id}: {state}{detail}"
        if line != shown:
            say(line)
            shown = line
        if state in FINAL_STATES or state == "GONE":
            return info
        if state == "RUNNING" and running_since is None:
            running_since = time.monotonic()
        if run_limit_s is not None and running_since and time.monotonic() - running_since > run_limit_s:
            cancel(job_id)
            raise SlurmError(f"job {job_id} still ran {run_limit_s:g} s after it started, past its "
                             f"time limit; cancelled it")
        time.sleep(poll_s)


def latest_progress(log: Path) -> str:
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if re.match(r"\[\d+/\d+\] ", line)]
    except OSError:
        return ""
    return f": {lines[-1]}" if lines else ""


def seconds_of(limit: str) -> float:
    """SLURM's [days-]HH:MM:SS, MM:SS or minutes, in seconds."""
    days, _, clock = limit.rpartition("-")
    parts = [float(part) for part in clock.split(":")]
    if len(parts) == 1:
        parts = [0, parts[0], 0]  # a bare number is minutes
    while len(parts) < 3:
        parts.insert(0, 0)
    return float(days or 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def submit_run(root: Path, numbers: list, request: JobRequest, timeout_s: float,
               write: bool = False) -> Job:
    """Write the batch script for lessons `numbers` (all: []) and submit it; SlurmError, and no
    script left behind, where SLURM is absent or refuses."""
    slurm_command("sbatch", "--version")  # no SLURM here: say so before writing anything
    folder = root / RUNS_FOLDER
    folder.mkdir(exist_ok=True)
    script = folder / f"run-solutions-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
    script.write_text(batch_script(root, folder, numbers, request, timeout_s, write))
    try:
        job_id = submit(script)
    except SlurmError:
        script.unlink()  # refused: no job will ever read it
        raise
    return Job(job_id, script, folder / f"run-solutions-{job_id}.out",
               folder / f"run-solutions-{job_id}.json")


def why_no_report(job: Job, info: dict) -> str:
    """What to say when the job ended without its report: its state, exit code and reason, where
    it ran, and the end of its log."""
    log = job.log
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
    return (f"job {job.id} ended {info.get('JobState', 'and was forgotten')} "
            f"(exit code {info.get('ExitCode', '?')}, reason {info.get('Reason', '?')}) on "
            f"{info.get('NodeList', '?')} before it wrote its report. The end of its log {log}:\n"
            f"{tail or '(empty)'}")
