"""course_lib.topics.cluster: rank layouts, torchrun command lines, the SLURM script, running "nodes"."""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from course_lib.topics.cluster import (RankPlace, free_port, rank_layout, run_nodes, slurm_script,
                                torchrun_command)


def test_equal_nodes_are_numbered_node_by_node():
    layout = rank_layout((2, 3))
    assert [place.rank for place in layout] == list(range(6))
    assert [(place.node_rank, place.local_rank) for place in layout] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert {place.world_size for place in layout} == {6}
    assert {place.local_world_size for place in layout} == {3}


def test_uneven_nodes_start_after_every_earlier_node():
    layout = rank_layout([4, 1, 2])
    assert layout[4] == RankPlace(rank=4, node_rank=1, local_rank=0, world_size=7, local_world_size=1)
    assert [place.rank for place in layout if place.node_rank == 2] == [5, 6]


@pytest.mark.parametrize("bad", [[], [2, 0], (0, 4)])
def test_empty_layouts_are_refused(bad):
    with pytest.raises(ValueError, match="at least one node"):
        rank_layout(bad)


def test_torchrun_commands_static_and_c10d():
    static = torchrun_command(["train.py", "--epochs", "1"], nnodes=2, nproc_per_node=4, node_rank=1,
                              endpoint="10.0.0.1:1234")
    assert static[1:3] == ["-m", "torch.distributed.run"]
    assert static[3:] == ["--nnodes=2", "--nproc_per_node=4", "--node_rank=1",
                          "--master_addr=10.0.0.1", "--master_port=1234", "train.py", "--epochs", "1"]
    elastic = torchrun_command(["-m", "course_lib", "train"], nnodes=2, rdzv="c10d",
                               endpoint="node0:29400", run_id="42", max_restarts=3)
    assert elastic[3:] == ["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                           "--rdzv_endpoint=node0:29400", "--rdzv_id=42", "--max_restarts=3",
                           "-m", "course_lib", "train"]
    with pytest.raises(ValueError, match="needs node_rank"):
        torchrun_command(["train.py"], nnodes=2)
    with pytest.raises(ValueError, match="etcd"):
        torchrun_command(["train.py"], rdzv="etcd")


def test_free_port_can_be_bound_and_is_not_one_the_os_hands_out():
    import socket

    ports = [free_port() for _ in range(20)]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", ports[0]))
    # below the range that port-0 binds and outgoing connections draw from, so none takes it
    # before torchrun binds it; and drawn at random, so two notebooks do not pick the same one
    range_file = "/proc/sys/net/ipv4/ip_local_port_range"
    first_ephemeral = int(open(range_file).read().split()[0]) if os.path.exists(range_file) else 49152
    assert all(1024 <= port < first_ephemeral for port in ports) and len(set(ports)) > 1


def test_slurm_script_is_valid_bash_with_one_torchrun_per_node():
    script = slurm_script("train.py --epochs 2", nodes=4, gpus_per_node=8, partition="gpu",
                          env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "^docker,lo"},
                          max_restarts=2)
    for expected in ["#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                     "#SBATCH --partition=gpu", 'scontrol show hostnames "$SLURM_JOB_NODELIST"',
                     "export NCCL_SOCKET_IFNAME='^docker,lo'", "srun torchrun \\",
                     "--nproc_per_node=8", "--rdzv_backend=c10d", "--max_restarts=2",
                     "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
                     "    train.py --epochs 2"]:
        assert expected in script, expected
    assert "OMP_NUM_THREADS=4" in script  # 32 cores for 8 ranks
    if shutil.which("bash"):
        checked = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, timeout=30)
        assert checked.returncode == 0, checked.stderr


def test_run_nodes_collects_each_nodes_output_and_exit_code():
    runs = run_nodes([[sys.executable, "-c", "print('node a')"],
                      [sys.executable, "-c", "import sys; print('node b'); sys.exit(3)"]], timeout=60)
    assert [run.returncode for run in runs] == [0, 3]
    assert runs[0].lines("node") == ["node a"] and runs[1].output == "node b\n"


def test_run_nodes_sets_one_thread_unless_env_replaces_or_removes_it(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    show = [sys.executable, "-c", "import os; print(os.environ.get('OMP_NUM_THREADS'))"]
    assert run_nodes([show], timeout=60)[0].output == "1\n"
    assert run_nodes([show], timeout=60, env={"OMP_NUM_THREADS": "4"})[0].output == "4\n"
    assert run_nodes([show], timeout=60, env={"OMP_NUM_THREADS": None})[0].output == "None\n"


def test_lines_printed_at_once_by_the_processes_of_a_node_stay_whole(monkeypatch):
    # one node whose four processes print many lines at the same moment into the node's pipe;
    # a learner's (or CI's) PYTHONUNBUFFERED must not split a line in two writes
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    printer = ("import sys\nfor i in range(5000):\n    print(f'process {sys.argv[1]} line {i} end', "
               "flush=True)\n")
    node = (f"import subprocess, sys\nprinter = {printer!r}\n"
            "ps = [subprocess.Popen([sys.executable, '-c', printer, str(n)]) for n in range(4)]\n"
            "sys.exit(max(p.wait() for p in ps))\n")
    (run,) = run_nodes([[sys.executable, "-c", node]], timeout=60)
    assert run.returncode == 0, run.output
    lines = run.output.splitlines()
    assert len(lines) == 20000
    assert all(re.fullmatch(r"process [0-3] line \d+ end", line) for line in lines), (
        [line for line in lines if not re.fullmatch(r"process [0-3] line \d+ end", line)][:3])


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
def test_run_nodes_kills_every_process_of_a_node_that_overruns(tmp_path):
    # A node whose child (like a torchrun worker) outlives the timeout: both must be gone after.
    pid_file = tmp_path / "child.pid"
    # The child runs in a session of its own, as torchrun's workers do, and the parent ignores
    # SIGTERM: killing the parent's process group alone would leave the child running.
    hang = (f"import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
            f"start_new_session=True); open({str(pid_file)!r}, 'w').write(str(child.pid)); "
            f"time.sleep(600)")
    timeout_s, started = 8, time.monotonic()
    with pytest.raises(TimeoutError, match=f"did not finish within {timeout_s} s"):
        run_nodes([[sys.executable, "-c", hang], [sys.executable, "-c", "print('done')"]], timeout=timeout_s)
    # the timeout, then stop_processes' grace (5 s) before SIGKILL, and room for a loaded machine
    assert time.monotonic() - started < timeout_s + 5 + 15
    assert pid_file.exists(), "the node did not start its child within the timeout"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(child):
        time.sleep(0.1)
    if alive(child):
        pytest.fail("the node's child process survived the timeout")


def alive(pid) -> bool:
    """True while `pid` runs; a killed process not yet reaped by its new parent (a zombie) is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
