"""Stress: run every way the course starts processes N times, and count the runs that fail.

Each run is a fresh interpreter (as a learner's shell or kernel would be), in a session of its
own, under a timeout; a run fails on a non-zero exit, a timeout, or output that lacks what a good
run prints. Runs go one after another (the numbers are for a loaded 2-core machine too). Not part
of the test run: a race that fails one run in twenty needs many runs to show.

    python benchmarks/stress.py [--runs 30] [--only torchrun_script,two_nodes] [--timeout 300]
    python benchmarks/stress.py --only torchrun_script --load 2   # with 2 cores kept busy
    python benchmarks/stress.py --list
    python benchmarks/stress.py --only kernel_demo_basic --repo /tmp/old-checkout  # before/after

The kernel_* scenarios print each launch's seconds; the table shows the slowest launch of all runs
(a rank that is slow to exit shows there even when every run passes).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SMALL_TRAIN = ["--samples", "256", "--epochs", "1", "--batch-size", "8", "--no-progress"]


@dataclass
class Scenario:
    command: list      # argv; "{script}" is replaced by the path of `script` written to a scratch folder
    expect: str        # a line every good run prints
    script: str = ""   # Python source for the scenarios that are a small program
    in_repo: bool = False  # run in the repository (the nbval scenarios), not in a scratch folder


LAUNCH_ALL_REDUCE = """
import torch
import torch.distributed as dist
from course_lib import launch

def work():
    total = torch.ones(3) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    return total

results = launch(work, nprocs=2, timeout=120)
assert [r.tolist() for r in results] == [[3.0] * 3] * 2, results
print("launch ok")
"""

SESSION_CELL = """
from course_lib import DistributedSession

# lesson 04's cells: a model per rank, DDP's broadcast, one backward through DDP
with DistributedSession(nprocs=2, timeout=120) as session:
    session.run("from torch.nn.parallel import DistributedDataParallel as DDP\\n"
                "from course_lib import make_model\\n"
                "model = make_model(seed=rank)\\n"
                "ddp_model = DDP(model)\\n"
                "ddp_model(torch.ones(4, 16)).sum().backward()")
    weights = session.run("model[0].weight.sum().item()")
assert weights[0] == weights[1], weights
print("session ok")
"""

GRADER = """
import torch.distributed as dist
import torch.nn.functional as F
from course_lib.checks.lesson04 import check_train_step_by_hand

def train_step_by_hand(model, optimizer, X, y):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    for param in model.parameters():
        dist.all_reduce(param.grad)
        param.grad /= dist.get_world_size()
    optimizer.step()
    return loss.item()

check_train_step_by_hand(train_step_by_hand)
"""

DCP_SAVE_LOAD = """
import tempfile
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from course_lib import launch
from course_lib import make_model

# lesson 07's sharded checkpoint: saved by 2 ranks, loaded by 3
def sharded(state_dict):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    return {name: distribute_tensor(tensor, mesh, [Shard(0)]) for name, tensor in state_dict.items()}

def save(directory):
    dcp.save({"model": sharded(make_model().state_dict())}, checkpoint_id=directory)

def load(directory):
    state = sharded(make_model(seed=5).state_dict())
    dcp.load({"model": state}, checkpoint_id=directory)
    return all(torch.equal(state[name].full_tensor(), saved)
               for name, saved in make_model().state_dict().items())

with tempfile.TemporaryDirectory() as directory, warnings.catch_warnings():
    warnings.simplefilter("ignore")
    launch(save, directory, nprocs=2, timeout=180, output="none")
    assert all(launch(load, directory, nprocs=3, timeout=180, output="none"))
print("dcp ok")
"""

# Lesson 12's scripts, as its cells write them.
WHOAMI = """\
import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
total = torch.tensor([rank])
dist.all_reduce(total)
print(f"[node {os.environ['GROUP_RANK']}] RANK={rank} sum of all ranks={total.item()}\\n", end="", flush=True)
dist.destroy_process_group()
"""

TWO_NODES = """
import tempfile
from pathlib import Path
from course_lib.topics.cluster import free_port, run_nodes, torchrun_command

with tempfile.TemporaryDirectory() as workdir:
    Path(workdir, "whoami.py").write_text(WHOAMI)
    port = free_port()
    commands = [torchrun_command(["whoami.py"], nnodes=2, nproc_per_node=2, node_rank=node_rank,
                                 endpoint=f"127.0.0.1:{port}") for node_rank in (0, 1)]
    runs = run_nodes(commands, timeout=150, cwd=workdir)
for run in runs:
    assert run.returncode == 0, run.output[-3000:]
lines = sorted(line for run in runs for line in run.lines("[node"))
assert len(lines) == 4 and all(line.endswith("sum of all ranks=6") for line in lines), lines
print("two nodes ok")
"""

ELASTIC_TRAIN = """\
import gc
import json
import os
from pathlib import Path

