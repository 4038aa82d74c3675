"""A forked rank lets go of the notebook kernel it was copied from: its output goes to its own pipes.

Nothing in a rank may reach the kernel's ZMQ sockets: not print, not logging, not a widget or a display.
"""
import io
import logging
import os
import sys

from ..shared.tracebacks import keep_cell_names

NOTE = ("[course_lib] a rank cannot send widgets or rich displays to the notebook (only the kernel can); "
        "this one was dropped. Print text instead, or use tqdm's text bars (tqdm.auto does so in a rank)\n")


def detach_from_kernel(stdout_fd: int, stderr_fd: int) -> None:
    """Point fds 1 and 2, sys.std*, the kernel's stream objects and logging at the rank's pipes."""
    kernel_streams = _unique([sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    for fd in (devnull, stdout_fd, stderr_fd):
        os.close(fd)
    sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
    sys.stdout = sys.__stdout__ = _text_stream(1)
    sys.stderr = sys.__stderr__ = _text_stream(2)
    _repoint_logging({id(s) for s in kernel_streams})
    _leave_ipython(kernel_streams)


def _text_stream(fd: int):
    return io.TextIOWrapper(open(fd, "wb", buffering=0, closefd=False), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True, write_through=True)


def _repoint_logging(kernel_stream_ids) -> None:
    """Logging handlers created in the notebook still hold the kernel's streams."""
    for logger in [logging.getLogger()] + list(logging.Logger.manager.loggerDict.values()):
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and id(handler.stream) in kernel_stream_ids:
                handler.stream = sys.stderr


def _leave_ipython(kernel_streams) -> None:
    """In a rank, get_ipython() is None (so tqdm.auto draws text, display() prints), and whatever
    still holds the kernel's objects (a saved sys.stdout, a widget) cannot send through them."""
    shell_class = sys.modules.get("IPython.core.interactiveshell")
    shell = shell_class.InteractiveShell._instance if shell_class else None
    if shell is None:
        return
    keep_cell_names(shell)
    type(shell).clear_instance()
    for stream in kernel_streams:  # ipykernel's OutStream: a write would go to the kernel by ZMQ
        if hasattr(stream, "pub_thread"):
            target = sys.stderr if getattr(stream, "name", "") == "stderr" else sys.stdout
            stream.write, stream.flush = target.write, target.flush
            stream.writelines = target.writelines
    drop = _dropped_once()
    kernel = getattr(shell, "kernel", None)
    for session in _unique([getattr(kernel, "session", None), getattr(shell.display_pub, "session", None)]):
        session.send = drop  # widgets, comms and displays all leave through a session
    for thread in _unique([getattr(kernel, "iopub_thread", None)] + [getattr(s, "pub_thread", None) for s in kernel_streams]):
        thread.send_multipart = thread.schedule = drop
    _text_progress_bars()


def _text_progress_bars() -> None:
    """tqdm.auto picks its widget bar wherever ipykernel is imported: in a rank, that class draws text."""
    if "ipykernel.zmqshell" not in sys.modules:
        return
    try:
        import tqdm.auto  # noqa: F401 - decided now, as it would be later, then changed below
        import tqdm.notebook as notebook
    except Exception:  # noqa: BLE001 - no tqdm, no ipywidgets: nothing draws widgets
        return
    for name in [n for n in vars(notebook.tqdm_notebook) if n not in ("__module__", "__doc__")]:
        delattr(notebook.tqdm_notebook, name)  # what is left is tqdm's own text bar


def _unique(objects) -> list:
    return list({id(o): o for o in objects if o is not None}.values())


def _dropped_once():
    said = []

    def drop(*args, **kwargs):
        if not said:
            said.append(True)
            sys.stderr.write(NOTE)

    return drop
