"""Launch latency: trivial 2-rank launches (one all_reduce, results returned), side by side.

Compares course_lib.runtime.launch (fork and spawn) with torch's raw start_processes(start_method="fork")
and, when installed, Accelerate's notebook_launcher. Runs are interleaved round by round so that
load on the machine hits every method alike; medians and ratios to the raw fork start are printed.
Targets (issue 2): course_lib fork within 1.5x of raw fork, and faster than Accelerate.

    python benchmarks/launch_latency.py [--repeats 20] [--check]
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
               "course_lib.runtime.launch (fork)": course_lib_fork,
               "course_lib.runtime.launch (spawn)": course_lib_spawn}
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--spawn-repeats", type=int, default=5, help="spawn is slow: fewer rounds")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    times = measure(args.repeats, args.spawn_repeats)
    medians = {name: statistics.median(values) for name, values in times.items()}
    baseline = medians["raw start_processes (fork)"]
    print(f"\n{'method':<32} {'runs':>4} {'median':>9} {'vs raw fork':>12}")
    for name, median in medians.items():
        print(f"{name:<32} {len(times[name]):>4} {median * 1000:>7.1f}ms {median / baseline:>11.2f}x")
    ours = medians["course_lib.runtime.launch (fork)"]
    verdicts = [("course_lib fork within 1.5x of raw fork", ours <= 1.5 * baseline)]
    if "accelerate notebook_launcher" in medians:
        verdicts.append(("course_lib fork faster than Accelerate", ours < medians["accelerate notebook_launcher"]))
    print()
    for target, met in verdicts:
        print(f"{'met ' if met else 'MISSED'}  {target}")
    return 1 if args.check and not all(met for _, met in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
