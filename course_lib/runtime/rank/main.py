"""The rank side of a launch: set up one rank's process, run its job, report back, exit.

The same steps run in a forked child and in a spawned interpreter (`python -c` calling
`spawned_main()`, see launcher.starter.SPAWNED_MAIN).

How a rank ends: its result is sent before the function's local variables are freed; then they
are freed (their destructors run, as after any return) and the process ends with os._exit, without
the interpreter's shutdown. A process group that DDP's Reducer would free lives until that exit
(see `keep_process_groups`): freed that way, a gloo group can deadlock, as tutorial code does.
"""
import faulthandler
import os
import signal
import sys
import time

from ..shared import channel
from ..shared.protocol import ERROR, EXITING, OK, RENDEZVOUS, RankPipes, RankSpec, unpicklable_result
from .collective_log import answer_requests, mark_start, send_records
from .last_call import watch as watch_collectives
from .detach import detach_from_kernel
from ..shared.tracebacks import describe_current_exception
from .own_rendezvous import follow_user_rendezvous


def run_rank(spec: RankSpec, pipes: RankPipes, forked: bool) -> None:
    """Never returns: the process exits when its job is done."""
    code = 1
    try:
        mark_start()
        _detach_from_launcher_signals(spec.parent_pid)
        if spec.record_collectives:
            answer_requests(pipes.messages)
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
        keep_process_groups()
        phase = "unpickling"
        job = spec.job if spec.job is not None else _receive_job(spec, pipes.control)
        phase = "init_process_group"
        if spec.init_process_group:
            _init_process_group(spec)
        else:  # the user's code sets up its own process group, wherever it chooses
            follow_user_rendezvous(lambda where: channel.send(pipes.messages, (RENDEZVOUS, where)))
        phase = "running"
        if spec.last_call_path:
            watch_collectives(spec.last_call_path)
        job(spec, pipes)
        if spec.init_process_group:
            _note_exit_step(pipes.messages, {"step": "destroy_process_group"})
            _destroy_process_group()
        return 0
    except BaseException:  # noqa: BLE001
        if spec.record_collectives and phase != "startup":
            send_records(pipes.messages)
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


_REGISTERED = {}       # name -> every process group torch registered in this rank, until it unregisters it
_KEPT_UNTIL_EXIT = []  # groups still held by something when destroyed: freed only by the process's exit


def keep_process_groups() -> None:
    """Make sure DDP's Reducer never frees a process group: a group still held by something when
    destroy_process_group() lets go of it (a DDP model, a variable) lives until the rank exits.

    Why: freeing a gloo group joins gloo's worker threads, and one of them may need the GIL: each
    all-reduce keeps the thread-local state of the backward pass that started it, which holds a
    Python object (the autograd context), and the worker that drops the last all-reduce of a
    backward lets go of it. Freed from Python, a group releases the GIL first (its binding does);
    freed by DDP's Reducer (a C++ object freed under the GIL) it does not, and the two threads wait
    for each other forever (pytorch/pytorch#56297). Tutorial code does just that: it calls
    destroy_process_group() while the DDP model is alive, then returns, and as the model is freed
    its Reducer drops the group's last reference, a fraction of a millisecond after the last
    backward (a waiting thread gets the GIL only after 5 ms, Python's switch interval).

    Under torchrun that code does not hang by luck: DDP's constructor imports torch.distributed.nn,
    whose functions keep the default group as a default argument when it comes after
    init_process_group. A rank forked from a kernel that imported torch._dynamo (preload_for_fork
    does, so that DDP starts fast) has it before, and lost that reference; so would any process
    that imports it, or torch._dynamo, first.

    A group nothing else holds is freed by destroy_process_group() as usual (its threads end
    there, as lesson 04 shows). torch registers groups by name through distributed_c10d's
    `_register_process_group` and `_unregister_process_group` / `_unregister_all_process_groups`
    (torch 2.8 to 2.15, the tested range); without the latter, every group lives until the exit,
    and without the former nothing changes (a rank stuck as it ends is still reported, see
    launcher/supervisor.RankSupervisor.await_exits).
    """
    try:
        import torch.distributed.distributed_c10d as c10d
    except ImportError:  # a torch without distributed
        return
    register = getattr(c10d, "_register_process_group", None)
    if register is None or getattr(register, "keeps_groups", False):
        return

    def register_and_keep(group_name, group, *args, **kwargs):
        _REGISTERED[group_name] = group
        return register(group_name, group, *args, **kwargs)

    register_and_keep.keeps_groups = True
    c10d._register_process_group = register_and_keep
    unregister = getattr(c10d, "_unregister_process_group", None)
    if unregister is not None:
        def unregister_and_release(group_name, *args, **kwargs):
            result = unregister(group_name, *args, **kwargs)
            _release([group_name], sys._getframe(1))
            return result

        c10d._unregister_process_group = unregister_and_release
    unregister_all = getattr(c10d, "_unregister_all_process_groups", None)
    if unregister_all is not None:
        def unregister_all_and_release(*args, **kwargs):
            result = unregister_all(*args, **kwargs)
            _release(list(_REGISTERED), sys._getframe(1))
            return result

        c10d._unregister_all_process_groups = unregister_all_and_release


