"""`launch`: run a function on N local processes from a notebook cell, and get their results.

Each rank gets torchrun's environment and a ready process group; failures come back as one error.
"""
import os
import sys
import time
import warnings
from typing import Any, Callable, List, Optional, Tuple

import cloudpickle

from ..shared import env
from ..shared.errors import DistributedRunError
from ..shared.output import OutputRelay
from . import starter
from .interrupts import interrupts_held
from .supervisor import RankSupervisor
from ..rank.main import CallFunction
from ..shared.protocol import RECORDER_ENTRIES, RECORDER_ENV, RankSpec
from .store import Rendezvous

__all__ = ["launch", "DistributedRunError"]


def launch(fn: Callable, *args, nprocs: int = 2, backend: Optional[str] = None,
           timeout: Optional[float] = None, init_process_group: bool = True, output: str = "all",
           start_method: Optional[str] = None, record_collectives: bool = True, **kwargs) -> List[Any]:
    """Run ``fn(*args, **kwargs)`` on ``nprocs`` processes; return ``[result of rank 0, ...]``.

    - ``fn`` may be defined in a notebook cell, a closure or a lambda.
    - Each rank sees RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as under torchrun;
      with ``init_process_group=True`` the default process group is ready when ``fn`` starts.
      With ``False``, ``fn`` calls ``init_process_group`` itself: env:// with these variables, its
      own MASTER_ADDR/MASTER_PORT, a tcp:// URL or explicit rank/world_size all work as under
      plain processes; a fixed port already in use fails at once, naming the port.
    - ``backend=None`` picks NCCL (rank r on cuda:r) when every rank can own a GPU, else gloo.
    - ``output``: "all" ranks' lines, "rank0" only, or "none"; each line labelled ``[rankN]``.
    - ``timeout`` (seconds): past it, every hung rank's stack is shown and all are stopped. It
      covers the whole run, each rank's exit included.
    - ``start_method``: None (fork where safe, else spawn), "fork" or "spawn".
    - ``record_collectives``: each rank keeps torch's record of its last 64 collectives (the flight
      recorder, ``TORCH_FR_BUFFER_SIZE``), so that a timeout, a failure or an interrupt says where
      the ranks parted: "collective #4 differs: rank 0 all_reduce float32[4], rank 1 broadcast
      float32[10]". ``False`` turns it off (``TORCH_FR_BUFFER_SIZE=0``), and a value of that variable
      you set yourself is kept.

    How a rank ends: it sends its result as soon as ``fn`` returns, before ``fn``'s local variables
    are freed; then it frees them (their destructors run, as after any return) and exits without
    the interpreter's shutdown. A process group that something still holds when
    ``destroy_process_group()`` lets go of it (a DDP model, say) lives until the rank exits, so
    DDP's Reducer never frees one: code that ends as the DDP tutorials do (``destroy_process_group()``
    with the model alive, then return) cannot hang in gloo's destructor (PyTorch issue 56297). A
    group nothing holds is freed there, as under torchrun. A rank must exit within 30 s of its
    result (``supervisor.EXIT_GRACE_S``), and by ``timeout`` when one is given. With
    ``timeout=None`` (the default) a rank still inside ``fn`` may run as long as it needs
    (interrupt the kernel to stop every rank), but one stuck after ``fn`` returned never hangs the
    call: it is stopped and reported.

    Raises DistributedRunError (a RuntimeError) naming every failed rank; no rank survives it,
    nor a KeyboardInterrupt. The stop button is never lost: pressed while ranks are forked,
    recorded or stopped, it is held back until that is done, then raised (interrupts.py). A rank
    stuck after ``fn`` returned is named as such, with what it was
    freeing, its stacks and its threads; the results that arrived are in the error's ``.results``.
    """
    __tracebackhide__ = True  # pytest and IPython leave this frame out of a failure's traceback
    return run_ranks(CallFunction(fn, args, kwargs), nprocs, backend, timeout, init_process_group,
                     output, start_method, who="launch", record_collectives=record_collectives)


