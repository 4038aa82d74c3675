"""Readable rank tracebacks and stack dumps: the learner's frames first, the launcher's left out.

Cell file names become the "Cell In[N]" names learners see in their own tracebacks.
"""
import os
import sys
import time
import traceback

INTERNAL_FILES = {os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
                  for name in ("rank_process.py", "rank_start.py", "rank_group.py", "launch.py", "session_rank.py")}


def describe_current_exception(phase: str) -> dict:
    """The current exception as plain data (the launcher may not be able to unpickle it).

    The launcher's own frames are left out: the traceback starts where the learner's code does.
    """
    kind, value, tb = sys.exc_info()
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in INTERNAL_FILES:
        tb = tb.tb_next
    text = "".join(traceback.format_exception(kind, value, tb))
    summary = "".join(traceback.format_exception_only(kind, value)).strip().splitlines()
    return {"phase": phase, "summary": summary[-1] if summary else kind.__name__,
            "traceback": notebook_friendly(text), "when": time.time()}


def trim_stack_dump(text: str) -> str:
    """Cut each thread of a faulthandler dump (most recent call first) where the launcher begins.

    Below that point are the launcher's own frames and, in a forked rank, the notebook's stack.
    """
    kept, in_launcher = [], False
    for line in text.splitlines():
        is_frame = line.strip().startswith("File ")
        if not is_frame:
            in_launcher = False  # a new thread's header, or a blank line between threads
        elif any(f'"{name}"' in line for name in INTERNAL_FILES):
            in_launcher = True
        if not in_launcher:
            kept.append(line)
    return "\n".join(kept)


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


def innermost_frame(stack: str) -> str:
    """'all_reduce (distributed_c10d.py:2950)' from faulthandler's dump of the current thread."""
    blocks = stack.split("\n\n")
    block = next((b for b in blocks if b.lstrip().startswith("Current thread")), blocks[0] if blocks else "")
    for line in block.splitlines():
        line = line.strip()
        if line.startswith("File ") and " in " in line:
            location, function = line.rsplit(" in ", 1)
            if function in ("wrapper", "_fn", "inner"):
                continue
            filename = location.split('"')[1].rsplit("/", 1)[-1] if '"' in location else location
            line_no = location.rsplit("line ", 1)[-1].strip(", ")
            return f"{function} ({filename}:{line_no})"
    return ""