import torch.distributed as dist
import torch.nn.functional as F

from course_lib import make_dataset
from course_lib import make_model
from course_lib import TrainConfig, Trainer

dist.init_process_group("gloo")
rank = dist.get_rank()
crashed_before = Path("crashed_once")
steps_started = 0


def crash_once(output, target):
    global steps_started
    steps_started += 1
    if rank == 1 and steps_started == 7 and not crashed_before.exists():
        crashed_before.touch()
        os._exit(1)
    return F.cross_entropy(output, target)


config = TrainConfig(strategy="ddp", batch_size=16, max_steps=10, checkpoint_dir="checkpoints",
                     checkpoint_every=4, resume=True, progress=False, seed=0)
trainer = Trainer(make_model(seed=0), make_dataset(512), config, loss_fn=crash_once)
history = trainer.fit()
if rank == 0:
    Path("losses.json").write_text(json.dumps(history.losses))
del trainer
gc.collect()
dist.destroy_process_group()
"""

ELASTIC_RESTART = """
import json
import tempfile
from pathlib import Path
from course_lib.topics.cluster import free_port, run_nodes, torchrun_command

with tempfile.TemporaryDirectory() as workdir:
    Path(workdir, "elastic_train.py").write_text(ELASTIC_TRAIN)
    command = torchrun_command(["elastic_train.py"], nnodes=2, nproc_per_node=1, rdzv="c10d",
                               endpoint=f"127.0.0.1:{free_port()}", run_id="stress", max_restarts=1)
    runs = run_nodes([command, command], timeout=240, cwd=workdir,
                     env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
    for run in runs:
        assert run.returncode == 0, run.output[-3000:]
    assert Path(workdir, "crashed_once").exists()
    assert len(json.loads(Path(workdir, "losses.json").read_text())) == 10
print("elastic ok")
"""

# -- tutorial code that ends as PyTorch's DDP tutorials end: destroy_process_group() while the DDP
# model is alive, then return (issue 21). Each run is a fresh Jupyter kernel (nbclient) that defines
# the code in one cell and launches it LAUNCHES times in the next: the first launch imports
# torch._dynamo into the kernel (preload_for_fork), later ones fork a kernel that has it.

TOY_MODEL = """
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from course_lib.topics.cluster import free_port

PORT = str(free_port())  # the tutorials use a fixed port; other runs on this machine may hold it


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = PORT
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(12, 12)
        self.act = nn.ReLU()
        self.out = nn.Linear(12, 4)

    def forward(self, x):
        return self.out(self.act(self.hidden(x)))
"""

DEMO_BASIC = TOY_MODEL + """

def demo_basic(rank, world_size):
    print(f"basic DDP demo on rank {rank}")
    setup(rank, world_size)
    model = TwoLayers()
    ddp_model = DDP(model)
    criterion = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    optimizer.zero_grad()
    prediction = ddp_model(torch.randn(16, 12))
    criterion(prediction, torch.randn(16, 4)).backward()
    optimizer.step()
    cleanup()
    return ddp_model.module.out.weight.sum().item()
"""

DEMO_CHECKPOINT = TOY_MODEL + """
CHECKPOINT = os.path.join(tempfile.mkdtemp(), "model.checkpoint")


def demo_checkpoint(rank, world_size):
    print(f"checkpointing DDP demo on rank {rank}")
    setup(rank, world_size)
    model = TwoLayers()
    ddp_model = DDP(model)
    if rank == 0:  # one rank saves: every replica holds the same weights
        torch.save(ddp_model.state_dict(), CHECKPOINT)
    dist.barrier()  # the others wait for the file before they read it
    ddp_model.load_state_dict(torch.load(CHECKPOINT, map_location="cpu", weights_only=True))
    criterion = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    optimizer.zero_grad()
    criterion(ddp_model(torch.randn(16, 12)), torch.randn(16, 4)).backward()
    optimizer.step()
    dist.barrier()  # nobody is still reading when rank 0 removes it
    if rank == 0:
        os.remove(CHECKPOINT)
    cleanup()
    return ddp_model.module.out.weight.sum().item()
"""

# The tutorial series' multi-process script: ddp_setup(rank, world_size), a Trainer class, a
# DistributedSampler, checkpoints by rank 0, destroy_process_group() at the end of main().
SERIES_COMMON = """
import os
import tempfile

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class RandomRegression(Dataset):
    def __init__(self, size):
        self.size = size
        self.data = [(torch.rand(20), torch.rand(1)) for _ in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer, rank, save_every, snapshot):
        self.rank = rank
        self.model = DDP(model)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.snapshot = snapshot

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        return [self._run_batch(source, targets) for source, targets in self.train_data]

    def _save_checkpoint(self, epoch):
        torch.save(self.model.module.state_dict(), self.snapshot)
        print(f"epoch {epoch}: checkpoint saved")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            losses = self._run_epoch(epoch)
            if self.rank == 0 and epoch % self.save_every == 0:
                self._save_checkpoint(epoch)
        return losses[-1]


def load_train_objs():
    dataset = RandomRegression(256)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return dataset, model, optimizer


def prepare_dataloader(dataset, batch_size):
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(dataset))
"""

TRAINER_SPAWN = SERIES_COMMON + """
from torch.distributed import destroy_process_group, init_process_group
from course_lib.topics.cluster import free_port

