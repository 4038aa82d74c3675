"""Where a grader meets the learner's code: every run of learner code crosses here.

In a notebook a crossing just runs. In class grading (authoring/) the same grader runs twice: once
in the sandbox beside the learner's code, where each crossing's outcome is recorded, and once
outside, where no learner code runs: each crossing returns the recorded outcome instead, and the
grader's own comparisons decide the verdict. So what crosses must be plain data (see `plain`), and
no comparison may happen on the learner's side of a crossing. record.py holds the two modes.

grading_seed(base)   the seed of the data a grader feeds the learner's code: `base` in a notebook,
                     shifted by an offset drawn at class-grading time, the same in both runs
crossing(key, run)   run() is learner code (or grader code around it, in the learner's process):
                     its value (or GradingError / NotImplementedError) is an outcome to record
plain(value)         value itself when it is plain data, else TypeError naming the first part
                     that is not (with COURSE_STRICT_CROSSINGS=1 every crossing checks it)
"""
import contextvars
import os

PLAIN_SCALARS = (type(None), bool, int, float, str, bytes)
STRICT_VARIABLE = "COURSE_STRICT_CROSSINGS"
RECORD_VARIABLE = "COURSE_GRADING_RECORD"       # class grading, in the sandbox: record to this file
SEED_VARIABLE = "COURSE_GRADING_SEED_OFFSET"    # class grading: the offset drawn for a submission

# per thread of the judge (a class graded --jobs N replays N submissions at once); the defaults are
# the notebook's: no mode and offset 0, or what class grading put in the kernel's environment
_seed_offset = contextvars.ContextVar("grading_seed_offset", default=0)
_mode = contextvars.ContextVar("grading_mode", default=None)  # record.Recorder or record.Replayer


def grading_seed(base: int) -> int:
    """The seed a grader uses for the data it feeds the learner's code."""
    return base + _seed_offset.get()


def crossing(key: str, run):
    """run()'s value: learner code, or grader code in the learner's process around it."""
    mode = _mode.get()
    if mode is not None:
        return mode.cross(key, run)
    value = run()
    if os.environ.get(STRICT_VARIABLE) == "1":
        plain(value, key)
    return value


def current_mode():
    """The recorder or replayer in force here (record.py), or None in a notebook."""
    return _mode.get()


def plain(value, where: str = "value"):
    """`value` if it is plain data: None, bool, int, float, str, bytes, torch tensors, dtypes and
    Sizes, and lists, tuples and dicts (keys str or int) of them; TypeError otherwise."""
    import torch

    if isinstance(value, PLAIN_SCALARS) or isinstance(value, (torch.dtype, torch.Size)):
        return value
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and not isinstance(value, torch.nn.Parameter):
            raise TypeError(f"{where} is a {type(value).__name__}, not a plain tensor")
        return value
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        for index, item in enumerate(value):
            plain(item, f"{where}[{index}]")
        return value
    if type(value) is dict:
        for name, item in value.items():
            if not isinstance(name, (str, int)) or isinstance(name, bool):
                raise TypeError(f"{where} has a key {name!r} that is not a str or an int")
            plain(item, f"{where}[{name!r}]")
        return value
    raise TypeError(f"{where} is a {type(value).__module__}.{type(value).__qualname__}, not plain data "
                    f"(numbers, strings, tensors, and lists, tuples and dicts of them)")


def _from_environment() -> None:
    """Class grading's kernel: the seed offset (kept in the environment: ranks draw data with it
    too), and the recorder when a record file is asked for (taken out of the environment, so that
    processes started later, ranks or the learner's, do not record too)."""
    global _seed_offset, _mode
    offset = os.environ.get(SEED_VARIABLE)
    if offset is not None:
        _seed_offset = contextvars.ContextVar("grading_seed_offset", default=int(offset))
    path = os.environ.pop(RECORD_VARIABLE, None)
    if path:
        from .record import Recorder

        _mode = contextvars.ContextVar("grading_mode", default=Recorder(path))


_from_environment()
