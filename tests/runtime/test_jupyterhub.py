"""A class on one shared node: a real JupyterHub (jupyter/jupyterhub_config.py, LocalProcessSpawner)
with three learners, each a Unix user of its own, running lesson cells in their own kernels at once.
One presses stop in the middle of a launch, one restarts its kernel with a DistributedSession open,
one trains a DDP step in a session. Each sees its own right output; no rank is left behind; no port
is shared; nothing of a learner's is left in /tmp or /dev/shm; no learner's ranks read another's files.
"""
import os
import shutil
import threading
import time

import pytest

pytest.importorskip("jupyterhub", reason="pip install -e '.[test]' installs JupyterHub")
from hub_class import CannotReach, Hub, Learners  # noqa: E402 - after the skip

pytestmark = [
    pytest.mark.slow,  # three Jupyter servers and kernels: about a minute on 2 cores
    pytest.mark.timeout(480),  # generous for a loaded machine: the hub alone took 120+ s at a load of 18
    pytest.mark.skipif(os.geteuid() != 0, reason="makes Unix users and a mount namespace: needs root"),
    pytest.mark.skipif(not all(map(shutil.which, ("useradd", "userdel", "unshare", "mountpoint"))),
                       reason="needs useradd, userdel, unshare and mountpoint (passwd, util-linux)"),
]

SETUP = """
import os, time
import torch.distributed as dist
from course_lib import launch, DistributedSession

def who(marker):
    print("says", marker, flush=True)
    return marker, os.getuid(), os.environ["MASTER_PORT"], dist.get_rank()

def nap():
    print("napping", flush=True)
    time.sleep(60)

from course_lib.runtime.shared import env
print("share", env.threads_per_rank(2, "spawn"), "threads a rank of", os.environ["OMP_NUM_THREADS"])
session = DistributedSession(nprocs=2)
print("kernel", os.getpid(), "session", session.run("import os; (os.getpid(), os.environ['MASTER_PORT'])"))
"""
LAUNCH = "print('launched', launch(who, {marker!r}, nprocs=2))"
PROBE = """
def readable(paths):
    got = []
    for path in paths:
        try:
            os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(1)
            got.append(path)
        except OSError:
            pass
    return got
"""
DDP_STEP = """
import torch
from torch.nn.parallel import DistributedDataParallel
from course_lib import make_model, make_dataset
model = DistributedDataParallel(make_model(seed=0))
X, y = make_dataset(64).tensors
part = slice(rank * 32, rank * 32 + 32)
loss = torch.nn.functional.cross_entropy(model(X[part]), y[part])
loss.backward()
round(float(model.module[0].weight.grad.sum()), 6)
"""


def children_of(pid: int) -> list:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except OSError:
            continue
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def listening_ports() -> set:
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def parsed(printed: str, word: str):
    line = next(line for line in printed.splitlines() if line.startswith(word + " "))
    return eval(line[len(word) + 1:])  # noqa: S307 - the kernel printed a Python literal


def kernel_and_session(printed: str):
    """(the kernel's pid, [(pid, port)] of its session's ranks), from SETUP's last line."""
    _, pid, _, ranks = next(line for line in printed.splitlines() if line.startswith("kernel ")).split(" ", 3)
    return int(pid), eval(ranks)  # noqa: S307 - the kernel printed a Python literal


def together(jobs: dict) -> dict:
    """Run each learner's job in a thread of its own, all at once; {learner: result}, re-raising."""
    results, errors = {}, {}

    def run(name, job):
        try:
            results[name] = job()
        except BaseException as error:  # noqa: BLE001 - re-raised below, named
            errors[name] = error
    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, error in errors.items():
        raise AssertionError(f"learner {name}: {type(error).__name__}: {error}") from error
    return results


@pytest.fixture
def hub_and_learners():
    learners = Learners(3)
    hub = None
    try:
        try:
            hub = Hub(learners)
        except CannotReach as why:
            pytest.skip(str(why).splitlines()[0])
        yield hub, learners
    finally:
        if hub is not None:
            hub.stop()
        deadline = time.monotonic() + 15  # a kernel whose server was stopped notices within seconds
        while learners.processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = learners.processes()
        learners.remove()
        assert not left, f"processes of the learners outlived the hub: {left}"


