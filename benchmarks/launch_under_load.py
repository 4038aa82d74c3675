"""Launches on a shared node: N learners at once, each a fresh Python (a kernel) that imports
course_lib and launches 2-rank DDP steps in a loop, against one learner alone; and what a fresh
process's first launch costs, with and without what the launcher preloads (launch.py's
import_what_ranks_share: torch._dynamo, which DDP's constructor imports).

For each N: the p50 and p95 of the launches after the first (every learner's, together), and
the first launch's median and worst (torch imported before it, as a lesson's first cell does: the
first launch adds torch._dynamo, under contention). Figures are appended to
benchmarks/results/launch_under_load.txt with the machine's cores and load.

    python benchmarks/launch_under_load.py [--learners 1,2,4] [--launches 12] [--fresh 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "launch_under_load.txt"


def learner(launches: int, preload: bool) -> dict:
    """One learner's kernel: import, then `launches` launches of one DDP step on 2 ranks."""
    start = time.perf_counter()
    import torch  # noqa: F401 - a lesson's first cell imports it: the first launch's cost is the rest
    from course_lib.runtime.launcher import capacity, starter
    from course_lib import launch

    imported = time.perf_counter() - start
    if not preload:  # each rank imports torch._dynamo itself, at every launch
        starter.preload_for_fork = lambda: None
    seconds = []
    for _ in range(launches):
        start = time.perf_counter()
        launch(capacity.lesson_step, 1, nprocs=2, output="none", timeout=300)
        seconds.append(time.perf_counter() - start)
    return {"import_s": imported, "first_s": seconds[0], "later_s": seconds[1:]}


def run_learners(count: int, launches: int, preload: bool = True) -> list:
    """`count` fresh Pythons started at the same moment; each one's learner() figures."""
    command = [sys.executable, __file__, "--as-learner", str(launches)] + ([] if preload else ["--no-preload"])
    children = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    replies = []
    for child in children:
        out, _ = child.communicate(timeout=900)
        if child.returncode != 0:
            raise RuntimeError(f"a learner failed ({child.returncode}): {out[-2000:]}")
        replies.append(json.loads(out.strip().splitlines()[-1]))
    return replies


def percentile(values: list, fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def under_load(counts, launches: int) -> list:
    lines, alone = [], None
    for count in counts:
        replies = run_learners(count, launches)
        later = [s for reply in replies for s in reply["later_s"]]
        first = [reply["first_s"] for reply in replies]
        p50, p95 = statistics.median(later), percentile(later, 0.95)
        alone = alone or (p50, p95)
        lines.append(f"N={count} learners at once: launch p50 {p50:.3f} s, p95 {p95:.3f} s "
                     f"({p50 / alone[0]:.1f}x, {p95 / alone[1]:.1f}x alone; {len(later)} launches); "
                     f"first launch median {statistics.median(first):.2f} s, worst {max(first):.2f} s; "
                     f"import torch and course_lib median {statistics.median(r['import_s'] for r in replies):.2f} s")
        print(lines[-1], flush=True)
    return lines


def first_launch(fresh: int) -> list:
    lines = []
    for preload in (True, False):
        replies = [run_learners(1, 3, preload)[0] for _ in range(fresh)]  # one after another: alone
        first = statistics.median(r["first_s"] for r in replies)
        later = statistics.median(s for r in replies for s in r["later_s"])
        lines.append(f"first launch in a fresh process (torch imported), {'with' if preload else 'without'} "
                     f"the preload: median {first:.2f} s, then {later:.3f} s a launch ({fresh} fresh processes)")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--learners", default="1,2,4")
    parser.add_argument("--launches", type=int, default=12, help="per learner, the first included")
    parser.add_argument("--fresh", type=int, default=3, help="fresh processes per first-launch figure")
    parser.add_argument("--as-learner", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-preload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_learner:
        print(json.dumps(learner(args.as_learner, not args.no_preload)))
        return
    header = (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {os.cpu_count()} cores, load average "
              f"{os.getloadavg()[0]:.1f} at the start; {args.launches} launches a learner (one DDP step on 2 ranks)")
    print(header, flush=True)
    lines = under_load([int(n) for n in args.learners.split(",")], args.launches) + first_launch(args.fresh)
    lines.append(f"load average {os.getloadavg()[0]:.1f} at the end")
    RESULTS.parent.mkdir(exist_ok=True)
    with open(RESULTS, "a") as results:
        results.write("\n".join([header] + ["  " + line for line in lines]) + "\n\n")


if __name__ == "__main__":
    main()
