"""Session latency: a warm run of an empty cell on a 2-rank DistributedSession, and via %%distributed.

Target (issue 4): at most 50 ms median for the empty cell.

    python benchmarks/session_latency.py [--repeats 100] [--check]
"""
import argparse
import contextlib
import io
import statistics
import sys
import time

from course_lib import DistributedSession

TARGET_S = 0.050


def _median(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    args = parser.parse_args(argv)
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "course_lib")
    with contextlib.redirect_stdout(io.StringIO()):
        shell.run_cell_magic("distributed", "-n 2", "pass")  # starts the magic's session
    results = {}
    with DistributedSession(nprocs=2, output="none") as session:
        results["session.run('')"] = _median(lambda: session.run(""), args.repeats)
        results["session.run(lambda: None)"] = _median(lambda: session.run(lambda: None), args.repeats)
    with contextlib.redirect_stdout(io.StringIO()):
        # IPython rejects a cell magic with no body: `pass` is the empty cell
        results["%%distributed (pass)"] = _median(
            lambda: shell.run_cell_magic("distributed", "", "pass"), args.repeats)
        shell.run_line_magic("distributed", "stop")
    print(f"{'what':<30} {'median':>9}   target {TARGET_S * 1000:.0f} ms")
    for name, median in results.items():
        print(f"{name:<30} {median * 1000:>7.2f}ms   {'met' if median <= TARGET_S else 'MISSED'}")
    return 1 if args.check and max(results.values()) > TARGET_S else 0


if __name__ == "__main__":
    sys.exit(main())
