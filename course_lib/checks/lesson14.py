"""Grader for lesson 14, the capstone: train.py, a one-device training script, converted to DDP.

check_capstone(path) runs your file as a job would, in a scratch folder, on the CPU (gloo; the
GPUs are hidden, so it grades the same on a laptop and on a GPU node):

1. `torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 2`: 2 ranks train 2 epochs;
2. the same with `--epochs 3`: it resumes from run 1's checkpoint and trains epoch 2 only;
3. beside it, `python train_ddp.py --epochs 3 --amp` on a copy of run 1's checkpoint: one
   process (no RANK), mixed precision, resuming from what the DDP run saved.

A probe (a `sitecustomize` module first on PYTHONPATH) records in every process of your script:
the samples the DataLoader fetched, whether each DDP forward would all-reduce its gradients,
the optimizer steps, each torch.save, the autocast dtype of the Linear layers, and whether the
process group was still alive at exit. The grader compares them, and the losses rank 0 prints,
with the oracle: one process training on the whole global batch (32 samples a step, in the
order DistributedSampler(seed=0) deals after set_epoch(epoch)) has the same losses step by step.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic, sleep

from . import GradingError, expect, grader, wrong_answer
from ..topics.cluster import stop_processes

WORLD_SIZE = 2
SAMPLES, GLOBAL_BATCH_SIZE, MICRO_BATCH_SIZE = 256, 32, 8  # train.py's constants
LR, MOMENTUM, SEED = 0.2, 0.9, 0
FIRST_EPOCHS, EPOCHS = 2, 3               # run 1 trains epochs 0-1; runs 2 and 3 resume for epoch 2
STEPS_PER_EPOCH = SAMPLES // GLOBAL_BATCH_SIZE
RUN_TIMEOUT_S = 240                       # per run; a run takes 10-30 s on a busy 2-core machine
LOSS_ATOL = 1e-4                          # float32 in another order; printed with 6 decimals
AMP_LOSS_ATOL = 0.03                      # bf16 autocast against the float32 oracle
LOSS_LINE = re.compile(r"\bepoch (\d+) step (\d+) loss (\S+)")
STUB = 'raise NotImplementedError("Exercise: write this part'
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")

# Written as sitecustomize.py: Python imports it at start-up in every process (torchrun's agent
# too, where it does nothing: it records only in processes that run the learner's script).
PROBE = r'''
import atexit, faulthandler, json, os, signal, sys

_DIR, _SCRIPT = os.environ.get("COURSE_CAPSTONE_PROBE"), os.environ.get("COURSE_CAPSTONE_SCRIPT")

if _DIR and _SCRIPT and sys.argv and os.path.abspath(sys.argv[0]) == _SCRIPT:
    import importlib.abc
    import importlib.util

    _RANK = os.environ.get("RANK")
    _NAME = f"{'single' if _RANK is None else 'rank' + _RANK}.{os.getpid()}"
    _RECORD = {"rank": None if _RANK is None else int(_RANK), "events": [], "autocast": {},
               "group_alive_at_exit": None, "probe_error": None}
    _STACKS = open(os.path.join(_DIR, f"stack.{_NAME}.txt"), "w")
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)  # the grader asks on a hang

    def _install(torch):
        import torch.nn.functional as F
        from torch.nn.parallel import DistributedDataParallel
        from torch.optim.optimizer import register_optimizer_step_post_hook
        from torch.utils.data import TensorDataset

        events, save, getitem = _RECORD["events"], torch.save, TensorDataset.__getitem__
        forward, linear = DistributedDataParallel.forward, F.linear

        def probed_save(obj, f, *args, **kwargs):
            path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", "?")
            events.append(["save", str(path)])
            return save(obj, f, *args, **kwargs)

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


# -- running the script --------------------------------------------------------------------------

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

    def saves(self) -> list:
        return [event[1] for event in self.events if event[0] == "save"]

    def loss_lines(self) -> list:
        """(epoch, step, loss) for each `epoch E step S loss L` line printed."""
        found = []
        for line in self.stdout.splitlines():
            match = LOSS_LINE.search(line)
            if match:
                try:
                    found.append((int(match[1]), int(match[2]), float(match[3])))
                except ValueError:
                    found.append((int(match[1]), int(match[2]), float("nan")))
        return found


def _environment(script: Path, site: Path, records: Path) -> dict:
    """os.environ without torchrun's variables (plain python must not see a RANK), the probe first
    on PYTHONPATH, one thread per process, and no GPU."""
    env = {name: value for name, value in os.environ.items() if name not in RANK_VARIABLES}
    package_root = str(Path(__file__).resolve().parents[2])  # so the script can import course_lib
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(site), package_root,
                                                        os.environ.get("PYTHONPATH")])),
               COURSE_CAPSTONE_PROBE=str(records), COURSE_CAPSTONE_SCRIPT=str(script),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    return env


def _command(script: Path, run: Run) -> list:
    if not run.distributed:
        return [sys.executable, str(script), *run.args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={run.ranks}", "--log-dir", str(run.folder / "logs"), "--redirects",
            "3", str(script), *run.args]


def _run_together(script: Path, runs: list, site: Path) -> None:
    """Start every run at once, wait for all (RUN_TIMEOUT_S), then collect what each recorded.
    Every process they started is stopped, whatever happens (torchrun's workers included)."""
    started = []
    try:
        for run in runs:
            run.folder.mkdir(parents=True, exist_ok=True)
            (run.folder / "probe").mkdir(exist_ok=True)
            out, err = (open(run.folder / name, "w") for name in ("stdout.txt", "stderr.txt"))
            with out, err:
                started.append(subprocess.Popen(
                    _command(script, run), cwd=run.folder, stdout=out, stderr=err,
                    env=_environment(script, site, run.folder / "probe"), start_new_session=True))
        deadline = monotonic() + RUN_TIMEOUT_S
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
            raise RuntimeError(f"the capstone grader's probe failed in your script's process: "
                               f"{record['probe_error']}; please report it to the course")
        rank = record["rank"]
        stdout, stderr = _output_of(run, rank)
        processes[rank] = Process(rank, record["events"], record["autocast"],
                                  record["group_alive_at_exit"], stdout, stderr)
    return processes


def _output_of(run: Run, rank) -> tuple:
    """(stdout, stderr) of one process: torchrun's per-rank log files, or the plain run's."""
    if rank is None or not run.distributed:
        return _read(run.folder / "stdout.txt"), _read(run.folder / "stderr.txt")
    logs = sorted((run.folder / "logs").glob(f"*/attempt_0/{rank}"))
    if not logs:
        return "", ""
    return _read(logs[-1] / "stdout.log"), _read(logs[-1] / "stderr.log")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


# -- the oracle ----------------------------------------------------------------------------------

def epoch_order(epoch: int) -> list:
    """The order DistributedSampler(seed=SEED) deals after set_epoch(epoch), before sharding; with
    world_size 1 it is also the order of train.py's RandomSampler seeded with SEED + epoch."""
    import torch

    return torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()


def rank_share(epoch: int, rank: int, world_size: int) -> list:
    return epoch_order(epoch)[rank::world_size]


def oracle(world_size: int = WORLD_SIZE, epochs: int = EPOCHS):
    """One process, one optimizer step per global batch of GLOBAL_BATCH_SIZE samples.

    Returns {epoch: [loss of each step]} and {epoch: [[rank r's loss on its share of each step's
    batch] for each rank]}, the latter being what a rank that skips the all-reduce would print.
    """
    import torch
    import torch.nn.functional as F

    from ..training.data import make_dataset
    from ..training.models import make_model

    X, y = make_dataset(SAMPLES).tensors
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses, shares = {}, {}
    for epoch in range(epochs):
        order = torch.tensor(epoch_order(epoch))
        losses[epoch], shares[epoch] = [], [[] for _ in range(world_size)]
        for batch in order.split(GLOBAL_BATCH_SIZE):
            with torch.no_grad():  # rank r's share of a step: every world_size-th sample from r
                for rank in range(world_size):
                    part = batch[rank::world_size]
                    shares[epoch][rank].append(F.cross_entropy(model(X[part]), y[part]).item())
            optimizer.zero_grad()
            loss = F.cross_entropy(model(X[batch]), y[batch])
            loss.backward()
            optimizer.step()
            losses[epoch].append(loss.item())
    return losses, shares


# -- what a run must show ------------------------------------------------------------------------

def _reject(run: Run, expected: str, got: str, hint: str):
    expect(False, f"train_ddp.py {run.what}", expected, got, hint)


def _expect_finished(run: Run, script: Path) -> None:
    if run.timed_out:
        waits = "; ".join(_where_it_waits(run, script)) or "no stack could be read"
        _reject(run, f"the run to finish within {RUN_TIMEOUT_S} s",
                f"it was still running, and was stopped: {waits}",
                "a rank waits in a collective (an all-reduce, DDP's gradient all-reduce, a barrier) "
                "that another rank never calls: every rank must run the same steps and the same "
                "collectives, e.g. no all_reduce inside `if rank == 0:`")
    if run.returncode != 0:
        if run.distributed and _trained_without_ddp(run):
            _expect_ddp(run)  # ranks training on their own share files; that is why it crashed
        _reject_crash(run, script)
    expected = list(range(run.ranks)) if run.distributed else [None]
    for rank in (rank for rank in expected if rank not in run.processes):
        who = "the process" if rank is None else f"rank {rank}"
        _reject(run, "every process to end normally, through Python's exit",
                f"{who} ended without running Python's exit handlers",
                "end the script by returning from main() (or sys.exit()): os._exit() and "
                "signals skip the shutdown, and the grader's record of the run with it")


def _where_it_waits(run: Run, script: Path) -> list:
    lines = script.read_text(errors="replace").splitlines()
    waits = []
    for stack_file in sorted((run.folder / "probe").glob("stack.*.txt")):
        frames = re.findall(rf'File "{re.escape(str(script))}", line (\d+) in (\S+)',
                            _read(stack_file))
        if frames:  # most recent call first
            number = int(frames[0][0])
            code = lines[number - 1].strip() if number <= len(lines) else ""
            who = stack_file.name.split(".")[1].replace("rank", "rank ")
            waits.append(f"{who} waits at line {number} ({code})")
    return waits


STUB_HINT = ("replace the `raise NotImplementedError(...)` line at the top of train_ddp.py with "
             "your conversion of the script below it: edit the file beside the notebook, save it, "
             "then run this check again")

CRASH_HINTS = [  # (pattern in the error, what to change)
    ("Default process group has not been initialized",
     "under torchrun, call dist.init_process_group(...) before DDP, DistributedSampler or any "
     "collective; with plain python (RANK not set) use none of them and train as train.py did"),
    ("environment variable RANK expected", "with plain python RANK is not set: then train as "
     "train.py did, in one process without init_process_group (test `\"RANK\" in os.environ`)"),
    ("KeyError: '(LOCAL_)?RANK'|KeyError: '(LOCAL_)?WORLD_SIZE'",
     "with plain python torchrun's variables are not set: then train as train.py did, in one "
     "process (test `\"RANK\" in os.environ` before reading them)"),
    ("NCCL|CUDA|cuda", "the grader hides the GPUs, as a laptop has none: choose NCCL and cuda:"
     "LOCAL_RANK only when there is a GPU for every rank, else gloo and the CPU"),
    ("Unexpected key.*module\\.|Missing key", "save the model without its DDP wrapper "
     "(model.module.state_dict()) and load it into the model before wrapping it: the "
     "wrapper's keys start with 'module.'"),
    ("source state dict is empty", "the GradScaler: enable it only for fp16 "
     "(enabled=amp_dtype == torch.float16); bf16 needs no scaler"),
    ("Connection closed by peer|Connection reset by peer|Broken pipe",
     "a rank left while another still waited in a collective: every rank must run the same "
     "steps and the same collectives (e.g. every rank loads the checkpoint and resumes at the "
     "same epoch)"),
    ("terminate called without an active exception|SIGABRT|Signals.SIGABRT",
     "the process died while Python shut down, after your script ended: free the DDP wrapper "
     "(gc.collect()) and call dist.destroy_process_group() before the script ends, and import "
     "torch.distributed.nn before init_process_group (lesson 04, section 6)"),
]


def _reject_crash(run: Run, script: Path) -> None:
    failed = _failed_outputs(run)
    error, where = _root_error(failed, script)
    if not error and run.distributed:
        error = _agent_summary(run)
    if "NotImplementedError" in error:
        raise GradingError("train_ddp.py", "your conversion of train.py",
                           "a script that raises the exercise's NotImplementedError", STUB_HINT)
    if run.distributed and len(run.processes) == run.ranks:
        _expect_group_destroyed(run)  # a group left alive can abort the exit: say that first
    text = error + where  # not the whole output: a warning may name CUDA, say
    hint = next((hint for pattern, hint in CRASH_HINTS if re.search(pattern, text)),
                "the error is raised in your script (its traceback is in the message above): fix "
                "it in train_ddp.py, save it, then run this check again; to see it yourself, run "
                "`torchrun --standalone --nproc_per_node=2 train_ddp.py` in a terminal")
    if run.distributed and "Connection" in text and len(run.processes) == run.ranks:
        starts = _start_epochs(run)
        if len(set(starts.values())) > 1:
            error = ", ".join(f"rank {rank} started at epoch {epoch}" for rank, epoch in
                              sorted(starts.items())) + f"; then {error}"
            hint = ("every rank must load the checkpoint and start at its epoch + 1: a rank that "
                    "starts over runs more steps than the others, which leave it waiting")
    _reject(run, "the run to exit with code 0",
            f"exit code {run.returncode}: {error}{where}"[:700], hint)


def _failed_outputs(run: Run) -> list:
    if not run.distributed:
        return [_read(run.folder / "stderr.txt")]
    return [_read(log) for log in sorted((run.folder / "logs").glob("*/attempt_0/*/stderr.log"))]


def _root_error(outputs: list, script: Path) -> tuple:
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
    where = f" (train_ddp.py line {number}: {lines[number - 1].strip()})" if number and \
        number <= len(lines) else ""
    return error.strip(), where


def _agent_summary(run: Run) -> str:
    agent = _read(run.folder / "stderr.txt") + _read(run.folder / "stdout.txt")
    found = re.findall(r"(exitcode\s*:\s*-?\d+.*|Signal \d+ \(\w+\).*)", agent)
    return "; ".join(line.strip() for line in found[:3]) or "torchrun reported a failed worker"


def _start_epochs(run: Run) -> dict:
    """The epoch each rank started at, read from the first samples it fetched."""
    starts = {}
    for rank, process in run.processes.items():
        first = process.fetched()[:SAMPLES // run.ranks]
        starts[rank] = next((epoch for epoch in range(EPOCHS)
                             if first == rank_share(epoch, rank, run.ranks)), "?")
    return starts


def _trained_without_ddp(run: Run) -> bool:
    """Every rank recorded, a rank took an optimizer step, and no forward went through DDP: each
    rank trained as train.py does. Such ranks race for checkpoint.pt (one can load it while
    another writes it), so the crash that may follow is a symptom, DDP missing the cause."""
    events = [event for process in run.processes.values() for event in process.events]
    return (len(run.processes) == run.ranks and any(event[0] == "step" for event in events)
            and not any(event[0] == "forward" for event in events))


def _expect_ddp(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        if not any(event[0] == "forward" for event in process.events):
            _reject(run, "every rank's forward to go through DistributedDataParallel",
                    f"rank {rank}'s model is not wrapped in DDP (no forward went through it)",
                    "wrap the model on its device, model = DDP(model, device_ids=...), and call "
                    "model(X): DDP's backward all-reduces the gradients, without it each rank "
                    "steps on its own gradients and the ranks' models drift apart")


def _expect_samples(run: Run, epochs: list) -> None:
    world_size = max(run.ranks, 1)
    fetched = {rank: process.fetched() for rank, process in run.processes.items()}
    if not all(fetched.values()):
        return  # samples not read through the Dataset's __getitem__: the losses will tell
    per_epoch = SAMPLES // world_size
    if run.distributed and fetched[0] == fetched[1]:
        _reject(run, "each rank its own half of every epoch",
                f"the sampler gives both ranks the same indices: rank 0 and rank 1 loaded the "
                f"same {len(fetched[0])} samples, in the same order",
                "give the DataLoader sampler=DistributedSampler(dataset): it deals each rank "
                "1/world_size of the dataset (a RandomSampler or shuffle=True gives every rank "
                "all of it)")
    for rank, got in sorted(fetched.items(), key=lambda item: str(item[0])):
        share = 0 if rank is None else rank
        who = "the process" if rank is None else f"rank {rank}"
        if len(got) != per_epoch * len(epochs):
            _reject(run, f"{who} to load {per_epoch} samples in each of epochs {epochs}",
                    f"{who} loaded {len(got)} samples in {len(epochs)} epoch(s)",
                    "each rank loads 1/world_size of the dataset per epoch, through a "
                    "DistributedSampler; with plain python, all of it")
        for index, epoch in enumerate(epochs):
            this_epoch = got[index * per_epoch:(index + 1) * per_epoch]
            if this_epoch != rank_share(epoch, share, world_size):
                _reject_order(run, who, epoch, this_epoch, share, world_size)


def _reject_order(run, who, epoch, got, share, world_size):
    repeated = [other for other in range(EPOCHS) if other != epoch
                and got == rank_share(other, share, world_size)]
    if repeated:
        _reject(run, f"{who} to get epoch {epoch}'s own samples, in epoch {epoch}'s order",
                f"the sampler gives {who} in epoch {epoch} the same indices, in the same order, "
                f"as in epoch {repeated[0]}",
                "call sampler.set_epoch(epoch) at the start of every epoch (the epoch you resume "
                "at too): DistributedSampler shuffles with seed + epoch, and its epoch stays 0 "
                "until you set it")
    _reject(run, f"{who}'s samples in epoch {epoch} as DistributedSampler(dataset, seed={SEED}) "
                 f"deals them after set_epoch({epoch})",
            f"other samples or another order (first ones: {got[:6]}, expected "
            f"{rank_share(epoch, share, world_size)[:6]})",
            "keep train.py's dataset and SEED; use DistributedSampler(dataset, seed=SEED) under "
            "torchrun (its defaults otherwise) and set_epoch(epoch) every epoch; with plain "
            "python keep train.py's RandomSampler seeded with SEED + epoch")


def _expect_steps(run: Run, epochs: list) -> None:
    expected = STEPS_PER_EPOCH * len(epochs)
    world_size = max(run.ranks, 1)
    for rank, process in sorted(run.processes.items(), key=lambda item: str(item[0])):
        steps = sum(event[0] == "step" for event in process.events)
        who = "the process" if rank is None else f"rank {rank}"
        if steps != expected:
            _reject(run, f"{expected} optimizer steps in epochs {epochs}: one per global batch of "
                         f"{GLOBAL_BATCH_SIZE} samples",
                    f"{who} took {steps} optimizer steps",
                    f"a step is {GLOBAL_BATCH_SIZE} samples over all ranks, so each of "
                    f"{world_size} rank(s) accumulates {GLOBAL_BATCH_SIZE} // ({MICRO_BATCH_SIZE} x "
                    f"{world_size}) = {GLOBAL_BATCH_SIZE // (MICRO_BATCH_SIZE * world_size)} "
                    f"micro-batches per step: grad_accum_steps must count world_size")


def _expect_one_all_reduce_per_step(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        syncs = []
        for event in process.events:
            if event[0] == "forward":
                syncs.append(event[1])
            elif event[0] == "step":
                if syncs.count(True) > 1:
                    _reject(run, "one gradient all-reduce per optimizer step, with its last "
                                 "micro-batch", f"DDP all-reduced rank {rank}'s gradients "
                                 f"{syncs.count(True)} times in one step, once per micro-batch",
                            "run the forward and backward of every micro-batch but a step's "
                            "last inside `with model.no_sync():` (the forward too: DDP decides "
                            "in the forward whether the backward all-reduces)")
                if syncs[-1:] != [True]:
                    when = (f"with micro-batch {syncs.index(True) + 1} of {len(syncs)}"
                            if True in syncs else "never (every forward ran inside no_sync)")
                    _reject(run, "the gradient all-reduce with a step's last micro-batch",
                            f"DDP all-reduced rank {rank}'s gradients {when}",
                            "only the micro-batches before the last go inside no_sync(): the "
                            "last one's backward all-reduces the gradients summed so far, and "
                            "gradients added after it stay on their rank")
                syncs = []


def _expect_log(run: Run, epochs: list, losses: dict, shares: dict, atol: float) -> None:
    main = run.processes[0 if run.distributed else None]
    lines = main.loss_lines()
    who = "rank 0" if run.distributed else "the process"
    if not lines:
        _reject(run, f"{who} to print train.py's `epoch E step S loss L` lines",
                f"{who} printed none", "keep train.py's print of each step's loss (on rank 0)")
    printed_epochs = sorted({epoch for epoch, _, _ in lines})
    if printed_epochs != epochs:
        resumed = epochs[0] > 0 and printed_epochs and printed_epochs[0] < epochs[0]
        _reject(run, f"{who} to print the losses of epochs {epochs}",
                f"it printed the losses of epochs {printed_epochs}"
                + (": it started again instead of resuming from the checkpoint" if resumed else ""),
                "on start, load the checkpoint if it exists (every rank) and continue at its "
                "epoch + 1" if resumed else "print one line per optimizer step, as train.py does")
    per_epoch = {epoch: sum(line[0] == epoch for line in lines) for epoch in epochs}
    if set(per_epoch.values()) != {STEPS_PER_EPOCH}:
        _reject(run, f"{STEPS_PER_EPOCH} loss lines per epoch, one per optimizer step",
                f"{who} printed " + ", ".join(f"{count} in epoch {epoch}"
                                               for epoch, count in per_epoch.items()),
                "print once per optimizer step, on rank 0")
    if run.distributed:
        for rank, process in sorted(run.processes.items()):
            if rank != 0 and process.loss_lines():
                _reject(run, "the losses printed by rank 0 only",
                        f"rank {rank} also printed the losses ({len(process.loss_lines())} lines)",
                        "print only on rank 0 (`if rank == 0:`): each rank printing repeats every "
                        "line world_size times, and on a cluster floods the log")
    for epoch, step, loss in _numbered(lines):
        expected = losses[epoch][step]
        if abs(loss - expected) <= atol:
            continue
        if run.distributed and all(abs(printed - shares[e][0][s]) <= atol
                                   for e, s, printed in _numbered(lines)):
            _reject(run, "the loss of the whole global batch (the mean over the ranks)",
                    "rank 0 printed the loss of its own share of each global batch, not the "
                    "global batch's",
                    "average each step's loss over the ranks before rank 0 prints it: "
                    "dist.all_reduce(step_loss, op=dist.ReduceOp.AVG), or a SUM divided by "
                    "world_size")
        first = (epoch, step) == (epochs[0], 0)
        _reject(run, f"the oracle's losses: one process on the whole global batch "
                     f"(epoch {epoch} step {step}: {expected:.6f})",
                f"epoch {epoch} step {step}: loss {loss:.6f}"
                + ("" if first else f", after {_steps_before(epochs, epoch, step)} step(s) that "
                   f"matched"),
                "each step must be one optimizer step on the mean gradient of the global batch: "
                "every micro-batch's loss divided by grad_accum_steps, DDP averaging over the "
                "ranks, and the checkpoint's model and optimizer (momentum) loaded on resume"
                if not first else "the first step's loss already differs: the same model "
                "(make_model(seed=0)), the same data, and the mean loss over the global batch")


def _numbered(lines):
    """(epoch, step within the epoch, loss) for printed lines, counting the steps ourselves."""
    counts = {}
    for epoch, _, loss in lines:
        counts[epoch] = counts.get(epoch, 0) + 1
        yield epoch, counts[epoch] - 1, loss


def _steps_before(epochs, epoch, step):
    return (epoch - epochs[0]) * STEPS_PER_EPOCH + step


def _expect_one_writer(run: Run, epochs: list) -> None:
    saves = {rank: process.saves() for rank, process in run.processes.items()}
    writer = 0 if run.distributed else None
    for rank, paths in sorted(saves.items(), key=lambda item: str(item[0])):
        if rank != writer and paths:
            _reject(run, "exactly one checkpoint writer: rank 0",
                    f"rank {rank} also wrote the checkpoint (torch.save {len(paths)} times, to "
                    f"{paths[-1]})",
                    "save only on rank 0 (`if rank == 0:`): every rank holds the same weights, "
                    "and ranks writing one file at once can leave it corrupt")
    count = len(saves.get(writer, []))
    who = "rank 0" if run.distributed else "the process"
    if count < len(epochs):
        _reject(run, f"{who} to save the checkpoint at the end of each of epochs {epochs}",
                f"{who} called torch.save {count} times",
                "keep train.py's torch.save at the end of every epoch, inside `if rank == 0:`")
    if not (run.folder / "checkpoint.pt").exists():
        _reject(run, "the checkpoint at --checkpoint's path (checkpoint.pt)",
                "no file there", "save to args.checkpoint, as train.py does")


def _expect_plain_checkpoint(run: Run) -> None:
    import torch

    try:
        state = torch.load(run.folder / "checkpoint.pt", map_location="cpu", weights_only=False)
    except Exception as error:  # a torn or foreign file
        _reject(run, "a checkpoint torch.load can read", f"{type(error).__name__}: {error}"[:300],
                "save a dict of state_dicts with torch.save, on rank 0 only")
    wrapped = sorted(key for key in _keys(state) if key.startswith("module."))
    if wrapped:
        _reject(run, "a checkpoint of the model without its DDP wrapper",
                f"the checkpoint's model keys start with 'module.' ({wrapped[0]}, ...): it holds "
                f"DDP's state_dict",
                "save model.module.state_dict(): the plain model's keys, which train.py and a "
                "run with plain python can load")


def _keys(value):
    if isinstance(value, dict):
        for key, inner in value.items():
            if isinstance(key, str):
                yield key
            yield from _keys(inner)


def _expect_autocast(run: Run, amp: bool) -> None:
    for rank, process in run.processes.items():
        kinds = set(process.autocast)
        if not amp and kinds - {"cpu:off"}:
            _reject(run, "float32 without --amp", f"the Linear layers ran under autocast "
                    f"({', '.join(sorted(kinds))})", "autocast only with --amp: "
                    "torch.autocast(device.type, dtype=..., enabled=args.amp)")
        if amp and kinds != {"cpu:bfloat16"}:
            got = ("no autocast on the CPU: the Linear layers ran in float32" if kinds == {"cpu:off"}
                   else f"the Linear layers ran as {', '.join(sorted(kinds))}")
            _reject(run, "with --amp on the CPU, bf16 autocast", got,
                    "autocast on the device you train on, in the format it runs natively: "
                    "torch.autocast(device.type, dtype=torch.bfloat16) on the CPU and on GPUs from "
                    "Ampere on, fp16 with a GradScaler on older GPUs (lesson 06, section 9); "
                    "train.py's autocast('cuda', ...) does nothing on a CPU")


def _expect_group_destroyed(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        if process.group_alive_at_exit:
            _reject(run, "every rank to destroy its process group before it exits",
                    f"rank {rank} exited with its process group still alive",
                    "end with dist.destroy_process_group() (in a `finally:`), after gc.collect() "
                    "freed the DDP wrapper: a group left to Python's shutdown can abort the "
                    "process after training (lesson 04, section 6)")


def _judge(run: Run, script: Path, epochs: list, losses: dict, shares: dict, amp: bool) -> None:
    _expect_finished(run, script)
    if run.distributed:
        _expect_ddp(run)
    _expect_samples(run, epochs)
    _expect_steps(run, epochs)
    if run.distributed:
        _expect_one_all_reduce_per_step(run)
    _expect_log(run, epochs, losses, shares, AMP_LOSS_ATOL if amp else LOSS_ATOL)
    _expect_one_writer(run, epochs)
    _expect_autocast(run, amp)
    if run.distributed:
        _expect_group_destroyed(run)


@grader("train.py converted to DDP")
def check_capstone(path):
    script = Path(os.fspath(path)).resolve()
    expect(script.is_file(), "train_ddp.py", f"a file at {path}", "no such file",
           "run the cell that writes train_ddp.py beside the notebook (it keeps the file you "
           "edited), then this check")
    expect(STUB not in script.read_text(errors="replace"), "train_ddp.py",
           "your conversion of train.py", "the exercise's starting file, which raises "
           "NotImplementedError at its top", STUB_HINT)
    losses, shares = oracle()
    with tempfile.TemporaryDirectory(prefix="capstone_") as scratch:
        scratch = Path(scratch)
        (scratch / "probe").mkdir()
        (scratch / "probe" / "sitecustomize.py").write_text(PROBE)
        site = scratch / "probe"
        first = Run(f"under torchrun ({WORLD_SIZE} ranks, --epochs {FIRST_EPOCHS})",
                    ["--epochs", str(FIRST_EPOCHS)], scratch / "first", WORLD_SIZE)
        _run_together(script, [first], site)
        _judge(first, script, list(range(FIRST_EPOCHS)), losses, shares, amp=False)
        _expect_plain_checkpoint(first)
        resumed = Run(f"under torchrun, resumed ({WORLD_SIZE} ranks, --epochs {EPOCHS})",
                      ["--epochs", str(EPOCHS)], scratch / "resumed", WORLD_SIZE)
        plain = Run(f"with plain python (no torchrun; --epochs {EPOCHS} --amp, resuming from the "
                    f"DDP run's checkpoint)", ["--epochs", str(EPOCHS), "--amp"],
                    scratch / "plain", 0)
        for run in (resumed, plain):
            run.folder.mkdir()
            shutil.copy(first.folder / "checkpoint.pt", run.folder / "checkpoint.pt")
        _run_together(script, [resumed, plain], site)
        _judge(resumed, script, list(range(FIRST_EPOCHS, EPOCHS)), losses, shares, amp=False)
        _judge(plain, script, list(range(FIRST_EPOCHS, EPOCHS)), losses, shares, amp=True)


# -- wrong answers: the reference conversion with one mistake each -------------------------------

def edited_reference_text(edits) -> str:
    """course_lib/examples/capstone_ddp.py (the reference conversion) with each (old, new) of
    `edits` applied once; each `old` must be in it."""
    text = (EXAMPLES / "capstone_ddp.py").read_text()
    for old, new in edits:
        if old not in text:
            raise ValueError(f"the reference conversion has no {old!r} to edit")
        text = text.replace(old, new, 1)
    return text


def write_edited_reference(path, edits) -> Path:
    Path(path).write_text(edited_reference_text(edits))
    return Path(path)


class ScriptFile(os.PathLike):
    """A path to a script whose text `make_text()` returns, written to a temporary file when a
    grader opens it (so that declaring an answer writes nothing)."""

    def __init__(self, make_text, name: str = "train_ddp.py"):
        self.make_text, self.name, self.folder = make_text, name, None

    def __fspath__(self) -> str:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="capstone_answer_")
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        path = Path(self.folder) / self.name
        path.write_text(self.make_text())
        return str(path)

    def __repr__(self) -> str:
        return f"ScriptFile({self.name})"


def edited_reference(*edits) -> ScriptFile:
    """The reference conversion with `edits` applied, as a path a grader can open."""
    return ScriptFile(lambda: edited_reference_text(edits))


NO_PROCESS_GROUP = ('    dist.init_process_group("gloo")\n', "")
NCCL_ON_THE_CPU = ('    dist.init_process_group("gloo")', '    dist.init_process_group("nccl")')
EVERY_RANK_SAVES = ("        if rank == 0:\n            unwrapped",
                    "        if True:\n            unwrapped")

SLOW = True  # it runs the learner's script under torchrun: tests of it belong to the slow tier
WRONG_ANSWERS = {
    check_capstone: [
        wrong_answer("DDP without init_process_group on the CPU", edited_reference(NO_PROCESS_GROUP)),
        wrong_answer("NCCL although the ranks have no GPU", edited_reference(NCCL_ON_THE_CPU)),
        wrong_answer("every rank saves the checkpoint", edited_reference(EVERY_RANK_SAVES)),
    ],
}