def _release(names, torch_frame) -> None:
    """Let torch free the groups it unregistered, unless something else still holds them."""
    for name in names:
        group = _REGISTERED.pop(name, None)
        if group is not None and _held_outside_torch(group, torch_frame):
            _KEPT_UNTIL_EXIT.append(group)
        del group


def _held_outside_torch(group, frame) -> bool:
    """Whether anything but torch.distributed's running code (the frames from `frame` up) holds the
    group: a DDP model (whose Reducer would then free it), a torch.distributed.nn default, a variable."""
    known = 3  # getrefcount's argument, this function's parameter, the caller's variable
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torch.distributed"):
        local_values = frame.f_locals
        copies = sum(value is group for value in local_values.values())
        # up to Python 3.12 f_locals is a dict the frame keeps, holding a second reference to each
        known += copies * (2 if type(local_values) is dict else 1)
        frame = frame.f_back
    return sys.getrefcount(group) > known


def _note_exit_step(messages_fd: int, step: dict) -> None:
    """Tell the launcher what this rank does after its result: named if the rank gets stuck there."""
    try:
        channel.send(messages_fd, (EXITING, dict(step, when=time.time())))
    except BaseException:  # noqa: BLE001 - the launcher is gone; the exit code still tells
        pass


def _report_error(messages_fd: int, phase: str) -> None:
    try:
        channel.send(messages_fd, (ERROR, describe_current_exception(phase)))
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
        callee = CalleeFrame()
        with callee:
            result = self.fn(*args, **self.kwargs)
        try:
            payload = channel.dumps((OK, result))
        except Exception as exc:  # noqa: BLE001
            message = unpicklable_result(spec.rank, result, exc).removeprefix("TypeError: ")
            raise _in_phase(TypeError(message), "returning") from None
        del result
        if spec.record_collectives:
            send_records(pipes.messages)
        channel.write_frame(pipes.messages, payload)
        # The work is reported: now free what the function left, as its return would have.
        _note_exit_step(pipes.messages, {"step": "freeing", "locals": callee.describe_locals()})
        callee.free()


class CalleeFrame:
    """Keeps the frame of the function called inside `with`, so its locals outlive its return.

    CPython frees a function's local variables as it returns, unless something holds the frame
    object: then they move into it. A profile hook that removes itself at the first call (one
    event, no cost to the function) takes that reference. So the rank sends its result before the
    locals are freed: a destructor that never finishes (a DDP model freeing its process group) can
    no longer lose the work, and the launcher knows the function returned and what was being freed.
    """

    def __init__(self):
        self.frame = None
        self._caller_code = None
        self._previous = None

    def __enter__(self):
        self._caller_code = sys._getframe(1).f_code
        self._previous = sys.getprofile()
        sys.setprofile(self._on_event)
        return self

    def _on_event(self, frame, event, arg):
        # the first Python frame called from the `with` block: the function, or its first Python
        # layer (the frame of a functools.partial's function, of a callable object's __call__)
        if event == "call" and frame.f_back is not None and frame.f_back.f_code is self._caller_code:
            self.frame = frame
            sys.setprofile(self._previous)

    def __exit__(self, *exc_info):
        if sys.getprofile() == self._on_event:
            sys.setprofile(self._previous)
        return False

    def describe_locals(self, limit: int = 12) -> list:
        """[(name, type name), ...] of the finished function's local variables, without repr(); its
        arguments and closure variables are left out (the caller and the enclosing scope hold them)."""
        if self.frame is None:
            return []
        try:
            code = self.frame.f_code
            arguments = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount
                                         + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)]
            others = set(arguments) | set(code.co_freevars)  # held by the caller, or the enclosing scope
            snapshot = self.frame.f_locals
            described = [(name, type(value).__name__) for name, value in snapshot.items()
                         if name not in others][:limit]
            if type(snapshot) is dict:  # Python < 3.13 caches this dict in the frame: drop its references
                snapshot.clear()
            return described
        except Exception:  # noqa: BLE001 - a description is a courtesy
            return []

    def free(self) -> None:
        """Free the local variables now, in the order Python frees them at a return."""
        frame, self.frame = self.frame, None
        if frame is not None:
            try:
                frame.clear()
            except RuntimeError:  # still executing: a generator's frame, say; dropping it is enough
                pass


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
