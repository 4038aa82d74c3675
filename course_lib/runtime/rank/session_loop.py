"""The rank side of a DistributedSession: keep a namespace and serve commands until closed.

Commands run code like a notebook cell (the last expression's value is returned), call
functions, and get or set names. A SIGINT interrupts the running command only; a command the
launcher cancelled before it started is not run.
"""
import ast
import builtins
import linecache
import pickle
import select
import signal

from ..shared import channel
from ..shared.protocol import ERROR, OK, RankPipes, RankSpec, error_record, unpicklable_result
from ..shared.tracebacks import describe_current_exception
from .collective_log import send_records


CLOSE = b"close"  # a frame that is not a pickle: the session ends
CANCEL = b"cancel"  # a frame after a command: do not start it (the launcher sends SIGINT too)


class SessionLoop:
    def __call__(self, spec: RankSpec, pipes: RankPipes) -> None:
        import torch
        import torch.distributed as dist

        self.namespace = {"__name__": "__main__", "__builtins__": builtins, "rank": spec.rank,
                          "world_size": spec.world_size, "torch": torch, "dist": dist}
        self.running = False
        self.control = pipes.control
        signal.signal(signal.SIGINT, self._on_interrupt)
        channel.send(pipes.messages, (OK, "ready"))
        while True:
            try:
                frame = channel.receive_frame(pipes.control)
            except EOFError:
                return  # the launcher closed the session (or died)
            if frame == CLOSE:
                return
            if frame == CANCEL:
                continue  # it came after its command had ended
            reply = self._reply(spec.rank, frame)
            if spec.record_collectives:
                send_records(pipes.messages)
            channel.write_frame(pipes.messages, reply)

    def _on_interrupt(self, signum, frame):
        # Only a running command is interrupted; a late SIGINT that finds the rank idle is dropped.
        if self.running:
            raise KeyboardInterrupt

    def _reply(self, rank: int, frame: bytes) -> bytes:
        phase = "unpickling"
        try:
            command = pickle.loads(frame)
            phase = "running"
            self.running = True
            try:
                if self._cancelled():
                    raise KeyboardInterrupt
                value = getattr(self, "_" + command[0])(*command[1:])
            finally:
                self.running = False
        except BaseException:  # noqa: BLE001 - every error goes back to the notebook
            self.running = False
            return channel.dumps((ERROR, describe_current_exception(phase)))
        try:
            return channel.dumps((OK, value))
        except Exception as exc:  # noqa: BLE001
            return channel.dumps((ERROR, error_record("returning", unpicklable_result(rank, value, exc))))

    def _cancelled(self) -> bool:
        """Whether the launcher cancelled this command before it started. It writes CANCEL, then
        sends SIGINT; a SIGINT that came before `running` was set was dropped, but the frame, read
        here once `running` is set, is not. Nothing else follows a command before its reply."""
        if not select.select([self.control], [], [], 0)[0]:
            return False
        self.running = False  # its SIGINT must not cut the frame in two: it is cancelled anyway
        try:
            return channel.receive_frame(self.control) == CANCEL
        finally:
            self.running = True

    def _exec(self, source: str, filename: str):
        """Run source like a cell: statements, then the value of a final expression."""
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        tree = ast.parse(source, filename)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, filename, "exec"), self.namespace)
        if last is not None:
            return eval(compile(ast.Expression(last.value), filename, "eval"), self.namespace)
        return None

    def _call(self, fn, args, kwargs):
        return fn(*args, **kwargs)

    def _pull(self, name: str):
        if name not in self.namespace:
            raise NameError(f"name {name!r} is not defined on rank {self.namespace['rank']}")
        return self.namespace[name]

    def _push(self, values: dict):
        self.namespace.update(values)