def test_three_learners_on_one_hub_see_their_own_runs_and_leave_nothing(hub_and_learners):
    hub, learners = hub_and_learners
    stopper, restarter, trainer = learners.names
    uid = learners.uids

    def start(name):
        hub.start_server(name)
        kernel = hub.kernel(name)
        opened = kernel.run(SETUP)
        assert opened["error"] is None, opened["traceback"]
        ran = kernel.run(LAUNCH.format(marker=name))
        assert ran["error"] is None, ran["traceback"]
        return kernel, opened["stdout"], ran["stdout"]

    started = together({name: (lambda name=name: start(name)) for name in learners.names})
    kernels = {name: started[name][0] for name in learners.names}
    kernel_pids, session_ranks, ports = {}, {}, []
    for name, (kernel, opened, launched) in started.items():
        kernel_pids[name], session = kernel_and_session(opened)
        session_ranks[name] = [pid for pid, _ in session]
        assert "share 1 threads a rank of 2" in opened, opened  # the hub's OMP_NUM_THREADS, shared by 2 ranks
        results = parsed(launched, "launched")
        # each learner's launch ran as that learner, with its own marker, on ranks 0 and 1
        assert [(marker, owner, rank) for marker, owner, _, rank in results] == [(name, uid[name], 0), (name, uid[name], 1)]
        for other in learners.names:
            assert other == name or other not in launched, f"{name} saw {other}'s output: {launched}"
        ports += [session[0][1], results[0][2]]
    assert len(set(ports)) == len(ports), f"a port was shared between learners' runs: {ports}"

    # while every session is open: no learner's ranks can read what another owns
    owned = learners.files()
    for name, kernel in kernels.items():
        kernel.run(f"session.run({PROBE!r})")
        others = [path for other, paths in owned.items() if other != name for path in paths]
        got = kernel.run(f"print('readable', session.run({f'readable({others!r})'!r}))")
        assert got["error"] is None, got["traceback"]
        assert parsed(got["stdout"], "readable") == [[], []], f"{name}'s ranks read another learner's files"

    def press_stop():
        kernel = kernels[stopper]
        stopped = kernel.run("launch(nap, nprocs=2)", when_printed=("napping", kernel.interrupt), timeout=60)
        assert stopped["error"] in ("DistributedRunInterrupted", "KeyboardInterrupt"), stopped  # the former
        # is the latter, naming each rank's last output: the stop button's exception in either case
        left = set(children_of(kernel_pids[stopper])) - set(session_ranks[stopper])  # the session's stay
        assert not left, f"the stopped launch left ranks {left}"
        again = kernel.run(LAUNCH.format(marker=stopper) + "\nsession.close()")
        assert again["error"] is None, again["traceback"]
        return again["stdout"]

    def restart():
        kernel = kernels[restarter]
        kernel.restart()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(map(alive, [kernel_pids[restarter], *session_ranks[restarter]])):
            time.sleep(0.2)
        left = [pid for pid in [kernel_pids[restarter], *session_ranks[restarter]] if alive(pid)]
        assert not left, f"the restarted kernel's old processes still run: {left}"
        again = kernel.run(SETUP + "\n" + LAUNCH.format(marker=restarter) + "\nsession.close()")
        assert again["error"] is None, again["traceback"]
        kernel_pids[restarter], session = kernel_and_session(again["stdout"])
        session_ranks[restarter] += [pid for pid, _ in session]
        return again["stdout"]

    def train():
        kernel = kernels[trainer]
        step = kernel.run(f"print('gradients', session.run({DDP_STEP!r}))\nsession.close()")
        assert step["error"] is None, step["traceback"]
        return step["stdout"]

    after = together({stopper: press_stop, restarter: restart, trainer: train})
    for name in (stopper, restarter):
        results = parsed(after[name], "launched")
        assert [(marker, owner) for marker, owner, _, _ in results] == [(name, uid[name])] * 2
    gradients = parsed(after[trainer], "gradients")
    assert gradients[0] == gradients[1], f"DDP's all-reduce left the ranks' gradients apart: {gradients}"

    # every session closed: no kernel has a child, no rank of any run survives, no port listens
    for name, pid in kernel_pids.items():
        assert alive(pid) and not children_of(pid), f"{name}'s kernel {pid} has children {children_of(pid)}"
    for name, ranks in session_ranks.items():
        assert not any(map(alive, ranks)), f"{name}'s session ranks {ranks} outlived the session"
    assert not set(map(int, ports)) & listening_ports(), f"a run's port still listens: {ports}"
    together({name: kernel.shutdown for name, kernel in kernels.items()})
    kept = tuple(f"/tmp/torchinductor_{name}" for name in learners.names)  # torch's cache, by design
    leaked = {name: [path for path in paths if path.startswith(("/tmp", "/dev/shm", "/var/tmp"))
                     and not path.startswith(kept)] for name, paths in learners.files().items()}
    assert leaked == {name: [] for name in learners.names}, f"left in /tmp or /dev/shm: {leaked}"
