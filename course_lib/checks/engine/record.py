"""The two modes of class grading (boundary.py): the Recorder beside the learner's code writes each
check's arguments and each crossing's outcome; the Replayer hands those outcomes back to the grader
in the judge, where no learner code runs. `replay_check` is the judge's verdict on one check.
"""
import builtins
import contextlib
from dataclasses import dataclass

from . import boundary
from .crossing_data import CrossingDataError, GraderOutsideCrossing, decode, encode
from .record_file import write_record
from .verdicts import GradingError

ERROR_FIELDS = ("what", "expected", "got", "hint", "details", "exercise")
MISMATCH = "the recorded run does not match the check"


class RecordMismatch(BaseException):
    """The record lacks, adds or reorders an outcome the grader asks for. A BaseException, so
    that no grader's `except Exception` turns it into a verdict of its own."""


class RecordedError(RuntimeError):
    """An exception other than a verdict came out of a crossing in the learner's process."""


def outcome_of(key: str, run) -> tuple:
    """(outcome, value, error): run() called, what happened as a record's outcome."""
    blank = {"key": key, "kind": "value", "value": ("v", None), "fields": {}, "type": "", "message": ""}
    try:
        value = run()
    except GradingError as error:
        fields = {name: str(getattr(error, name, "") or "") for name in ERROR_FIELDS}
        return dict(blank, kind="grading_error", fields=fields), None, error
    except NotImplementedError as error:
        return dict(blank, kind="not_implemented", message=str(error)[:2000]), None, error
    except Exception as error:
        return dict(blank, kind="error", type=_exception_name(error), message=str(error)[:2000]), None, error
    try:
        return dict(blank, value=encode(value, key)), value, None
    except TypeError as error:  # the grader let something that is not data cross
        return dict(blank, kind="error", type="TypeError", message=f"not plain data: {error}"), value, None


class Recorder:
    """Record mode, in the learner's kernel: each outermost check call and its crossings, written
    to `path` (record_file.py) as each check ends."""

    def __init__(self, path):
        self.path, self.checks, self.current, self.depth = path, [], None, 0

    @contextlib.contextmanager
    def check(self, grader, args, kwargs):
        self.depth += 1
        if self.depth > 1:  # a grader calling another: one check
            try:
                yield
            finally:
                self.depth -= 1
            return
        self.current = _check_entry(grader, args, kwargs)
        self.checks.append(self.current)
        try:
            yield
            self.current["verdict"] = "passed"
        except BaseException as error:
            self.current["verdict"] = f"{type(error).__name__}: {error}"[:2000]
            raise
        finally:
            self.current["complete"], self.current, self.depth = True, None, self.depth - 1
            self.flush()

    def cross(self, key, run):
        if self.current is None or self.current.get("inside"):
            return run()  # outside a check, or inside an outer crossing: not an outcome of its own
        self.current["inside"] = True
        try:
            outcome, value, error = outcome_of(key, run)
        finally:
            del self.current["inside"]
        self.current["outcomes"].append(outcome)
        if error is not None:
            raise error
        return value

    def flush(self) -> None:
        if self.path:
            write_record(self.path, boundary.grading_seed(0), self.checks)


def _check_entry(grader, args, kwargs) -> dict:
    entry = {"grader": f"{grader.__module__}.{grader.__qualname__}", "exercise": grader.exercise,
             "args": [], "kwargs": [], "argument_problem": "", "outcomes": [], "complete": False,
             "verdict": ""}
    try:
        entry["args"] = [encode(value, f"argument {index + 1}", callables=True)
                         for index, value in enumerate(args)]
        entry["kwargs"] = [[str(name), encode(value, f"argument {name}", callables=True)]
                           for name, value in kwargs.items()]
    except TypeError as error:
        entry["argument_problem"] = str(error)[:500]
    return entry


