"""`python -m course_lib doctor`: can this machine run the course, and how will it run?

Prints a table (Python, torch, GPUs, backends, /dev/shm, cores, a timed 2-rank launch, how many
learners the node serves) and exits non-zero when something the course needs is missing.
"""
import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from typing import List, NamedTuple, Tuple

from ..shared import env
from . import capacity

# The versions the whole test suite has passed on (README, "Run every test"): MIN_TORCH is
# pyproject.toml's lower bound; CI runs the pinned CPU build and the newest release on every change.
MIN_PYTHON = (3, 11)
MIN_TORCH = (2, 8)
NEWEST_TESTED_TORCH = (2, 15)
SHM_ADVICE_BYTES = 1 << 30


class Finding(NamedTuple):
    item: str
    value: str
    # "ok", "note" (works, with advice), "WARN" (may work: not tested) or "FAIL" (cannot run)
    status: str


def _dotted(version: tuple) -> str:
    return ".".join(map(str, version))


def torch_status(version_string: str) -> str:
    """'ok' for a torch the course is tested on; WARN past the newest tested, FAIL below the oldest."""
    version = tuple(int(part) for part in re.findall(r"\d+", version_string)[:2])
    tested = f"{_dotted(MIN_TORCH)} to {_dotted(NEWEST_TESTED_TORCH)}"
    if version < MIN_TORCH:
        return f"FAIL: the course needs torch>={_dotted(MIN_TORCH)} (tested: {tested})"
    if version > NEWEST_TESTED_TORCH:
        untested = _dotted((NEWEST_TESTED_TORCH[0], NEWEST_TESTED_TORCH[1] + 1))
        return (f"WARN: newer than the course is tested on ({tested}); if a lesson fails, "
                f"pip install 'torch<{untested}' and tell us")
    return "ok"


def _torch_findings() -> List[Finding]:
    import torch
    import torch.distributed as dist

    found = [Finding("torch", torch.__version__, torch_status(torch.__version__))]
    gpus = env.gpu_count()
    if gpus:
        for index, (name, memory) in enumerate(gpu_descriptions()):
            found.append(Finding(f"cuda:{index}", f"{name}, {memory / 2**30:.0f} GiB", "ok"))
    else:
        found.append(Finding("CUDA GPUs", "none: lessons run on CPU processes (gloo)", "ok"))
    found.append(Finding("torch.distributed", "available" if dist.is_available() else "missing",
                         "ok" if dist.is_available() else "FAIL: this torch build has no torch.distributed"))
    if dist.is_available():
        found.append(Finding("gloo", "available" if dist.is_gloo_available() else "missing",
                             "ok" if dist.is_gloo_available() else "FAIL: the CPU lessons need gloo"))
        nccl = dist.is_nccl_available()
        found.append(Finding("nccl", "available" if nccl else "missing",
                             "ok" if nccl or not gpus else "note: GPUs but no NCCL; ranks will use gloo"))
    return found


GPU_QUERY = ("import json, torch; print(json.dumps([(p.name, p.total_memory) for p in "
             "map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))]))")