PORT = str(free_port())
SNAPSHOT = os.path.join(tempfile.mkdtemp(), "checkpoint.pt")


def ddp_setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = PORT
    init_process_group(backend="gloo", rank=rank, world_size=world_size)


def main(rank, world_size, save_every, total_epochs, batch_size):
    ddp_setup(rank, world_size)
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, rank, save_every, SNAPSHOT)
    last_loss = trainer.train(total_epochs)
    destroy_process_group()
    return last_loss
"""

# The torchrun version of the same script, saved as a file and imported: ddp_setup() reads the
# environment torchrun (and launch) set; main() is what `if __name__ == "__main__"` would call.
TORCHRUN_SCRIPT = SERIES_COMMON + """
from torch.distributed import destroy_process_group, init_process_group

SNAPSHOT = os.path.join(tempfile.gettempdir(), f"snapshot-{os.getppid()}.pt")


def ddp_setup():
    init_process_group(backend="gloo")


def main(save_every, total_epochs, batch_size):
    ddp_setup()
    rank = int(os.environ["LOCAL_RANK"])
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, rank, save_every, SNAPSHOT)
    last_loss = trainer.train(total_epochs)
    destroy_process_group()
    return last_loss


if __name__ == "__main__":
    main(save_every=2, total_epochs=3, batch_size=32)
"""

LAUNCHES = 3  # launches per kernel


def _launch_cell(call: str) -> str:
    return f"""
import time
times = []
for attempt in range({LAUNCHES}):
    start = time.monotonic()
    results = {call}
    times.append(time.monotonic() - start)
    assert len(results) == 2 and all(isinstance(r, float) for r in results), results
print("launch seconds:", " ".join(f"{{t:.1f}}" for t in times))
print("kernel ok")
"""


KERNEL_PATTERNS = {
    "kernel_demo_basic": (DEMO_BASIC, "from course_lib import spawn",
                          "spawn(demo_basic, args=(2,), nprocs=2, output='none')"),
    "kernel_demo_checkpoint": (DEMO_CHECKPOINT, "from course_lib import spawn",
                               "spawn(demo_checkpoint, args=(2,), nprocs=2, output='none')"),
    "kernel_trainer_spawn": (TRAINER_SPAWN, "from course_lib import spawn",
                             "spawn(main, args=(2, 2, 3, 32), nprocs=2, output='none')"),
    "kernel_torchrun_main": (
        f"from pathlib import Path\nPath('multigpu_torchrun.py').write_text({TORCHRUN_SCRIPT!r})\n",
        "from course_lib import launch\nfrom multigpu_torchrun import main",
        "launch(main, 2, 3, 32, nprocs=2, init_process_group=False, output='none')"),
}

# Runs the cells in a fresh kernel (nbclient), prints what they printed; fails on an error or a
# cell that outlives CELL_TIMEOUT (the harness's own timeout then kills what is left).
KERNEL_DRIVER = """
import sys
import nbformat
from nbclient import NotebookClient

notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in CELLS])
client = NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="python3",
                        resources={"metadata": {"path": "."}})
try:
    client.execute()
