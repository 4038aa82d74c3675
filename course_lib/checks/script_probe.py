"""Running a learner's script as a job would, under torchrun or plain python, with a probe that
records in every process of it what the script did; and reading back what each process printed,
where a hung one waited, and what a crashed one said.

The probe is a ``sitecustomize`` module first on PYTHONPATH: Python imports it at start-up in every
process (torchrun's agent too, where it does nothing), and right after the script's ``import torch``
it wraps: each torch.save (its path and the file's inode), os.fsync, os.replace and os.rename (the
inodes they touch), the samples a TensorDataset hands out, whether each DDP forward will
all-reduce in its backward, each optimizer step, the autocast dtype of the Linear layers, and
whether the process group was still alive at exit. A hung run's processes dump their stacks on
SIGUSR1.
"""
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic, sleep

from ..topics.cluster import stop_processes

RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

# Written as sitecustomize.py: Python imports it at start-up in every process (torchrun's agent
# too, where it does nothing: it records only in processes that run the learner's script).
PROBE = r'''
import atexit, faulthandler, json, os, signal, sys

_DIR, _SCRIPT = os.environ.get("COURSE_SCRIPT_PROBE"), os.environ.get("COURSE_SCRIPT")

if _DIR and _SCRIPT and sys.argv and os.path.abspath(sys.argv[0]) == _SCRIPT:
    import importlib.abc
    import importlib.util

    _RANK = os.environ.get("RANK")
    _NAME = f"{'single' if _RANK is None else 'rank' + _RANK}.{os.getpid()}"
    _RECORD = {"rank": None if _RANK is None else int(_RANK), "events": [], "autocast": {},
               "group_alive_at_exit": None, "probe_error": None}
    _STACKS = open(os.path.join(_DIR, f"stack.{_NAME}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)  # the grader asks on a hang
    _SAVES = os.path.join(_DIR, f"saves.{_NAME}.txt")

    def _log_save(path):
        """At once, not at exit: torchrun kills a rank whose peer crashed, before its exit handlers."""
        with open(_SAVES, "a") as file:
            file.write(path + "\n")

    def _inode(target):
        """The inode of a path, a file descriptor or an open file; None if there is none."""
        try:
            if isinstance(target, int):
                return os.fstat(target).st_ino
            if hasattr(target, "fileno"):
                return os.fstat(target.fileno()).st_ino
            return os.stat(target).st_ino
        except (OSError, TypeError, ValueError):
            return None

    def _install(torch):
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils.data import TensorDataset

        events, save, getitem = _RECORD["events"], torch.save, TensorDataset.__getitem__
        fsync, replace, rename = os.fsync, os.replace, os.rename
        forward, linear = DistributedDataParallel.forward, F.linear

        def probed_save(obj, f, *args, **kwargs):
            named = isinstance(f, (str, os.PathLike))
            path = os.fspath(f) if named else getattr(f, "name", "?")
            done = save(obj, f, *args, **kwargs)
            events.append(["save", os.path.realpath(path) if isinstance(path, str) else "?",
                           _inode(path if named else f)])
            _log_save(events[-1][1])
            return done

        def probed_fsync(fd):
            events.append(["fsync", _inode(fd)])
            return fsync(fd)

        def probed_rename(real):
            def rename(src, dst, *args, **kwargs):
                inode = _inode(src)
                done = real(src, dst, *args, **kwargs)
                events.append(["rename", os.path.realpath(os.fspath(dst)), inode])
                return done
            return rename

        def probed_getitem(self, index):
            if isinstance(index, int):
                events.append(["fetch", index])
            return getitem(self, index)

        def probed_forward(self, *args, **kwargs):
            if torch.is_grad_enabled():  # DDP all-reduces in this forward's backward when True
                events.append(["forward", bool(self.require_backward_grad_sync)])
            return forward(self, *args, **kwargs)

        def probed_linear(input, weight, bias=None):
            kind = input.device.type
            dtype = str(torch.get_autocast_dtype(kind)) if torch.is_autocast_enabled(kind) else "off"
            key = f"{kind}:{dtype.replace('torch.', '')}"
            _RECORD["autocast"][key] = _RECORD["autocast"].get(key, 0) + 1
            return linear(input, weight, bias)

        torch.save = torch.serialization.save = probed_save
        os.fsync, os.replace, os.rename = probed_fsync, probed_rename(replace), probed_rename(rename)
        TensorDataset.__getitem__ = probed_getitem
        DistributedDataParallel.forward = probed_forward
        F.linear = probed_linear
        register_optimizer_step_post_hook(lambda optimizer, args, kwargs: events.append(["step"]))

    class _AfterTorch(importlib.abc.MetaPathFinder):
        """Runs _install right after `import torch` finished, before the script uses it."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            exec_module = spec.loader.exec_module

            def exec_then_install(module):
                exec_module(module)
                try:
                    _install(module)
                except Exception as error:  # an API the probe relies on moved: say so, run on
                    _RECORD["probe_error"] = f"{type(error).__name__}: {error}"

            spec.loader.exec_module = exec_then_install
            return spec

    sys.meta_path.insert(0, _AfterTorch())

    @atexit.register  # registered first, so it runs last: after the script's own exit handlers
    def _write_record():
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available():
            _RECORD["group_alive_at_exit"] = dist.is_initialized()
        with open(os.path.join(_DIR, f"record.{_NAME}.json"), "w") as file:
            json.dump(_RECORD, file)
'''