def gpu_descriptions() -> List[tuple]:
    """[(name, bytes of memory)] per GPU, without initialising CUDA in this process.

    Reading device properties initialises CUDA, after which `launch` can no longer fork: so unless
    CUDA is initialised already, a child process asks.
    """
    import torch

    if torch.cuda.is_initialized():
        properties = map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))
        return [(p.name, p.total_memory) for p in properties]
    result = subprocess.run([sys.executable, "-c", GPU_QUERY], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        return [("(could not read the GPU's properties)", 0)] * env.gpu_count()
    return [tuple(item) for item in json.loads(result.stdout.strip().splitlines()[-1])]


def _machine_findings() -> List[Finding]:
    cores = env.cpu_cores()
    python_ok = sys.version_info >= MIN_PYTHON
    found = [Finding("Python", platform.python_version(), "ok" if python_ok else f"FAIL: needs {_dotted(MIN_PYTHON)}+"),
             Finding("CPU cores", str(cores), "ok" if cores >= 2 else "note: 2 ranks will share one core")]
    if os.path.isdir("/dev/shm"):
        total = shutil.disk_usage("/dev/shm").total
        advice = ("ok" if total >= SHM_ADVICE_BYTES else
                  "note: below 1 GiB; DataLoader workers may crash (SIGBUS): use fewer workers, "
                  "or docker run --shm-size=2g")
        found.append(Finding("/dev/shm", f"{total / 2**30:.1f} GiB", advice))
    return found


def _launch_findings(nprocs: int) -> List[Finding]:
    import torch
    import torch.distributed as dist

    from .launch import DistributedRunError, launch

    backend, why = env.choose_backend(nprocs)
    method, _ = env.choose_start_method()
    found = [Finding("launch would use", f"{backend} ({why}), {method}", "ok")]

    def ping():
        tensor = torch.ones(1, device=env.device_for_rank())
        dist.all_reduce(tensor)
        return tensor.item()

    start = time.perf_counter()
    try:
        results = launch(ping, nprocs=nprocs, timeout=120, output="none")
        ok = results == [float(nprocs)] * nprocs
        found.append(Finding(f"test launch ({nprocs} ranks, all_reduce)", f"{time.perf_counter() - start:.2f} s",
                             "ok" if ok else f"FAIL: all_reduce gave {results}"))
    except (DistributedRunError, ValueError, RuntimeError) as error:
        first_line = str(error).strip().splitlines()[0]
        found.append(Finding(f"test launch ({nprocs} ranks)", "failed", f"FAIL: {first_line}"))
    return found


def class_findings(target_s: float = capacity.TARGET_S) -> Tuple[List[Finding], str]:
    """A lesson step alone and with K learners at once (seconds): how many learners the node
    serves, as table rows and the sentence that states the assumption."""
    try:
        measured = capacity.measure(target_s)
    except (RuntimeError, ValueError) as error:
        return [Finding("learners this node serves", "not measured", f"note: {str(error).splitlines()[0]}")], ""
    return [Finding(f"lesson step ({capacity.DDP_STEPS} DDP steps, 2 ranks)",
                    f"{measured.alone_s:.2f} s alone, {measured.at_once_s:.2f} s with {measured.measured} "
                    f"learners at once", "ok"),
            Finding("learners this node serves", f"about {measured.learners} at <= {target_s:g} s a step",
                    "ok" if measured.learners >= 1 else
                    f"note: a lesson step takes over {target_s:g} s with {measured.measured} learners at once")
            ], capacity.sentence(measured)


def diagnose(nprocs: int = 2, test_launch: bool = True) -> List[Finding]:
    findings = _machine_findings()
    try:
        findings += _torch_findings()
    except ImportError as error:
        return findings + [Finding("torch", "missing", f"FAIL: {error}; see the README for CPU-only wheels")]
    if test_launch and not any(f.status.startswith("FAIL") for f in findings):
        findings += _launch_findings(nprocs)
    return findings


def format_table(findings: List[Finding]) -> str:
    width = max(len(f.item) for f in findings)
    value_width = max(len(f.value) for f in findings)
    return "\n".join(f"{f.item:<{width}}  {f.value:<{value_width}}  {f.status}" for f in findings)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2, help="ranks for the test launch (default 2)")
    parser.add_argument("--no-launch", action="store_true",
                        help="skip the timed test launch and the learners this node serves (seconds)")
    parser.add_argument("--target", type=float, default=capacity.TARGET_S, metavar="SECONDS",
                        help=f"the most a lesson step may take (default {capacity.TARGET_S:g})")
    args = parser.parse_args(argv)
    findings, served = diagnose(args.nprocs, not args.no_launch), ""
    if not args.no_launch and not any(f.status.startswith("FAIL") for f in findings):
        more, served = class_findings(args.target)
        findings += more
    print(format_table(findings))
    if served:
        print("\n" + served)
    failed = [f for f in findings if f.status.startswith("FAIL")]
    warned = [f for f in findings if f.status.startswith("WARN")]
    print("\n" + ("This machine cannot run the course yet: fix the FAIL lines above." if failed
                  else "Ready to try: read the WARN lines above." if warned
                  else "Ready: every lesson runs here."))
    return 1 if failed else 0
