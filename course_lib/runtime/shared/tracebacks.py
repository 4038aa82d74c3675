"""Readable rank tracebacks and stack dumps: the learner's frames first, the launcher's left out.

Cell file names become the "Cell In[N]" names learners see in their own tracebacks.
"""
import os
import sys
import traceback

from .protocol import error_record

_RUNTIME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERNAL_FILES = {os.path.join(_RUNTIME, *name.split("/")) for name in (
    "rank/main.py", "rank/session_loop.py", "launcher/starter.py", "launcher/supervisor.py", "launcher/launch.py")}


WATCH_FILE = os.path.join(_RUNTIME, "rank", "last_call.py")
_RANK_MAIN_FILES = {os.path.join(_RUNTIME, "rank", name) for name in ("main.py", "session_loop.py")}


def describe_current_exception(phase: str) -> dict:
    """The current exception as plain data (the launcher may not be able to unpickle it).

    The launcher's own frames are left out: the traceback starts where the learner's code does.
    """
    kind, value, tb = sys.exc_info()
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in INTERNAL_FILES:
        tb = tb.tb_next
    described = traceback.TracebackException(kind, value, tb)
    # the wrapper that notes each collective for the diagnosis (rank.last_call) is not the learner's
    described.stack = traceback.StackSummary.from_list(
        [frame for frame in described.stack if frame.filename != WATCH_FILE])
    text = "".join(described.format())
    summary = "".join(traceback.format_exception_only(kind, value)).strip().splitlines()
    return error_record(phase, summary[-1] if summary else kind.__name__, notebook_friendly(text))


# What a rank is doing when its innermost Python frame is course_lib's own (a wait in C below it)
_INTERNAL_STEPS = {
    "free": "freeing the local variables your function left, after it returned",
    "_destroy_process_group": "in destroy_process_group(), after your function returned",
    "__call__": "calling your function, or in what it called from C",
}


def trim_stack_dump(text: str) -> str:
    """Cut each thread of a faulthandler dump (most recent call first) where the launcher begins.

    Below that point are the launcher's own frames and, in a forked rank, the notebook's stack.
    A thread whose innermost frame is already the launcher's keeps one line saying what it does.
    """
    kept, in_launcher, first_frame = [], False, False
    for line in text.splitlines():
        is_frame = line.strip().startswith("File ")
        if not is_frame:
            in_launcher, first_frame = False, True  # a new thread's header, or a blank line between threads
        elif any(f'"{name}"' in line for name in INTERNAL_FILES):
            if first_frame and not in_launcher:
                function = line.rsplit(" in ", 1)[-1].strip()
                step = _INTERNAL_STEPS.get(function, "in course_lib's rank code")
                kept.append(f"{line[:len(line) - len(line.lstrip())]}(course_lib: {step}; no Python "
                            f"frame of yours above it)")
            in_launcher = True
        if is_frame:
            first_frame = False
        if not in_launcher and f'"{WATCH_FILE}"' not in line:
            kept.append(line)
    return "\n".join(kept)


_WAITS = (("futex", "waits on a lock, a condition or a thread join (futex)"),
          ("epoll", "waits for socket or pipe I/O (epoll)"), ("poll", "waits for I/O (poll)"),
          ("select", "waits for I/O (select)"), ("pause", "waits for a signal (pause)"),
          ("nanosleep", "sleeps"), ("hrtimer", "sleeps"), ("pipe", "waits on a pipe"),
          ("wait4", "waits for a child process"), ("do_wait", "waits for a child process"),
          ("accept", "waits for a connection"), ("recv", "waits for data from a socket"))


def native_threads(pid: int) -> str:
    """Each thread of process `pid` as Linux shows it: its name and what the kernel says it waits in.

    Cheap (a few files in /proc, no debugger): what faulthandler cannot show for threads without
    a Python frame (gloo's, NCCL's, DataLoader pin-memory's). "" where /proc is not there.
    """
    base = f"/proc/{pid}/task"
    try:
        tids = sorted(os.listdir(base), key=int)
    except (OSError, ValueError):
        return ""
    rows = {}
    for tid in tids:
        try:
            name = _read(f"{base}/{tid}/comm").strip()
            state = _read(f"{base}/{tid}/stat").rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        try:
            wchan = _read(f"{base}/{tid}/wchan").strip()
        except OSError:
            wchan = ""
        if state == "R":
            what = "is running"
        else:
            what = next((words for key, words in _WAITS if key in wchan),
                        f"waits in the kernel's {wchan}" if wchan not in ("", "0") else "waits")
        label = f"{name} (main thread)" if tid == str(pid) else name
        rows[(label, what)] = rows.get((label, what), 0) + 1
    if not rows:
        return ""
    lines = ["Threads, as Linux shows them (threads of C++ code have no Python frame):"]
    lines += [f"  {label}{f' x{count}' if count > 1 else ''}: {what}" for (label, what), count in rows.items()]
    return "\n".join(lines)


def _read(path: str) -> str:
    with open(path) as file:
        return file.read()


_cell_names_of_the_kernel = {}  # a forked rank's copy: it leaves IPython, but its code came from cells


def keep_cell_names(shell) -> None:
    """Called in a forked rank before it leaves the kernel's IPython shell."""
    _cell_names_of_the_kernel.update(getattr(shell.compile, "_filename_map", {}))


def notebook_friendly(text: str) -> str:
    """Replace IPython's temporary cell file names with the "Cell In[N]" names learners see."""
    try:
        ipython = sys.modules["IPython"].get_ipython()
        names = ipython.compile._filename_map  # filename -> execution count
    except Exception:  # noqa: BLE001 - not in IPython
        names = _cell_names_of_the_kernel
    for filename, count in names.items():
        text = text.replace(f'File "{filename}"', f"Cell In[{count}]")
    return text


def place(filename: str, line) -> str:
    """Where a line of code is, as a learner names it: "Cell In[5], line 9" for a notebook cell,
    "train.py, line 9" for a file."""
    shown = notebook_friendly(f'File "{filename}"')
    return f"{os.path.basename(filename) if shown.startswith('File ') else shown}, line {line}"


def reaches_rank_code(stack: str) -> bool:
    """Whether faulthandler's dump (untrimmed) shows the rank's main thread down to the rank's own
    code: then its innermost frames, which come first, have arrived."""
    return any(f'"{name}"' in stack for name in _RANK_MAIN_FILES)


def innermost_frame(stack: str) -> str:
    """'all_reduce (distributed_c10d.py:2950)' from faulthandler's dump (untrimmed) of the rank's
    main thread: the thread that runs course_lib's rank code, else the one the signal landed on."""
    blocks = stack.split("\n\n")
    mains = [b for b in blocks if any(f'"{name}"' in b for name in _RANK_MAIN_FILES)]
    block = next(iter(mains), None) or next(
        (b for b in blocks if b.lstrip().startswith("Current thread")), blocks[0] if blocks else "")
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("File ") and " in " in line:
            location, function = line.rsplit(" in ", 1)
            if function in ("wrapper", "_fn", "inner"):
                continue
            path = location.split('"')[1] if '"' in location else location
            line_no = location.rsplit("line ", 1)[-1].strip(", ")
            cell = notebook_friendly(f'File "{path}"')
            where = f"{cell}, line {line_no}" if cell.startswith("Cell") else f"{path.rsplit('/', 1)[-1]}:{line_no}"
            return f"{function} ({where})"
    return ""
