"""`DistributedSession`: ranks that stay alive between cells, each keeping its own namespace.

Build a model on every rank in one cell, wrap it in DDP in the next, look at gradients in a third.
"""
import atexit
import contextlib
import os
import signal
import weakref
from typing import Any, List, Optional

from ..shared import channel
from ..shared.errors import DistributedRunError
from .interrupts import interrupts_held
from .launch import import_what_ranks_share, start_ranks
from ..rank.session_loop import CANCEL, CLOSE, SessionLoop

_open_sessions = weakref.WeakSet()


class DistributedSession:
    """Persistent ranks with the process group initialised once.

    >>> with DistributedSession(nprocs=2) as s:
    ...     s.run("x = torch.ones(2) * (rank + 1); dist.all_reduce(x); x")
    [tensor([3., 3.]), tensor([3., 3.])]

    Every rank predefines ``rank``, ``world_size``, ``torch`` and ``dist``. An error on any rank
    raises DistributedRunError and the session stays usable; past ``timeout``, or when a failure
    leaves other ranks stuck, the ranks are restarted (their names are lost) and the session goes on.
    """

    def __init__(self, nprocs: int = 2, backend: Optional[str] = None, start_method: Optional[str] = None,
                 output: str = "all", timeout: Optional[float] = None, startup_timeout: float = 120.0,
                 record_collectives: bool = True):
        self.nprocs, self.backend, self.start_method = nprocs, backend, start_method
        self.record_collectives = record_collectives
        self.output, self.timeout, self.startup_timeout = output, timeout, startup_timeout
        self._group = self._rendezvous = None
        self._cells = 0
        try:
            self._start()
            _open_sessions.add(self)
        except BaseException:  # a Ctrl-C as the ranks started (raised once they all had): stop them
            self._stop()
            raise

    # -- the public API ----------------------------------------------------------------------
    def run(self, code_or_function, *args, timeout: Optional[float] = None, **kwargs) -> List[Any]:
        """Run code (like a cell: returns each rank's last expression) or call a function on every rank."""
        __tracebackhide__ = True  # pytest and IPython leave this frame out of a failure's traceback
        if isinstance(code_or_function, str):
            self._cells += 1
            command = ("exec", code_or_function, f"<distributed cell {self._cells}>")
        elif callable(code_or_function):
            command = ("call", code_or_function, args, kwargs)
        else:
            raise TypeError(f"run needs code (a str) or a function, got {type(code_or_function).__name__}")
        return self._request(command, timeout)

    def pull(self, name: str, timeout: Optional[float] = None) -> List[Any]:
        """Every rank's value of `name`: [value on rank 0, value on rank 1, ...]."""
        __tracebackhide__ = True
        return self._request(("pull", name), timeout)

    def push(self, timeout: Optional[float] = None, **values) -> None:
        """Set names on every rank, e.g. ``s.push(lr=0.1, data=tensor)``."""
        __tracebackhide__ = True
        self._request(("push", values), timeout)

    @property
    def closed(self) -> bool:
        return self._group is None

    def close(self) -> None:
        """Stop the ranks; the session cannot be used afterwards."""
        if self._group is None:
            return
        with interrupts_held():  # every rank is told, then stopped; a Ctrl-C comes after
            for rank in range(self.nprocs):
                with contextlib.suppress(OSError):
                    self._group.send(rank, CLOSE)
            self._stop(wait_for_exit=5.0)
            _open_sessions.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"{self.nprocs} ranks"
        return f"<DistributedSession {state}>"

    # -- running commands ----------------------------------------------------------------------
    def _start(self) -> None:
        import_what_ranks_share(self.start_method)
        with interrupts_held() as interrupted:  # a Ctrl-C as ranks start stops them all
            self._group, self._rendezvous = start_ranks(
                SessionLoop(), self.nprocs, self.backend, self.start_method, self.output,
                init_process_group=True, pg_timeout_s=None, who="session",
                record_collectives=self.record_collectives)
            self._group.explain_interrupts = False  # an interrupt stops the command, not the ranks
            try:
                self._group.collect(timeout=self.startup_timeout, interrupted=interrupted)  # each says "ready"
            except BaseException:
                self._stop()
                raise

    def _stop(self, wait_for_exit: float = 0.0) -> None:
        group, self._group = self._group, None
        if group is not None:
            group.stop(wait_for_exit=wait_for_exit)
        if self._rendezvous is not None:
            self._rendezvous.close()
            self._rendezvous = None

    def _restart(self, why: str) -> None:
        print(f"session: {why}; restarting the {self.nprocs} ranks: names defined on them are lost",
              flush=True)
        self._stop()
        self._start()

    def _request(self, command, timeout: Optional[float]) -> List[Any]:
        __tracebackhide__ = True
        if self._group is None:
            raise RuntimeError("this DistributedSession is closed; start a new one")
        try:
            payload = channel.dumps(command)
        except Exception as exc:
            raise TypeError(f"could not send this to the ranks: {type(exc).__name__}: {exc}") from exc
        timeout = self.timeout if timeout is None else timeout
        # A Ctrl-C is a flag that `collect` polls: every rank gets the command, pipes are never left
        # half-read, and one that comes as the command ends is raised after it (interrupts.py)
        with interrupts_held() as interrupted:
            for rank in range(self.nprocs):
                self._group.send(rank, payload)
            try:
                replies = self._group.collect(timeout=timeout, interrupted=interrupted)
            except DistributedRunError as error:
                if _stuck(error):
                    self._restart("some ranks were stuck or gone")
                raise
            except KeyboardInterrupt as interrupt:
                self._interrupt_ranks(getattr(interrupt, "answered", ()))
                raise
            finally:
                self._end_cell_output()
        return [replies[rank] for rank in range(self.nprocs)]

    def _end_cell_output(self) -> None:
        """What the ranks wrote before replying belongs to this cell; a progress line ends with it."""
        if self._group is not None:
            self._group.pump(0)
            self._group.relay.end_live()

    def _interrupt_ranks(self, answered=(), grace: float = 3.0) -> None:
        """Interrupt the command on every rank that has not `answered` it yet (the others wait for
        the next one: their reply is in); restart ranks that do not stop in time.

        Each rank gets CANCEL first, then SIGINT: one that had not started the command yet (it
        drops a SIGINT between commands) skips it; one running it stops."""
        busy = [handle for handle in self._group.handles if handle.rank not in answered]
        for handle in busy:
            with contextlib.suppress(OSError):
                self._group.send(handle.rank, CANCEL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(handle.pid, signal.SIGINT)
        try:
            self._group.collect([handle.rank for handle in busy], timeout=grace, failure_grace=grace)
        except DistributedRunError as error:
            if _stuck(error):
                self._restart("ranks did not stop on the interrupt (blocked in a collective?)")


def _stuck(error: DistributedRunError) -> bool:
    """Whether some ranks hung or died, so that only a restart makes the session usable again."""
    return error.timed_out or any(f.phase in ("hung", "exit") for f in error.failures.values())


@atexit.register
def _close_open_sessions() -> None:
    for session in list(_open_sessions):
        with contextlib.suppress(Exception):
            session.close()
