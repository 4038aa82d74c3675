"""The `%%distributed` cell magic: run a notebook cell on every rank of a DistributedSession.

`%load_ext course_lib`, then `%%distributed -n 2` on a cell; `%distributed stop` ends the session.
"""
from typing import Optional

from IPython.core import magic_arguments
from IPython.core.error import UsageError

from ..shared.output import OUTPUT_MODES
from .session import DistributedSession

_session: Optional[DistributedSession] = None


def current_session() -> Optional[DistributedSession]:
    """The session that `%%distributed` cells run on (None before the first one)."""
    return _session if _session is not None and not _session.closed else None


def stop_session() -> None:
    global _session
    if _session is not None:
        _session.close()
        _session = None


@magic_arguments.magic_arguments()
@magic_arguments.argument("action", nargs="?", choices=["stop", "status"],
                          help="line form only: `%%distributed stop` ends the session, `status` shows it")
@magic_arguments.argument("-n", "--nprocs", type=int, default=None,
                          help="ranks (default: the running session's, or 2)")
@magic_arguments.argument("--backend", default=None, help="nccl or gloo (default: chosen for you)")
@magic_arguments.argument("--timeout", type=float, default=None,
                          help="seconds; past it, each rank's stack is shown and the ranks restart")
@magic_arguments.argument("--output", default="all", choices=OUTPUT_MODES, help="whose output to show")
def distributed(line: str, cell: Optional[str] = None):
    """Run the cell on every rank of a persistent session (rank, world_size, torch, dist predefined)."""
    __tracebackhide__ = True  # pytest and IPython leave this frame out of a failure's traceback
    args = magic_arguments.parse_argstring(distributed, line)
    if cell is None:
        return _line(args)
    if args.action:
        raise UsageError(f"`{args.action}` is for the line form: %distributed {args.action}")
    values = _session_for(args).run(cell, timeout=args.timeout)
    for rank, value in enumerate(values):
        if value is not None:
            print(f"[rank{rank}] {value!r}")


def _line(args) -> None:
    if args.action == "stop":
        if current_session() is None:
            print("distributed: no session is running")
        stop_session()
    elif args.action == "status":
        session = current_session()
        print(f"distributed: {session.nprocs} ranks running" if session else "distributed: no session is running")
    else:
        raise UsageError("use %%distributed -n N on a cell, or %distributed stop | status")


def _session_for(args) -> DistributedSession:
    """Reuse the running session when it fits the request, else start a new one."""
    global _session
    session = current_session()
    nprocs = args.nprocs or (session.nprocs if session else 2)
    wanted = (nprocs, args.backend or (session.backend if session else None), args.output)
    if session is not None and (session.nprocs, session.backend, session.output) != wanted:
        print(f"distributed: stopping the {session.nprocs}-rank session to start the one asked for")
        stop_session()
        session = None
    if session is None:
        _session = session = DistributedSession(nprocs=nprocs, backend=args.backend, output=args.output)
    return session


def register(ipython) -> None:
    ipython.register_magic_function(distributed, magic_kind="line_cell", magic_name="distributed")
