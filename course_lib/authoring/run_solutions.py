"""Executing the solution notebooks with nbclient: pass/fail, seconds and device per notebook.

Instructors run it on GPU nodes before a class; `--write` stores the outputs (maintainers only).
"""
import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..runtime.shared import env
from ..runtime.launcher.doctor import gpu_descriptions
from .check import ANSI_COLOR
from .layout import SOLUTIONS, course_notebooks, find_course_root, matches_numbers
from .scrub import scrub_outputs
from . import slurm_run

DEFAULT_TIMEOUT_S = 600


@dataclass
class NotebookRun:
    name: str
    passed: bool
    seconds: float
    error: str = ""


def this_python_kernel_manager():
    """A kernel manager whose kernel is this Python, whatever kernel the notebook names, so a
    cluster's own `python3` kernelspec never runs the notebooks in another environment."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class ThisPythonKernelSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())

    return AsyncKernelManager(kernel_spec_manager=ThisPythonKernelSpecs())


def execute(path: Path, timeout_s: float):
    """Run every cell of the notebook at `path`, in its folder, within `timeout_s` in all.
    Returns (executed notebook, NotebookRun)."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, km=this_python_kernel_manager(), timeout=timeout_s,
                            record_timing=False)
    started = time.perf_counter()
    try:
        error = asyncio.run(_execute_within(client, path.parent, timeout_s))
    except Exception as failure:  # a cell raised: nbclient's CellExecutionError, or the kernel died
        error = first_error_line(failure)
    seconds = time.perf_counter() - started
    return nb, NotebookRun(path.name, not error, seconds, error)


async def _execute_within(client, folder: Path, timeout_s: float) -> str:
    """Execute with `client` in `folder`; '' when done in time, else why it was stopped."""
    execution = asyncio.ensure_future(client.async_execute(cwd=str(folder), cleanup_kc=True))
    done, _ = await asyncio.wait({execution}, timeout=timeout_s)
    if done:
        execution.result()  # raises the cell's error, if any
        return ""
    execution.cancel()  # nbclient shuts the kernel down as the cancellation unwinds
    await asyncio.gather(execution, return_exceptions=True)
    return f"timed out after {timeout_s:g} s; raise --timeout or make the notebook faster"


def first_error_line(failure: Exception) -> str:
    """The line naming the exception in nbclient's message (e.g. 'ValueError: bad shape')."""
    text = ANSI_COLOR.sub("", str(failure))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    named = [line for line in lines if getattr(failure, "ename", "\0") in line]
    return (named or lines or [type(failure).__name__])[-1][:160]


def describe_device(nprocs: int = 2) -> str:
    """What the notebooks' launches (2 ranks) will use: '2x NVIDIA H200 (nccl)', '1x NVIDIA H100
    (gloo: 2 ranks but only 1 GPU, ranks run on the CPU)', 'cpu x2 (gloo)'."""
    backend, why = env.choose_backend(nprocs)
    if not env.gpu_count():
        return f"cpu x{env.cpu_cores()} ({backend})"
    names = [name for name, _ in gpu_descriptions()]
    groups = [f"{names.count(name)}x {name}" for name in dict.fromkeys(names)]
    return ", ".join(groups) + (f" ({backend})" if backend == "nccl" else f" ({backend}: {why})")


def print_table(runs, device: str) -> None:
    rows = [("notebook", "result", "seconds", "device")]
    rows += [(run.name, "pass" if run.passed else f"FAIL {run.error}", f"{run.seconds:.1f}", device)
             for run in runs]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])


def run_solutions_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib run-solutions",
                                     description="Execute the solution notebooks with nbclient.")
    parser.add_argument("--only", action="append", default=[], metavar="NN",
                        help="run only lesson NN (repeat it, or give a list: --only 3,4)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds each notebook may take (default {DEFAULT_TIMEOUT_S})")
    parser.add_argument("--write", action="store_true",
                        help="store the outputs of each passing notebook back into it "
                             "(machine paths scrubbed); then run build-lessons")
    parser.add_argument("--root", type=Path, default=None,
                        help="the course folder (default: found from the current folder)")
    slurm_run.add_arguments(parser)
    args = parser.parse_args(argv)
    root = find_course_root(args.root)
    notebooks = [path for path in course_notebooks(root / SOLUTIONS)
                 if matches_numbers(path, args.only)]
    if not notebooks:
        print(f"no solution notebooks to run in {root / SOLUTIONS}"
              + (f" for --only {','.join(args.only)}" if args.only else ""), file=sys.stderr)
        return 2
    if args.slurm:  # the same run, on a compute node: its report printed here
        return slurm_run.run_solutions_on_slurm(args, root, notebooks, print_table)
    device = describe_device()
    runs = []
    for number, path in enumerate(notebooks, start=1):
        print(f"[{number}/{len(notebooks)}] running {path.name} ...", flush=True)
        nb, run = execute(path, args.timeout)
        runs.append(run)
        print(f"[{number}/{len(notebooks)}] {'pass' if run.passed else 'FAIL'} {path.name} "
              f"in {run.seconds:.1f} s", flush=True)
        if args.write and run.passed:
            nbformat.write(scrub_outputs(nb, root), path)
            print(f"stored its outputs in {SOLUTIONS}/{path.name}; now run "
                  f"`python -m course_lib build-lessons`", flush=True)
        elif args.write:
            print(f"left {SOLUTIONS}/{path.name} as it was, since it failed", flush=True)
    print_table(runs, device)
    if args.report_json:
        slurm_run.write_report(args.report_json, runs, device)
    return 0 if all(run.passed for run in runs) else 1
