"""Launch latency: trivial 2-rank launches (one all_reduce, results returned), side by side.

Compares course_lib.runtime.launcher.launch (fork and spawn) with torch's raw start_processes(start_method="fork")
and, when installed, Accelerate's notebook_launcher. Runs are interleaved round by round so that
load on the machine hits every method alike; medians and ratios to the raw fork start are printed.
Targets (issue 2): course_lib fork within 1.5x of raw fork, and faster than Accelerate.

--ddp times what preload_for_fork is for: launches whose ranks build a DDP model (DDP's
constructor imports torch._dynamo, seconds of imports). Each variant runs in a fresh interpreter,
as a new kernel would: the first launch, then the median of the later ones, with the preload
(the default) and without it (every rank then imports torch._dynamo itself, at every launch).
Each rank trains one step and frees its model before the launcher destroys the group, an ending
that older versions of course_lib ran without hanging too (for before/after figures); the
tutorials' ending is stress-tested by benchmarks/stress.py.

    python benchmarks/launch_latency.py [--repeats 20] [--check]
    python benchmarks/launch_latency.py --ddp [--repeats 8]
"""
import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from course_lib import launch

NPROCS = 2


def _reduce_one() -> float:
    tensor = torch.ones(1)
    dist.all_reduce(tensor)
    return tensor.item()


def course_lib_fork():
    return launch(_reduce_one, nprocs=NPROCS, output="none", timeout=120, start_method="fork")


def course_lib_spawn():
    return launch(_reduce_one, nprocs=NPROCS, output="none", timeout=120, start_method="spawn")


def _raw_rank(rank, port, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=NPROCS)
    queue.put((rank, _reduce_one()))
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:  # bind-then-close: racy, but this is the baseline people write
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def raw_start_processes_fork():
    queue = mp.get_context("fork").SimpleQueue()
    mp.start_processes(_raw_rank, args=(_free_port(), queue), nprocs=NPROCS, join=True, start_method="fork")
    results = dict(queue.get() for _ in range(NPROCS))
    return [results[rank] for rank in range(NPROCS)]


def _accelerate_rank(queue):
    dist.init_process_group("gloo")  # notebook_launcher sets the torchrun environment
    queue.put((dist.get_rank(), _reduce_one()))
    dist.destroy_process_group()


def accelerate_notebook_launcher():
    from accelerate import notebook_launcher

    queue = mp.get_context("fork").SimpleQueue()
    notebook_launcher(_accelerate_rank, (queue,), num_processes=NPROCS, use_port=str(_free_port()))
    results = dict(queue.get() for _ in range(NPROCS))
    return [results[rank] for rank in range(NPROCS)]


def _methods():
    methods = {"raw start_processes (fork)": raw_start_processes_fork,
               "course_lib.runtime.launcher.launch (fork)": course_lib_fork,
               "course_lib.runtime.launcher.launch (spawn)": course_lib_spawn}
    try:
        import accelerate  # noqa: F401

        methods["accelerate notebook_launcher"] = accelerate_notebook_launcher
    except ImportError:
        print("accelerate is not installed: its launcher is left out (pip install -e '.[bench]')")
    return methods


def measure(repeats: int, spawn_repeats: int):
    methods = _methods()
    times = {name: [] for name in methods}
    for method in methods.values():
        assert method() == [float(NPROCS)] * NPROCS  # warm-up, and a check that each one works
    for round_index in range(repeats):
        for name, method in methods.items():
            if "spawn" in name and round_index >= spawn_repeats:
                continue
            start = time.perf_counter()
            method()
            times[name].append(time.perf_counter() - start)
    return times


DDP_RUN = """
import json, sys, time
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from course_lib import launch
import course_lib.runtime.launcher.starter as starter

if sys.argv[1] == "no-preload":
    starter.preload_for_fork = lambda: None

def build_ddp_and_step():
    ddp_model = DDP(nn.Linear(16, 4))
    ddp_model(torch.randn(8, 16)).sum().backward()
    del ddp_model  # freed before the launcher's destroy_process_group(): an ending that never hung
    return float(dist.get_world_size())

seconds = []
for _ in range(int(sys.argv[2])):
    start = time.perf_counter()
    assert launch(build_ddp_and_step, nprocs=2, output="none", timeout=300, start_method="fork") == [2.0, 2.0]
    seconds.append(time.perf_counter() - start)
print(json.dumps(seconds))
"""


def measure_ddp(repeats: int):
    """{variant: [seconds of each launch]}, each variant in a fresh interpreter, interleaved."""
    import json
    import subprocess

    times = {"preload (default)": [], "no preload": []}
    for _ in range(2):  # two fresh interpreters per variant, alternating
        for variant, flag in (("preload (default)", "preload"), ("no preload", "no-preload")):
            out = subprocess.run([sys.executable, "-c", DDP_RUN, flag, str(repeats)], capture_output=True,
                                 text=True, timeout=1200, check=True)
            times[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return times


def main_ddp(repeats: int) -> int:
    times = measure_ddp(repeats)
    print(f"\n{'DDP-constructing launch (fork)':<32} {'first launch':>13} {'later, median':>14}")
    for variant, runs in times.items():
        first = statistics.median(run[0] for run in runs)
        later = statistics.median(t for run in runs for t in run[1:])
        print(f"{variant:<32} {first:>12.2f}s {later:>13.2f}s")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 20; 8 with --ddp)")
    parser.add_argument("--spawn-repeats", type=int, default=5, help="spawn is slow: fewer rounds")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--ddp", action="store_true", help="time DDP-constructing launches, with and without the preload")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.ddp:
        return main_ddp(args.repeats or 8)
    args.repeats = args.repeats or 20
    times = measure(args.repeats, args.spawn_repeats)
    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = medians["raw start_processes (fork)"]
    print(f"\n{'method':<32} {'runs':>4} {'median':>9} {'vs raw fork':>12}")
    for name, median in medians.items():
        print(f"{name:<32} {len(times[name]):>4} {median * 1000:>7.1f}ms {median / baseline:>11.2f}x")
    ours = medians["course_lib.runtime.launcher.launch (fork)"]
    verdicts = [("course_lib fork within 1.5x of raw fork", ours <= 1.5 * baseline)]
    if "accelerate notebook_launcher" in medians:
        verdicts.append(("course_lib fork faster than Accelerate", ours < medians["accelerate notebook_launcher"]))
    print()
    for target, met in verdicts:
        print(f"{'met ' if met else 'MISSED'}  {target}")
    return 1 if args.check and not all(met for _, met in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
