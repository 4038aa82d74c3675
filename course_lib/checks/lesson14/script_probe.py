"""Running a learner's script as a job would, under torchrun or plain python, with a probe that
records in every process of it what the script did; and reading back what each process recorded
and printed (crashes.py reads what a failed run said).

The probe (probe_program.py) is copied as a ``sitecustomize`` module first on PYTHONPATH: Python
imports it at start-up in every process (torchrun's agent too, where it does nothing), and right
after the script's ``import torch`` it wraps: each torch.save (its path and the file's inode),
os.fsync, os.replace and os.rename (the inodes they touch), the samples a TensorDataset hands out,
whether each DDP forward will all-reduce in its backward, each optimizer step, the autocast dtype
of the Linear layers, and whether the process group was still alive at exit. A hung run's
processes dump their stacks on SIGUSR1.
"""
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from time import monotonic, sleep

import course_lib

from ...topics.cluster import stop_processes
from ..engine import GradingError

PROBE_PROGRAM = files(__package__) / "probe_program.py"
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


def install_probe(folder: Path) -> Path:
    """Copy the probe (probe_program.py) into folder/probe (made here) as sitecustomize.py; the
    folder to put first on PYTHONPATH."""
    site = Path(folder) / "probe"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROBE_PROGRAM.read_text())
    return site


@dataclass
class Run:
    """One run of the learner's script: its command, its folder, and what came back."""

    what: str                  # how a message names it, e.g. "under torchrun (2 ranks, --epochs 2)"
    args: list
    folder: Path
    ranks: int                 # 0 for plain python
    returncode: int = None
    timed_out: bool = False
    processes: dict = field(default_factory=dict)  # rank (None: plain python) -> Process
    saves: dict = field(default_factory=dict)  # rank -> the paths it torch.saved, killed ranks too
    # read on the learner's side after the run (observed_runs.py), for the verdicts
    outputs: list = field(default_factory=list)  # the stderr of each process (torchrun's logs)
    agent_output: str = ""                       # what torchrun, or plain python, printed
    stacks: dict = field(default_factory=dict)   # stack.<process>.txt -> a hung process's stacks
    checkpoint: dict = field(default_factory=dict)  # path, exists, keys (weights_only), error

    @property
    def distributed(self) -> bool:
        return self.ranks > 0


@dataclass
class Script:
    """train_ddp.py as the learner's side saw it (observed_runs.py): its resolved path, which its
    tracebacks name, and its text."""

    path: str
    text: str

    @property
    def name(self) -> str:
        return Path(self.path).name

    def __str__(self) -> str:
        return self.path


@dataclass
class Process:
    """What the probe recorded in one process of the script, and what it printed."""

    rank: object
    events: list
    autocast: dict
    group_alive_at_exit: object
    stdout: str
    stderr: str

    def fetched(self) -> list:
        return [event[1] for event in self.events if event[0] == "fetch"]


def environment(script: Path, site: Path, records: Path) -> dict:
    """os.environ without torchrun's variables (plain python must not see a RANK), the probe first
    on PYTHONPATH, one thread per process, and no GPU."""
    env = {name: value for name, value in os.environ.items() if name not in RANK_VARIABLES}
    package_root = str(Path(course_lib.__file__).resolve().parent.parent)  # the script imports it
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(site), package_root,
                                                        os.environ.get("PYTHONPATH")])),
               COURSE_SCRIPT_PROBE=str(records), COURSE_SCRIPT=str(script),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    return env


def command(script: Path, run: Run) -> list:
    if not run.distributed:
        return [sys.executable, str(script), *run.args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={run.ranks}", "--log-dir", str(run.folder / "logs"), "--redirects",
            "3", str(script), *run.args]


def run_together(script: Path, runs: list, site: Path, timeout: float) -> None:
    """Start every run at once, wait for all (`timeout` seconds), then collect what each recorded.
    Every process they started is stopped, whatever happens (torchrun's workers included)."""
    started = []
    try:
        for run in runs:
            run.folder.mkdir(parents=True, exist_ok=True)
            (run.folder / "probe").mkdir(exist_ok=True)
            out, err = (open(run.folder / name, "w") for name in ("stdout.txt", "stderr.txt"))
            with out, err:
                started.append(subprocess.Popen(
                    command(script, run), cwd=run.folder, stdout=out, stderr=err,
                    env=environment(script, site, run.folder / "probe"), start_new_session=True))
        deadline = monotonic() + timeout
        for run, process in zip(runs, started):
            try:
                run.returncode = process.wait(timeout=max(deadline - monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                run.timed_out = True
                _ask_for_stacks(run)
    finally:
        stop_processes(started)
    for run in runs:
        run.processes = _collect(run)
        run.saves = _saves(run)


def _ask_for_stacks(run: Run) -> None:
    """SIGUSR1 to every process of the script: the probe's faulthandler writes its stacks."""
    for stack_file in (run.folder / "probe").glob("stack.*.txt"):
        try:
            os.kill(int(stack_file.name.split(".")[2]), signal.SIGUSR1)
        except (ProcessLookupError, PermissionError, ValueError):
            pass
    sleep(1.5)


def _collect(run: Run) -> dict:
    processes = {}
    for record_file in sorted((run.folder / "probe").glob("record.*.json")):
        try:
            record = json.loads(record_file.read_text())
            failed, rank = record.get("probe_error"), record["rank"]
            seen = [record["events"], record["autocast"], record["group_alive_at_exit"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            failed = f"its record {record_file.name} cannot be read"
        if failed:
            raise GradingError(f"train_ddp.py {run.what}", "the grader's record of each process",
                               f"the grader's probe failed in your script's process: {failed}",
                               "please report it to the course, with your train_ddp.py")
        processes[rank] = Process(rank, *seen, *_output_of(run, rank))
    return processes


def _saves(run: Run) -> dict:
    """{rank: [path, ...]} of every process that saved, read from the lines it wrote at each save."""
    saves = {}
    for log in sorted((run.folder / "probe").glob("saves.*.txt")):
        name = log.name.split(".")[1]
        rank = None if name == "single" else int(name[len("rank"):])
        saves.setdefault(rank, []).extend(log.read_text().splitlines())
    return saves


def _output_of(run: Run, rank) -> tuple:
    """(stdout, stderr) of one process: torchrun's per-rank log files, or the plain run's."""
    if rank is None or not run.distributed:
        return read(run.folder / "stdout.txt"), read(run.folder / "stderr.txt")
    logs = sorted((run.folder / "logs").glob(f"*/attempt_0/{rank}"))
    if not logs:
        return "", ""
    return read(logs[-1] / "stdout.log"), read(logs[-1] / "stderr.log")


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
