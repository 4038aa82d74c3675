"""`spawn`: the drop-in for `torch.multiprocessing.spawn` in a notebook: `fn(rank, *args)` on each rank.

Code from the PyTorch tutorials runs as written, with launch's output relay, errors, timeouts and cleanup.
"""
from typing import Any, Callable, List, Optional

from .launch import run_ranks
from ..rank.main import CallFunction

__all__ = ["spawn"]


def spawn(fn: Callable, args: tuple = (), nprocs: int = 1, join: bool = True, daemon: bool = False,
          start_method: Optional[str] = None, *, backend: Optional[str] = None,
          timeout: Optional[float] = None, init_process_group: bool = False,
          output: str = "all", record_collectives: bool = True) -> List[Any]:
    """Run ``fn(rank, *args)`` on ranks 0 to ``nprocs - 1``; return ``[result of rank 0, ...]``.

    The call of ``torch.multiprocessing.spawn`` (``mp.spawn(fn, args=(world_size,),
    nprocs=world_size, join=True)``), except that:

    - ``fn`` may be defined in a notebook cell (torch's spawn cannot import it from there);
    - it returns each rank's result (torch returns None), and a failure raises one
      DistributedRunError (torch raises ProcessRaisedException or ProcessExitedException);
    - ``fn`` sets up its own process group, as tutorial code does (``init_process_group=False``):
      its own MASTER_ADDR/MASTER_PORT, a tcp:// URL, or the torchrun variables every rank also
      sees. Pass ``init_process_group=True`` for a ready group instead;
    - ``start_method=None`` forks where safe and spawns otherwise (torch always spawns);
    - ``join=False`` is refused: ranks never outlive the call (``daemon`` is accepted and changes
      nothing). For ranks that stay alive between cells, use DistributedSession.

    ``backend``, ``timeout``, ``output`` and ``record_collectives`` mean what they mean for
    ``launch``; so does the way a
    rank ends. With ``timeout=None`` (the default, as ``mp.spawn`` has none) a rank inside ``fn``
    may run as long as it needs, but a rank stuck after ``fn`` returned (freeing its variables)
    is stopped 30 s after its result and named in a DistributedRunError, whose ``.results`` holds
    what every rank returned: the call never hangs there.
    """
    if not join:
        raise ValueError("spawn(join=False): in a notebook, spawn waits for its ranks and returns "
                         "their results; use join=True, or DistributedSession for ranks that stay "
                         "alive between cells")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args={args!r}: give a tuple of the arguments after the rank, e.g. "
                        f"args=(world_size,) (note the comma), as for torch.multiprocessing.spawn")
    __tracebackhide__ = True  # pytest and IPython leave this frame out of a failure's traceback
    return run_ranks(CallFunction(fn, tuple(args), {}, rank_first=True), nprocs, backend, timeout,
                     init_process_group, output, start_method, who="spawn",
                     record_collectives=record_collectives)
