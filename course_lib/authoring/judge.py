"""The class verdict, decided where no learner code ran: each of the solution's check cells (the
course's own source) replayed from the record the submission's kernel wrote (checks/engine/record.py).

The grader a check cell calls is found through the solution's own import of it (or the solution's
cell that defines it, run here: the course's own source); it is called with the
recorded arguments (its functions replaced by placeholders) and the recorded outcomes of its
crossings. A check with no record fails with why the notebook gave none; an exercise whose cell
copies or reaches the course's reference answers fails with that finding (copy_detection.py).
"""
import ast
import importlib
import re
import threading
from pathlib import Path

from ..checks.engine.boundary import RECORD_VARIABLE, SEED_VARIABLE
from ..checks.engine.record import Verdict, replay_check
from ..checks.engine.record_file import RecordFileError, read_record
from .cells import exercise_name, is_check_cell, is_code, is_solution_only

NO_RECORD = "no record of this check from the notebook's run"
SEAL_VARIABLE = "COURSE_LIB_RECORD_KEY"  # topics/timing.py's key of measured records' seals
# one replay at a time in this process: graders seed torch's global generator (--jobs N judges
# N submissions from N threads, and a replay is short beside the notebook's run)
REPLAY_LOCK = threading.Lock()
MAGIC_LINE = re.compile(r"^\s*[%!].*$", re.MULTILINE)


def recording_variables(seed_offset: int, record) -> dict:
    """The kernel's environment for record mode (boundary.py): the seed offset, the record's
    path, and this process's key of measured records' seals (topics/timing.py), so that a record
    the kernel sealed is one the judge, here, sees as measured rather than typed in."""
    from ..topics import timing

    return {SEED_VARIABLE: str(seed_offset), RECORD_VARIABLE: str(record),
            SEAL_VARIABLE: timing._SEAL_KEY.decode()}


def judge_grade(result, learner_notebook, solution_notebook, record) -> None:
    """result.verdicts (a grading.Grade's) from the record, and an exercise that copies the
    course's answers failed whatever its record says (copy_verdicts)."""
    reasons = {exercise_name(cell.cell): cell.message for cell in result.checks if not cell.passed}
    why_none = result.problem.splitlines()[0] if result.problem else ""
    result.verdicts = judge(solution_notebook, record, result.seed_offset, reasons, why_none)
    copied, result.findings = copy_verdicts(learner_notebook, solution_notebook, result.verdicts)
    result.verdicts.update(copied)


class SolutionCheckError(LookupError):
    """The solution's check cell is not a grader call the judge can find: the course's bug."""


def judge(solution, record: bytes, seed_offset: int, reasons: dict = None, why_none: str = "") -> dict:
    """{exercise: Verdict} for each check cell of `solution` (an nbformat notebook), judged on
    `record` (the file's bytes, or its path; b"" or None when none came back). Why a check has no
    record: `reasons` {exercise: why nbval failed its check cell}, else `why_none`."""
    reasons = reasons or {}
    calls = check_calls(solution)
    checks, problem = _checks_recorded(record, seed_offset)
    last = {entry["grader"]: entry for entry in checks}  # a check run twice: its last run
    verdicts = {}
    for name, (grader, arity) in calls.items():
        entry = last.get(f"{grader.__module__}.{grader.__qualname__}")
        if entry is None:
            why = why_none or problem or "the check cell did not run"
            verdicts[name] = Verdict(False, reasons.get(name) or f"{NO_RECORD} ({why})")
        elif (len(entry["args"]), sorted(key for key, _ in entry["kwargs"])) != arity:
            verdicts[name] = Verdict(False, "the recorded run does not match the check: other arguments")
        else:
            with REPLAY_LOCK:
                verdicts[name] = replay_check(grader, entry, seed_offset)
    return verdicts


def _checks_recorded(record, seed_offset: int) -> tuple:
    """([check entries], why there are none): `record` is bytes, a path, or None."""
    if not record or (not isinstance(record, (bytes, bytearray)) and not Path(record).exists()):
        return [], "the notebook's kernel wrote no record"
    try:
        read = read_record(record)
    except RecordFileError as error:
        return [], f"the record was refused: {error}"
    if read["seed_offset"] != seed_offset:
        return [], "the record was made with other grading inputs than this grading's"
    return read["checks"], ""


def check_calls(solution) -> dict:
    """{exercise: (grader, (positional count, sorted keyword names))} of the solution's check
    cells: the call parsed with ast, the grader imported as the solution's own cells import it."""
    imports = _grader_imports(solution)
    calls = {}
    for cell in solution.cells:
        if not is_check_cell(cell) or is_solution_only(cell):
            continue
        name = exercise_name(cell)
        call = next((node for node in ast.walk(_parse(cell.source)) if isinstance(node, ast.Call)
                     and isinstance(node.func, ast.Name) and node.func.id == name), None)
        grader = _grader(solution, name, imports) if call is not None else None
        if not hasattr(grader, "exercise"):
            raise SolutionCheckError(f"the solution's check cell {name} is not a call of a grader "
                                     f"(@grader) that its cells import or define")
        calls[name] = (grader, (len(call.args), sorted(keyword.arg for keyword in call.keywords)))
    return calls


def _grader(solution, name: str, imports: dict):
    """The grader `name`: imported as the solution imports it, else defined by running the
    solution's own cell that defines it (the course's source, as in the notebook: a course's
    fixture or a lesson that keeps its graders in its setup cell)."""
    if name in imports:
        module, attribute = imports[name]
        return getattr(importlib.import_module(module), attribute, None)
    for cell in solution.cells:
        tree = _parse(cell.source) if is_code(cell) else None
        if tree and any(isinstance(node, ast.FunctionDef) and node.name == name for node in tree.body):
            namespace = {"__name__": "__main__"}  # the kernel's, so the recorded names match
            exec(compile(tree, f"<solution cell {cell.get('id')}>", "exec"), namespace)
            return namespace.get(name)
    return None


def _grader_imports(solution) -> dict:
    """{name bound: (module, attribute)} of the solution's imports from course_lib.checks."""
    found = {}
    for cell in solution.cells:
        if not is_code(cell):
            continue
        for node in ast.walk(_parse(cell.source)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("course_lib.checks"):
                for alias in node.names:
                    found[alias.asname or alias.name] = (node.module, alias.name)
    return found


def _parse(source: str):
    try:
        return ast.parse(MAGIC_LINE.sub("", source))
    except SyntaxError:
        return ast.Module(body=[], type_ignores=[])


def copy_verdicts(learner_notebook, solution, exercises) -> tuple:
    """({exercise: Verdict} failing each exercise whose cell reaches or copies the course's
    reference answers, [notes for the instructor]) from copy_detection.findings."""
    from .copy_detection import findings

    verdicts, notes = {}, []
    for finding in findings(learner_notebook, solution):
        note = f"code cell {finding.cell_index}: {finding.reason}"
        if finding.exercise in exercises:
            verdicts.setdefault(finding.exercise, Verdict(
                False, f"not accepted: the exercise's code reaches or copies the course's own "
                       f"code ({finding.reason})"))
            notes.append(f"{finding.exercise}: {note}")
        else:
            notes.append(f"outside an exercise, {note}")
    return verdicts, notes
