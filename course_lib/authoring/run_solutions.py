"""Executing the solution notebooks with nbclient: pass/fail, seconds and device per notebook.

Instructors run it on GPU nodes before a class; `--write` stores the outputs (maintainers only).
A run's report is JSON too: a SLURM job's node writes it, the login node reads it (slurm_run.py).
"""
import asyncio
import json
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat

from ..runtime.shared import env
from ..runtime.launcher.doctor import gpu_descriptions
from .scrub import scrub_outputs, uncolored

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
    text = uncolored(str(failure))
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


def store_outputs(nb, path: Path, root: Path) -> None:
    """Write the executed notebook back to `path`, machine paths scrubbed from its outputs."""
    nbformat.write(scrub_outputs(nb, root), path)


def write_report(path: Path, runs, device: str) -> None:
    """The runs as JSON, with this machine's name and the device they used."""
    report = {"node": socket.gethostname(), "device": device, "runs": [asdict(run) for run in runs]}
    Path(path).write_text(json.dumps(report, indent=1))


def read_report(path: Path):
    """(runs, 'node: device') from a report write_report wrote."""
    report = json.loads(Path(path).read_text())
    return [NotebookRun(**run) for run in report["runs"]], f"{report['node']}: {report['device']}"