def run_ranks(job: CallFunction, nprocs: int, backend: Optional[str], timeout: Optional[float],
              init_process_group: bool, output: str, start_method: Optional[str],
              who: str, record_collectives: bool = True) -> List[Any]:
    """Start the ranks on `job`, wait for every reply, stop them all: launch's and spawn's body."""
    __tracebackhide__ = True
    if not callable(job.fn):
        raise TypeError(f"{who} needs a function to run, got {type(job.fn).__name__}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout={timeout!r}: give a number of seconds above 0, or None")
    import_what_ranks_share(start_method)
    # From the first fork to the last rank stopped, the stop button is a flag: honoured where no
    # rank can be left behind (see interrupts.py)
    with interrupts_held() as interrupted:
        group, rendezvous = start_ranks(job, nprocs, backend, start_method, output,
                                        init_process_group, timeout, who, record_collectives)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            replies = group.collect(timeout=timeout, interrupted=interrupted)
            group.await_exits(replies, deadline, interrupted=interrupted)  # each rank frees what fn left, then exits
        finally:
            group.stop()  # after a failure, or a rank stuck as it ends: no rank survives
            rendezvous.close()
    return [replies[rank] for rank in range(nprocs)]


def import_what_ranks_share(start_method: Optional[str]) -> None:
    """The slow part of a first launch (seconds), before the stop button is held back: a learner
    who presses it then stops the import at once. Nothing runs yet that could be left behind."""
    if env.choose_start_method(start_method)[0] == "fork":
        starter.preload_for_fork()


def start_ranks(job, nprocs: int, backend: Optional[str], start_method: Optional[str], output: str,
                init_process_group: bool, pg_timeout_s: Optional[float],
                who: str, record_collectives: bool = True) -> Tuple[RankSupervisor, Rendezvous]:
    """Check the request, choose backend and start method, say so in one line, start the ranks."""
    if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
        raise ValueError(f"nprocs={nprocs!r}: need a whole number of processes, at least 1")
    relay = OutputRelay(output)
    backend, backend_why = env.choose_backend(nprocs, backend)
    method, _ = env.choose_start_method(start_method)
    cores = env.cpu_cores()
    if nprocs > cores:
        warnings.warn(f"{nprocs} ranks on {cores} CPU cores: the ranks take turns on the cores, so "
                      f"results are right but timings are not meaningful", RuntimeWarning,
                      stacklevel=_first_caller_outside_the_library())
    job_bytes = None if method == "fork" else _pickle_job(job)
    if output != "none":
        sys.stdout.write(f"{who}: {nprocs} rank{'s' if nprocs != 1 else ''}, backend {backend} "
                         f"({backend_why}), start method {method}\n")  # one write: one output chunk
        sys.stdout.flush()
    rendezvous = Rendezvous(nprocs)
    # torch records collectives by default (2000 entries since 2.5 for NCCL; gloo too on newer torch):
    # 64 keep a rank's report small, 0 turns recording off; a value the user set is theirs
    recorder = {} if os.environ.get(RECORDER_ENV) else {RECORDER_ENV: str(RECORDER_ENTRIES if record_collectives else 0)}
    specs = [RankSpec(rank=rank, world_size=nprocs, backend=backend,
                      init_process_group=init_process_group,
                      threads=env.threads_per_rank(nprocs, method), parent_pid=os.getpid(),
                      env={**rendezvous.environment(rank, method), **recorder}, sys_path=list(sys.path),
                      job=job if method == "fork" else None, pg_timeout_s=pg_timeout_s,
                      record_collectives=record_collectives)
             for rank in range(nprocs)]
    try:
        supervisor = RankSupervisor(specs, method, relay, job_bytes)
    except BaseException:
        rendezvous.close()
        raise
    try:
        rendezvous.serve()  # after every rank was forked: see Rendezvous.serve
    except BaseException:
        supervisor.stop()
        rendezvous.close()
        raise
    return supervisor, rendezvous


def _first_caller_outside_the_library() -> int:
    """The stacklevel that points a warning at the learner's line, however deep the call came
    (through a session, or through IPython running a %%distributed cell)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").partition(".")[0] in ("course_lib", "IPython"):
        frame, level = frame.f_back, level + 1
    return level


def _pickle_job(job) -> bytes:
    try:
        return cloudpickle.dumps(job)
    except Exception as exc:
        raise TypeError(f"start_method='spawn' sends the function and its arguments to each rank by "
                        f"pickling them, and this failed: {type(exc).__name__}: {exc}. Pass picklable "
                        f"arguments (tensors, numbers, containers), or use start_method='fork'") from exc