class Replayer:
    """Replay mode, in the judge: each crossing returns (or raises) the next recorded outcome."""

    replays = True

    def __init__(self, outcomes):
        self.outcomes, self.next = list(outcomes), 0

    @contextlib.contextmanager
    def check(self, grader, args, kwargs):
        yield

    def cross(self, key, run):
        if self.next >= len(self.outcomes):
            raise RecordMismatch(f"the check asks for `{key}`, which the record lacks")
        outcome = self.outcomes[self.next]
        self.next += 1
        if outcome["key"] != key:
            raise RecordMismatch(f"the check asks for `{key}`, the record holds `{outcome['key']}`")
        return _replayed(outcome)


def _replayed(outcome):
    kind = outcome["kind"]
    if kind == "value":
        try:
            return decode(outcome["value"])
        except CrossingDataError as error:
            raise RecordMismatch(f"a recorded value is not data: {error}") from None
    if kind == "grading_error":
        fields = outcome["fields"]
        error = GradingError(*(fields.get(name, "") for name in ERROR_FIELDS[:5]))
        if fields.get("exercise"):
            error.exercise = fields["exercise"]
        raise error
    if kind == "not_implemented":
        raise NotImplementedError(outcome["message"])
    raise _builtin_error(outcome["type"], outcome["message"])


def _exception_name(error) -> str:
    kind = type(error)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _builtin_error(name: str, message: str) -> Exception:
    """A builtin exception (ValueError, ...) as itself, for graders that expect one; any other as
    a RecordedError that names it."""
    kind = getattr(builtins, name, None) if name.isidentifier() else None
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, GradingError):
        try:
            return kind(message)
        except Exception:
            pass
    return RecordedError(f"{name}: {message}")


@dataclass
class Verdict:
    """The judge's verdict on one check: passed, or the message a learner reads."""

    passed: bool
    message: str = ""
    grader_fault: bool = False  # the grader, not the learner, failed: the instructor should look


def replaying(outcomes, seed_offset: int):
    """Replay mode for this thread (and its context) while the block runs."""
    return _in_mode(Replayer(outcomes), seed_offset)


def recording(seed_offset: int = 0, path=None):
    """Record mode for this thread while the block runs (tests; the kernel's comes from boundary's
    environment variables): the Recorder, its checks in `.checks`, written to `path` if given."""
    return _in_mode(Recorder(path), seed_offset)


@contextlib.contextmanager
def _in_mode(mode, seed_offset: int):
    mode_token, seed_token = boundary._mode.set(mode), boundary._seed_offset.set(seed_offset)
    try:
        yield mode
    finally:
        boundary._mode.reset(mode_token)
        boundary._seed_offset.reset(seed_token)


def replay_check(grader, entry: dict, seed_offset: int) -> Verdict:
    """The verdict of `grader` (the course's own) on a check's record, without running any code
    of the learner's: the recorded arguments, the recorded outcomes of its crossings."""
    name = f"{grader.__module__}.{grader.__qualname__}"
    if entry["grader"] != name:
        return Verdict(False, f"{MISMATCH}: it recorded {entry['grader']}, the check calls {name}")
    if entry["argument_problem"]:
        return Verdict(False, f"the check's arguments could not be judged: {entry['argument_problem']}")
    if not entry["complete"]:
        return Verdict(False, "the check did not finish in the notebook's kernel")
    try:
        args = [decode(part, callables=True) for part in entry["args"]]
        kwargs = {name: decode(part, callables=True) for name, part in entry["kwargs"]}
    except (CrossingDataError, TypeError, ValueError) as error:
        return Verdict(False, f"{MISMATCH}: its arguments are not data ({error})")
    with replaying(entry["outcomes"], seed_offset) as mode:
        try:
            grader(*args, **kwargs)
        except GradingError as error:
            return Verdict(False, "\n".join(error._render_traceback_()))
        except RecordMismatch as error:
            return Verdict(False, f"{MISMATCH}: {error}")
        except GraderOutsideCrossing as error:
            return Verdict(False, f"not judged: {error}", grader_fault=True)
        except Exception as error:
            return Verdict(False, f"not judged: the grader failed on the record "
                                  f"({type(error).__name__}: {str(error)[:300]})", grader_fault=True)
    if mode.next != len(mode.outcomes):
        return Verdict(False, f"{MISMATCH}: it holds {len(mode.outcomes) - mode.next} outcome(s) "
                              f"more than the check asked for")
    return Verdict(True)