finally:
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            sys.stdout.write(output.get("text", "") or "\\n".join(output.get("traceback", [])) + "\\n")
"""


def _kernel_scenario(cells) -> "Scenario":
    return Scenario([sys.executable, "{script}"], "kernel ok",
                    f"CELLS = {list(cells)!r}\nCELL_TIMEOUT = 240\n{KERNEL_DRIVER}")


SCENARIOS = {
    "torchrun_script": Scenario(
        [*TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "course_lib.examples.ddp_train",
         "--epochs", "2"], "epoch 1:"),
    "train_cli_torchrun": Scenario(
        [*TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "course_lib", "train", *SMALL_TRAIN],
        "trained strategy=ddp on 2 rank(s)"),
    "train_cli_nprocs": Scenario(
        [sys.executable, "-m", "course_lib", "train", "--nprocs", "2", "--timeout", "120", *SMALL_TRAIN],
        "trained strategy=ddp on 2 rank(s)"),
    "launch_all_reduce": Scenario([sys.executable, "{script}"], "launch ok", LAUNCH_ALL_REDUCE),
    "session_cell": Scenario([sys.executable, "{script}"], "session ok", SESSION_CELL),
    "grader": Scenario([sys.executable, "{script}"], "DDP by hand: passed", GRADER),
    "dcp_save_load": Scenario([sys.executable, "{script}"], "dcp ok", DCP_SAVE_LOAD),
    "two_nodes": Scenario([sys.executable, "{script}"], "two nodes ok",
                          f"WHOAMI = {WHOAMI!r}\n{TWO_NODES}"),
    # the notebooks as the test suite runs them: nbval on the solution, and on the unsolved lesson
    **{f"nbval_{kind}_{lesson}": Scenario(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/authoring/test_notebooks.py",
         "-k", f"{test} and {lesson}"], "1 passed", in_repo=True)
       for lesson in ("04_ddp_flow", "08_pitfalls")
       for kind, test in (("solution", "test_solution_passes_nbval"),
                          ("lesson", "test_unsolved_lesson_fails_in_every_check_and_nowhere_else"))},
    "elastic_restart": Scenario([sys.executable, "{script}"], "elastic ok",
                                f"ELASTIC_TRAIN = {ELASTIC_TRAIN!r}\n{ELASTIC_RESTART}"),
    **{name: _kernel_scenario([code, imports + "\n" + _launch_cell(call)])
       for name, (code, imports, call) in KERNEL_PATTERNS.items()},
}


def run_once(scenario: Scenario, scratch: Path, timeout: float):
    """(failure or None, seconds, output)."""
    from course_lib.topics.cluster import stop_processes

    script = scratch / "scenario.py"
    script.write_text(textwrap.dedent(scenario.script))
    command = [str(script) if part == "{script}" else part for part in scenario.command]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO if scenario.in_repo else scratch, env=env, text=True, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_processes([process])  # and torchrun's workers, in sessions of their own
        output, _ = process.communicate()
        return f"timed out after {timeout:g} s", time.monotonic() - start, output
    finally:
        stop_processes([process])
    seconds = time.monotonic() - start
    if process.returncode != 0:
        return f"exit code {process.returncode}", seconds, output
    if scenario.expect not in output:
        return f"no {scenario.expect!r} in the output", seconds, output
    return None, seconds, output


def last_lines(output: str, count: int = 3, width: int = 100) -> str:
    lines = [line.strip() for line in output.splitlines() if line.strip()][-count:]
    return " | ".join(line[:width] for line in lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30, help="runs of each scenario")
    parser.add_argument("--only", default=None, help="comma-separated scenario names")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--load", type=int, default=0,
                        help="processes that keep a core busy each during the runs (a loaded CI machine)")
    parser.add_argument("--list", action="store_true", help="print the scenarios and exit")
    parser.add_argument("--repo", default=None,
                        help="run the course from this checkout instead (before/after comparisons)")
    args = parser.parse_args(argv)
    if args.repo:
        global REPO
        REPO = Path(args.repo).resolve()
    if args.list:
        for name, scenario in SCENARIOS.items():
            print(f"{name:28} {' '.join(scenario.command).replace(sys.executable, 'python')}")
        return 0
    names = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = [name for name in names if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        rows = [run_scenario(name, args.runs, args.timeout) for name in names]
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    print()
    print(f"{'scenario':28} {'runs':>5} {'failures':>8} {'median s':>9} {'slowest launch s':>16}  "
          f"first failure's last lines")
    for name, runs, failures, median, slowest, first_failure in rows:
        slowest = f"{slowest:16.1f}" if slowest is not None else f"{'-':>16}"
        print(f"{name:28} {runs:5d} {failures:8d} {median:9.1f} {slowest}  {first_failure or '-'}")
    return 1 if any(row[2] for row in rows) else 0


def run_scenario(name: str, runs: int, timeout: float):
    """(name, runs, failures, median seconds, slowest launch or None, the first failure's reason
    and last lines)."""
    failures, times, launches, first_failure = 0, [], [], ""
    for run in range(runs):
        with tempfile.TemporaryDirectory() as scratch:
            failure, seconds, output = run_once(SCENARIOS[name], Path(scratch), timeout)
        times.append(seconds)
        these = [float(t) for line in output.splitlines() if line.startswith("launch seconds:")
                 for t in line.split(":", 1)[1].split()]
        launches += these
        if failure:
            failures += 1
            first_failure = first_failure or f"{failure}: {last_lines(output)}"
        shown = f", launches {' '.join(f'{t:.1f}' for t in these)} s" if these else ""
        print(f"{name} run {run + 1}/{runs}: {failure or 'ok'} ({seconds:.1f} s{shown})", flush=True)
    return name, runs, failures, statistics.median(times), max(launches, default=None), first_failure


if __name__ == "__main__":
    sys.exit(main())
