"""The rank side of a launch: set up one rank's process, run its job, report back, exit.

The same steps run in a forked child and in a spawned interpreter (`python -m course_lib.runtime.rank_process`).
"""
import faulthandler
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from . import channel
from .rank_detach import detach_from_kernel
from .tracebacks import describe_current_exception
from .user_rendezvous import follow_user_rendezvous


@dataclass
class RankSpec:
    """Everything a rank needs to know, fixed by the launcher before it starts."""

    rank: int
    world_size: int
    backend: str
    init_process_group: bool
    threads: int
    parent_pid: int
    env: Dict[str, str] = field(default_factory=dict)
    sys_path: list = field(default_factory=list)
    job: Any = None                # a callable job(spec, pipes); None: sent later on the control pipe
    pg_timeout_s: Optional[float] = None


@dataclass
class RankPipes:
    """The rank's ends of its pipes (file descriptor numbers)."""

    stdout: int
    stderr: int
    messages: int    # rank -> launcher: results and errors
    control: int     # launcher -> rank: the job (spawn) and session commands
    stacks: int      # rank -> launcher: faulthandler's stack dumps on SIGUSR1


def run_rank(spec: RankSpec, pipes: RankPipes, forked: bool) -> None:
    """Never returns: the process exits when its job is done."""
    code = 1
    try:
        _detach_from_launcher_signals(spec.parent_pid)
        if forked:
            detach_from_kernel(pipes.stdout, pipes.stderr)
        _keep_stack_dumps(pipes)
        os.environ.update(spec.env)
        code = _run_phases(spec, pipes)
    except BaseException:  # noqa: BLE001 - a rank must always report and exit
        _report_error(pipes.messages, "startup")
    finally:
        _flush_and_exit(code)


def _detach_from_launcher_signals(parent_pid: int) -> None:
    """Own process group (the launcher signals ranks itself), and die with the launcher."""
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (spawned with start_new_session)
    _die_with_parent()
    if os.getppid() != parent_pid:
        os._exit(1)  # the launcher died before we could watch it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:  # noqa: BLE001 - best effort; the launcher also kills its ranks
        pass


def _keep_stack_dumps(pipes: RankPipes) -> None:
    faulthandler.enable(file=sys.stderr, all_threads=True)  # a crash shows its Python stack
    stacks = open(pipes.stacks, "w", closefd=False)
    _keep_stack_dumps.file = stacks  # keep it open for faulthandler
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)


def _run_phases(spec: RankSpec, pipes: RankPipes) -> int:
    phase = "startup"
    try:
        import torch

        torch.set_num_threads(spec.threads)
        phase = "unpickling"
        job = spec.job if spec.job is not None else _receive_job(spec, pipes.control)
        phase = "init_process_group"
        if spec.init_process_group:
            _init_process_group(spec)
        else:  # the user's code sets up its own process group, wherever it chooses
            follow_user_rendezvous(lambda where: channel.send(pipes.messages, ("rendezvous", where)))
        phase = "running"
        job(spec, pipes)
        if spec.init_process_group:
            _destroy_process_group()
        return 0
    except BaseException:  # noqa: BLE001
        _report_error(pipes.messages, getattr(sys.exc_info()[1], "rank_phase", phase))
        return 1


def _receive_job(spec: RankSpec, control_fd: int):
    sys.path[:] = spec.sys_path or sys.path
    return channel.receive(control_fd)


def _init_process_group(spec: RankSpec) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    kwargs = {}
    if spec.pg_timeout_s:
        kwargs["timeout"] = datetime.timedelta(seconds=spec.pg_timeout_s)
    if spec.backend == "nccl":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    dist.init_process_group(spec.backend, init_method="env://", rank=spec.rank,
                            world_size=spec.world_size, **kwargs)


def _destroy_process_group() -> None:
    import torch.distributed as dist

    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - the result is sent already; exiting tears the rest down
        pass


def _report_error(messages_fd: int, phase: str) -> None:
    try:
        channel.send(messages_fd, ("error", describe_current_exception(phase)))
    except BaseException:  # noqa: BLE001 - the launcher is gone; the exit code still tells
        pass


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001
            pass
    os._exit(code)


class CallFunction:
    """The job of a launch: call fn(*args, **kwargs) once and send back what it returns.

    With rank_first (spawn, as torch.multiprocessing.spawn does), the call is fn(rank, *args, **kwargs).
    """

    def __init__(self, fn, args, kwargs, rank_first: bool = False):
        self.fn, self.args, self.kwargs, self.rank_first = fn, args, kwargs, rank_first

    def __call__(self, spec: RankSpec, pipes: RankPipes) -> None:
        args = (spec.rank, *self.args) if self.rank_first else self.args
        result = self.fn(*args, **self.kwargs)
        try:
            payload = channel.dumps(("ok", result))
        except Exception as exc:  # noqa: BLE001
            raise _in_phase(TypeError(
                f"rank {spec.rank} returned a {type(result).__name__} that cannot be pickled "
                f"({type(exc).__name__}: {exc}); return tensors, numbers, strings or containers of them"
            ), "returning") from None
        channel.write_frame(pipes.messages, payload)


def _in_phase(exc: BaseException, phase: str) -> BaseException:
    exc.rank_phase = phase
    return exc


def spawned_main() -> None:
    """Entry point of a spawned rank: its spec comes first on the control pipe."""
    pipes = RankPipes(stdout=1, stderr=2, **{
        name: int(value) for name, value in zip(
            ("messages", "control", "stacks"), os.environ.pop("COURSE_LIB_RANK_FDS").split(","))
    })
    for stream in (sys.stdout, sys.stderr):  # pipes are block-buffered by default
        stream.reconfigure(line_buffering=True, write_through=True)
    spec = channel.receive(pipes.control)
    run_rank(spec, pipes, forked=False)


if __name__ == "__main__":
    spawned_main()
