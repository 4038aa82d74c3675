"""Multi-node jobs: where each rank lives in a node layout, torchrun command lines, a SLURM batch
script, and running several simulated "nodes" (torchrun agents) on this machine under a timeout.
"""
from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from time import monotonic, sleep

from ..runtime.shared.process_group import signal_group

__all__ = ["RankPlace", "rank_layout", "free_port", "torchrun_command", "run_nodes", "NodeRun",
           "slurm_script"]


@dataclass(frozen=True)
class RankPlace:
    """One process of a job: its global rank, its node, and its number on that node."""

    rank: int
    node_rank: int
    local_rank: int
    world_size: int
    local_world_size: int


def rank_layout(nproc_per_node) -> list:
    """Every process of a job, in rank order. `nproc_per_node` is one int per node (a list), or
    (nnodes, nproc) for equal nodes. Ranks are numbered node by node, as torchrun does."""
    if isinstance(nproc_per_node, tuple) and len(nproc_per_node) == 2:
        nnodes, nproc = nproc_per_node
        nproc_per_node = [nproc] * nnodes
    if not nproc_per_node or any(n < 1 for n in nproc_per_node):
        raise ValueError(f"need at least one node and one process per node, got {nproc_per_node}")
    world_size, places, first_rank = sum(nproc_per_node), [], 0
    for node_rank, nproc in enumerate(nproc_per_node):
        places += [RankPlace(first_rank + local_rank, node_rank, local_rank, world_size, nproc)
                   for local_rank in range(nproc)]
        first_rank += nproc  # a node's ranks start after every earlier node's
    return places


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, for a rendezvous endpoint that torchrun binds a moment later.

    Picked at random below the range the OS hands out to port-0 binds and outgoing connections,
    so that before torchrun binds it no other program's connection can take it by chance (a port
    the OS picked, then released, can be handed out again at once).
    """
    first_ephemeral = _first_ephemeral_port()
    if first_ephemeral > 11000:
        for _ in range(100):
            port = 10000 + secrets.randbelow(first_ephemeral - 10000)  # not `random`: seeded alike
            if _can_bind(host, port):
                return port
    with socket.socket() as probe:  # no room below the range: let the OS pick
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _first_ephemeral_port() -> int:
    """The lowest port the OS hands out by itself: Linux says; elsewhere IANA's dynamic range."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _can_bind(host: str, port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def torchrun_command(script_and_args, nnodes: int = 1, nproc_per_node: int = 1,
                     node_rank: int | None = None, endpoint: str = "127.0.0.1:29500",
                     rdzv: str = "static", max_restarts: int = 0, run_id: str = "course") -> list:
    """argv for `python -m torch.distributed.run` (torchrun). rdzv="static": rank 0's node hosts
    the store at `endpoint` and each node says its --node_rank; rdzv="c10d": the nodes meet at
    `endpoint` and the rendezvous numbers them (elastic: restarts, nodes joining and leaving)."""
    host, port = endpoint.rsplit(":", 1)
    command = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
               f"--nproc_per_node={nproc_per_node}"]
    if rdzv == "static":
        if node_rank is None:
            raise ValueError("a static rendezvous needs node_rank (0 on the node at endpoint)")
        command += [f"--node_rank={node_rank}", f"--master_addr={host}", f"--master_port={port}"]
    elif rdzv == "c10d":
        command += ["--rdzv_backend=c10d", f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}"]
    else:
        raise ValueError(f"rdzv={rdzv!r} is not 'static' or 'c10d'")
    if max_restarts:
        command.append(f"--max_restarts={max_restarts}")
    return command + list(script_and_args)


@dataclass
class NodeRun:
    """What one simulated node (one torchrun agent and its workers) did."""

    returncode: int
    output: str  # stdout and stderr, interleaved as they came

    def lines(self, prefix: str = "") -> list:
        return [line for line in self.output.splitlines() if line.startswith(prefix)]


def run_nodes(commands, timeout: float, cwd=None, env=None) -> list:
    """Start each command (one per node) at once, each in its own process group, and wait for all.

    On a timeout, an interrupt or any error, every node still running is stopped: SIGTERM to its
    process group (torchrun then stops its workers), then SIGKILL to the group and to every
    process below it, by pid (torchrun's workers run in sessions of their own, outside the
    group). No agent or worker survives; a timeout raises TimeoutError.

    Every node runs with OMP_NUM_THREADS=1 unless `env` says otherwise; `env` adds or replaces
    variables, and a value of None removes one (to see what torchrun does when it is unset).
    """
    # Buffered output, as Python's default: print(..., flush=True) then writes its line in one go.
    # Unbuffered, the text and its newline are two writes, and two processes that print at the
    # same moment share the pipe: "a ...b ..." on one line. (torchrun starts its workers with
    # `python -u` whatever we set: scripts it runs print each line as one string, see lesson 12.)
    inherited = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    env = {name: value for name, value in {**inherited, "OMP_NUM_THREADS": "1", **(env or {})}.items()
           if value is not None}
    processes = []
    try:
        for command in commands:
            processes.append(subprocess.Popen(command, cwd=cwd, env=env, text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              start_new_session=True))
        outputs = _communicate_all(processes, timeout)
    finally:
        stop_processes(processes)
    return [NodeRun(process.returncode, output) for process, output in zip(processes, outputs)]


