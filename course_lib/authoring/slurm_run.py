"""run-solutions through SLURM: write a batch script, submit it with sbatch, follow the job (queued,
running, which notebook) and print the node's report, or say why SLURM would not run it.

The node runs the same `python -m course_lib run-solutions` (this Python, this course folder: both
must be on storage the node sees, as a cluster's home usually is) and writes its report as JSON.
"""
import argparse
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

RUNS_FOLDER = ".run-solutions"  # in the course folder: the batch scripts, logs and reports
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
COMMAND_TIMEOUT_S = 120  # sbatch and scontrol retry an unreachable controller, then give up
PYTHON = sys.executable  # the Python the node runs: this one, seen through the shared file system


class SlurmError(RuntimeError):
    """SLURM is absent, refused the job, or the job ended without a result: the message says which."""


def add_arguments(parser) -> None:
    slurm = parser.add_argument_group("through SLURM (instructors on a cluster)")
    slurm.add_argument("--slurm", action="store_true",
                       help="submit one batch job that runs the notebooks on a compute node, "
                            "follow it, and print its report here")
    slurm.add_argument("--partition", default=None, help="the SLURM partition (default: the site's)")
    slurm.add_argument("--gpus-per-node", type=int, default=0, metavar="N",
                       help="GPUs to ask for (default 0: a CPU node)")
    slurm.add_argument("--cpus-per-task", type=int, default=4, metavar="N",
                       help="CPU cores to ask for (default 4)")
    slurm.add_argument("--time", default="01:00:00", metavar="HH:MM:SS",
                       help="the job's time limit (default 01:00:00)")
    # the node's side of --slurm: where it writes its report
    slurm.add_argument("--report-json", type=Path, default=None, help=argparse.SUPPRESS)


def write_report(path: Path, runs, device: str) -> None:
    report = {"node": socket.gethostname(), "device": device,
              "runs": [{"name": run.name, "passed": run.passed, "seconds": run.seconds,
                        "error": run.error} for run in runs]}
    Path(path).write_text(json.dumps(report, indent=1))


def batch_script(root: Path, folder: Path, args, numbers: list) -> str:
    """The job: this Python runs run-solutions on the node, for the notebooks asked for."""
    lines = ["#!/bin/bash", "#SBATCH --job-name=run-solutions", "#SBATCH --nodes=1",
             "#SBATCH --ntasks=1", f"#SBATCH --cpus-per-task={args.cpus_per_task}"]
    if args.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={args.gpus_per_node}")
    lines.append(f"#SBATCH --time={args.time}")
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    lines += [f"#SBATCH --output={folder}/run-solutions-%j.out", "", "set -euo pipefail",
              f"cd {shlex.quote(str(root))}"]
    command = [PYTHON, "-m", "course_lib", "run-solutions", "--root", str(root),
               "--timeout", f"{args.timeout:g}"] + (["--only", ",".join(numbers)] if numbers else [])
    command += ["--write"] if args.write else []
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


def run_solutions_on_slurm(args, root: Path, notebooks: list, print_table) -> int:
    """The --slurm path of run-solutions; returns its exit code."""
    from .run_solutions import NotebookRun

    folder = root / RUNS_FOLDER
    try:
        slurm_command("sbatch", "--version")  # no SLURM here: say so before writing anything
        folder.mkdir(exist_ok=True)
        numbers = [path.name[:2] for path in notebooks]
        script = folder / f"run-solutions-{time.strftime('%Y%m%d-%H%M%S')}.sbatch"
        script.write_text(batch_script(root, folder, args, numbers))
        try:
            job_id = submit(script)
        except SlurmError:
            script.unlink()  # refused: no job will ever read it
            raise
        print(f"submitted job {job_id} ({len(notebooks)} notebooks, partition "
              f"{args.partition or 'default'}, {args.gpus_per_node} GPUs, {args.cpus_per_task} CPUs, "
              f"time limit {args.time}): {script}", flush=True)
        log, report = folder / f"run-solutions-{job_id}.out", folder / f"run-solutions-{job_id}.json"
        try:
            info = follow(job_id, log, say=lambda line: print(line, flush=True),
                          run_limit_s=seconds_of(args.time) + 120)
        except KeyboardInterrupt:
            cancel(job_id)
            print(f"interrupted: cancelled job {job_id}", file=sys.stderr)
            return 130
    except SlurmError as error:
        print(f"run-solutions --slurm: {error}", file=sys.stderr)
        return 2
    if not report.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:]) if log.exists() else ""
        print(f"run-solutions --slurm: job {job_id} ended {info.get('JobState', 'and was forgotten')} "
              f"(exit code {info.get('ExitCode', '?')}, reason {info.get('Reason', '?')}) on "
              f"{info.get('NodeList', '?')} before it wrote its report. The end of its log {log}:\n"
              f"{tail or '(empty)'}", file=sys.stderr)
        return 1
    node = json.loads(report.read_text())
    runs = [NotebookRun(**run) for run in node["runs"]]
    print_table(runs, f"{node['node']}: {node['device']}")
    return 0 if runs and all(run.passed for run in runs) else 1