def install_probe(folder: Path) -> Path:
    """Write the probe into folder/probe (made here); the folder to put first on PYTHONPATH."""
    site = Path(folder) / "probe"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROBE)
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

    @property
    def distributed(self) -> bool:
        return self.ranks > 0


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

    def renames(self) -> list:
        return [event[1:] for event in self.events if event[0] == "rename"]


def environment(script: Path, site: Path, records: Path) -> dict:
    """os.environ without torchrun's variables (plain python must not see a RANK), the probe first
    on PYTHONPATH, one thread per process, and no GPU."""
    env = {name: value for name, value in os.environ.items() if name not in RANK_VARIABLES}
    package_root = str(Path(__file__).resolve().parents[2])  # so the script can import course_lib
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
        record = json.loads(record_file.read_text())
        if record.get("probe_error"):
            raise RuntimeError(f"the grader's probe failed in your script's process: "
                               f"{record['probe_error']}; please report it to the course")
        rank = record["rank"]
        stdout, stderr = _output_of(run, rank)
        processes[rank] = Process(rank, record["events"], record["autocast"],
                                  record["group_alive_at_exit"], stdout, stderr)
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



def where_it_waits(run: Run, script: Path) -> list:
    lines = script.read_text(errors="replace").splitlines()
    waits = []
    for stack_file in sorted((run.folder / "probe").glob("stack.*.txt")):
        frames = re.findall(rf'File "{re.escape(str(script))}", line (\d+) in (\S+)',
                            read(stack_file))
        if frames:  # most recent call first
            number = int(frames[0][0])
            code = lines[number - 1].strip() if number <= len(lines) else ""
            who = stack_file.name.split(".")[1].replace("rank", "rank ")
            waits.append(f"{who} waits at line {number} ({code})")
    return waits



def failed_outputs(run: Run) -> list:
    if not run.distributed:
        return [read(run.folder / "stderr.txt")]
    return [read(log) for log in sorted((run.folder / "logs").glob("*/attempt_0/*/stderr.log"))]


def root_error(outputs: list, script: Path) -> tuple:
    """(the error line, ' at line N (code)' in the script) of the most telling traceback: a
    rank's own error before a 'connection closed' that only says a peer left."""
    found = []
    for output in outputs:
        errors = re.findall(r"^(?:\[rank\d+\]: )?((?:[\w.]+(?:Error|Exception|Interrupt)\b|"
                            r"terminate called).*)$", output, flags=re.MULTILINE)
        if errors:
            frames = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', output)
            found.append((errors[-1], int(frames[-1]) if frames else None))
    if not found:
        return "", ""
    found.sort(key=lambda item: "Connection" in item[0])
    error, number = found[0]
    error = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", error)  # the C++ source of a torch error
    error = re.sub(r"\. This is typically caused by a remote worker.*", "", error)  # gloo's advice
    error = error if len(error) < 240 else error[:237] + "..."
    lines = script.read_text(errors="replace").splitlines()
    where = f" ({script.name} line {number}: {lines[number - 1].strip()})" if number and \
        number <= len(lines) else ""
    return error.strip(), where


def agent_summary(run: Run) -> str:
    agent = read(run.folder / "stderr.txt") + read(run.folder / "stdout.txt")
    found = re.findall(r"(exitcode\s*:\s*-?\d+.*|Signal \d+ \(\w+\).*)", agent)
    return "; ".join(line.strip() for line in found[:3]) or "torchrun reported a failed worker"