def _communicate_all(processes, timeout):
    outputs = [""] * len(processes)

    def read(index):
        outputs[index] = processes[index].stdout.read()

    readers = [threading.Thread(target=read, args=(index,), daemon=True)
               for index in range(len(processes))]
    for reader in readers:
        reader.start()
    deadline = monotonic() + timeout
    for process in processes:
        try:
            process.wait(timeout=max(deadline - monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            stop_processes(processes)
            raise TimeoutError(f"the {len(processes)} nodes did not finish within {timeout:g} s; "
                               f"every process they started was killed") from None
    for reader in readers:
        reader.join(timeout=5)
    return outputs


def stop_processes(processes, grace_s: float = 5.0) -> None:
    """Stop every Popen still running, and everything below it (see run_nodes)."""
    running = [process for process in processes if process.poll() is None]
    below = [pid for process in running for pid in _descendants(process.pid)]
    _signal_groups(running, signal.SIGTERM)  # torchrun's agent stops its workers on SIGTERM
    deadline = monotonic() + grace_s
    while any(process.poll() is None for process in running) and monotonic() < deadline:
        sleep(0.05)
    _signal_groups(running, signal.SIGKILL)
    for pid in below:  # workers that outlived their agent, in sessions of their own
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for process in running:
        process.wait()


def _signal_groups(processes, signum) -> None:
    for process in processes:
        signal_group(process.pid, signum)  # the group this Popen leads


def _descendants(pid: int) -> list:
    """Every process below `pid`, read from /proc (an empty list where there is no /proc)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, waiting = [], [pid]
    while waiting:
        for child in children.get(waiting.pop(), []):
            found.append(child)
            waiting.append(child)
    return found


def slurm_script(command: str, nodes: int = 2, gpus_per_node: int = 8, job_name: str = "ddp",
                 time: str = "01:00:00", cpus_per_task: int = 32, partition: str | None = None,
                 env: dict | None = None, max_restarts: int = 0, nproc_per_node: int | None = None,
                 output: str = "%x-%j.out", requeue: bool = False) -> str:
    """A batch script for `sbatch`: one srun task per node, each a torchrun that starts
    nproc_per_node ranks (default: one per GPU); the nodes meet at the first node's address
    (c10d rendezvous). gpus_per_node=0 asks for no GPU: a CPU node, where the ranks use gloo.
    requeue=True lets SLURM queue the job again after a pre-emption, its log appended to."""
    nproc_per_node = nproc_per_node or gpus_per_node
    if not nproc_per_node:
        raise ValueError("gpus_per_node=0 (a CPU node) needs nproc_per_node, the ranks each node starts")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    lines += [f"#SBATCH --cpus-per-task={cpus_per_task}",
              f"#SBATCH --time={time}"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines.append(f"#SBATCH --output={output}")
    if requeue:
        lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"]
    lines += ["",
              "set -euo pipefail",
              'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              "export MASTER_PORT=$((29500 + SLURM_JOB_ID % 1000))",
              # srun does not inherit --cpus-per-task from the allocation since Slurm 22.05
              "export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK",
              f"export OMP_NUM_THREADS={max(cpus_per_task // nproc_per_node, 1)}"]
    lines += [f"export {name}={shlex.quote(str(value))}" for name, value in (env or {}).items()]
    if max_restarts:  # ranks of each round meet in a fresh store (pytorch/pytorch#135712)
        lines.append("export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    lines += ["",
              "srun torchrun \\",
              '    --nnodes="$SLURM_NNODES" \\',
              f"    --nproc_per_node={nproc_per_node} \\",
              '    --rdzv_id="$SLURM_JOB_ID" \\',
              "    --rdzv_backend=c10d \\",
              '    --rdzv_endpoint="$MASTER_ADDR:$MASTER_PORT" \\']
    if max_restarts:
        lines.append(f"    --max_restarts={max_restarts} \\")
    lines.append(f"    {command}")
    return "\n".join(lines) + "\n"
