"""A class's gradebook: one row per learner (roster, points per exercise, total, feedback, notes).

A learner's grade (LearnerGrade) is plain data made from grading.Grade, kept one JSON line each
while a class is graded (class_grading.py); rows join it with the roster and the course's points,
and exports.py writes them for a spreadsheet, Canvas or Gradescope.
"""
import csv
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from .cells import exercise_name, is_check_cell, is_exercise_cell, is_solution_only

GRADED, ERROR, MISSING, NOT_GRADED = "graded", "error", "missing", "not graded"
POINTS_KEY = "points"  # a solution check cell's metadata: {"points": 3}; 1 when absent
MAX_FEEDBACK = 1500
ROSTER_ID_COLUMNS = ("learner", "login", "username", "sis login id", "id", "email")
ROSTER_NAME_COLUMNS = ("name", "student", "full name")
NOT_IN_ROSTER = "not in the roster: left out of the Canvas and Gradescope files"


@dataclass
class LearnerGrade:
    """What grading one learner's submission gave: a line of the state file, plain data only."""

    learner: str
    submission: str = ""
    status: str = MISSING
    passed: dict = field(default_factory=dict)     # {exercise: bool}
    feedback: dict = field(default_factory=dict)   # {exercise: what the learner should read}
    notes: list = field(default_factory=list)      # for the instructor: copies, restored cells
    graded_at: str = ""                            # ISO 8601, UTC
    seconds: float = 0.0
    sealed: bool = False                           # graded inside a sandbox
    sha256: str = ""                               # of the submission, so --resume sees a change
    seed_offset: int = 0                           # the grading-time inputs it was judged on


@dataclass
class RosterEntry:
    learner: str
    name: str = ""
    email: str = ""
    columns: dict = field(default_factory=dict)    # every column, by lowercase header


@dataclass
class Row:
    """One learner's row of the gradebook, the grade joined with the roster and the points."""

    learner: str
    name: str
    email: str
    lesson: str
    status: str
    points: dict       # {exercise: points earned}
    total: float
    maximum: float
    feedback: dict
    notes: list
    graded_at: str
    seconds: float
    sealed: bool
    submission: str
    roster: dict = field(default_factory=dict)
    in_roster: bool = True


def cell_roles(solution: Path) -> dict:
    """{cell id: "exercise" or "setup"} of a solution's code cells; a learner's notebook keeps the
    ids (JupyterLab does), so a failed cell can be named for what it is in the course."""
    notebook = nbformat.read(solution, as_version=4)
    return {cell.get("id"): "exercise" if is_exercise_cell(cell) else "setup"
            for cell in notebook.cells if cell.cell_type == "code" and cell.get("id")}


def learner_grade(learner: str, grade, notes=(), graded_at: str = "", sha256: str = "",
                  roles=None) -> LearnerGrade:
    """A LearnerGrade from a grading.Grade: per exercise, pass or fail and its feedback, which names
    a failed exercise or setup cell before the check (a SyntaxError, not only the NameError after).
    `roles` is cell_roles(solution)."""
    roles = roles or {}
    result = LearnerGrade(learner, str(grade.notebook), GRADED, notes=list(notes),
                          graded_at=graded_at, seconds=round(grade.seconds, 1),
                          sealed=bool(getattr(grade, "sealed", False)), sha256=sha256,
                          seed_offset=getattr(grade, "seed_offset", 0))
    if grade.problem and not grade.results:
        result.status = ERROR
        result.notes.append(f"not graded: {grade.problem}"[:MAX_FEEDBACK])
        return result
    failed_before = []
    for cell in grade.results:
        if not is_check_cell(cell.cell):
            if not cell.passed:
                failed_before.append(cell)
            continue
        name = exercise_name(cell.cell)
        passed, message = _verdict(grade, name, cell, result.notes)
        result.passed[name] = passed
        lines = [f"{_which(earlier, roles)} failed: {earlier.message}" for earlier in failed_before]
        if lines:
            lines.append("then its check: " + (message if not passed else "passed"))
        else:
            lines.append("passed" if passed else message)
        if name in grade.notes:
            lines.append(f"note: {grade.notes[name]}")
        result.feedback[name] = "\n".join(lines)[:MAX_FEEDBACK]
        failed_before = []
    result.notes += [f"{_which(cell, roles)} failed after the last check: {cell.message}"[:MAX_FEEDBACK]
                     for cell in failed_before]
    result.notes += list(grade.ignored)
    result.notes += [f"copied or reached the course's answers: {finding}"[:MAX_FEEDBACK]
                     for finding in getattr(grade, "findings", ())]
    if grade.problem:
        result.notes.append(grade.problem[:MAX_FEEDBACK])
    return result


def _verdict(grade, name: str, cell, notes: list) -> tuple:
    """(passed, message) of a check: the judge's verdict (judge.py), the notebook's own check
    cell's only where there is no judge (a Grade made before it)."""
    verdicts = getattr(grade, "verdicts", None)
    if verdicts is None or name not in verdicts:
        return cell.passed, cell.message
    verdict = verdicts[name]
    if verdict.grader_fault:
        notes.append(f"{name}: the grader could not judge it (a bug of the course's, report it): "
                     f"{verdict.message}"[:MAX_FEEDBACK])
    elif cell.passed and not verdict.passed:
        notes.append(f"{name}: passed in the notebook's own kernel, failed when judged apart from "
                     f"it; look at the notebook"[:MAX_FEEDBACK])
    return verdict.passed, verdict.message


def _which(cell, roles) -> str:
    """'code cell 3 (exercise: def circle_area(radius))': nbval's count and the line a learner sees."""
    lines = [line.strip() for line in cell.cell.source.splitlines()]
    first = next((line for line in lines if line and not line.startswith("#")), "")
    role = roles.get(cell.cell.get("id")) or ("exercise" if is_exercise_cell(cell.cell)
                                               else "a cell the learner added")
    return f"code cell {cell.index} ({role}: {first[:60]})"


# -- points: the course's, and the instructor's overrides ----------------------------------------------

def course_points(solution: Path) -> dict:
    """{exercise: points} in the lesson's order: a check cell's metadata "points", else 1."""
    notebook = nbformat.read(solution, as_version=4)
    return {exercise_name(cell): float(cell.metadata.get(POINTS_KEY, 1))
            for cell in notebook.cells if is_check_cell(cell) and not is_solution_only(cell)}


def override_points(points: dict, overrides) -> dict:
    """`points` with each "exercise=N" of `overrides` (or a file of such lines) applied."""
    points = dict(points)
    for item in overrides or ():
        pairs = [item] if "=" in item else _points_file(Path(item))
        for pair in pairs:
            name, _, value = (part.strip() for part in pair.partition("="))
            if name not in points:
                raise LookupError(f"--points {pair!r}: this lesson has no exercise {name!r}; its "
                                  f"exercises: {', '.join(points)}")
            try:
                points[name] = float(value)
            except ValueError:
                raise LookupError(f"--points {pair!r}: {value!r} is not a number of points") from None
    return points


def _points_file(path: Path) -> list:
    if not path.is_file():
        raise LookupError(f"--points {path}: give exercise=N (e.g. check_ring_allreduce=3) or a "
                          f"file of such lines")
    lines = [line.split("#")[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [line.replace(",", "=", 1) if "=" not in line else line for line in lines if line]


# -- the roster ---------------------------------------------------------------------------------------

def read_roster(path: Path) -> list:
    """The learners of a roster CSV: a learner id column (learner, login, username, SIS Login ID,
    id or email), optional name and email; a Canvas gradebook export works as it is."""
    with open(path, newline="", encoding="utf-8-sig") as file:
        rows = list(csv.reader(file))
    if not rows:
        raise LookupError(f"the roster {path} is empty: give a CSV with a header row")
    header = [cell.strip().lower() for cell in rows[0]]
    id_column = next((column for column in ROSTER_ID_COLUMNS if column in header), None)
    if id_column is None:
        raise LookupError(f"the roster {path} has no learner id column: name one of "
                          f"{', '.join(ROSTER_ID_COLUMNS)} in its header (found: {', '.join(header)})")
    name_column = next((column for column in ROSTER_NAME_COLUMNS if column in header), None)
    entries, seen = [], set()
    for row in rows[1:]:
        columns = dict(zip(header, (cell.strip() for cell in row)))
        learner = columns.get(id_column, "")
        if not learner or "points possible" in " ".join(row).lower():  # Canvas's second row
            continue
        if learner.casefold() in seen:
            raise LookupError(f"the roster {path} lists {learner!r} twice")
        seen.add(learner.casefold())
        entries.append(RosterEntry(learner, columns.get(name_column, ""), columns.get("email", ""),
                                   columns))
    return entries


# -- rows: grades joined with the roster and the points ------------------------------------------------

def gradebook_rows(grades, submissions, lesson: str, points: dict, roster=None) -> list:
    """A Row per roster learner (missing ones with 0 points), then one per learner found who is
    not in the roster; without a roster, one per learner found."""
    by_learner = {grade.learner: grade for grade in grades}
    for submission in submissions:  # found, nothing gradable: a row that says what was found
        if submission.notebook is None:
            by_learner.setdefault(submission.learner, LearnerGrade(
                submission.learner, status=NOT_GRADED, notes=list(submission.notes)))
    rows = []
    if roster is not None:
        matched = _match_roster(roster, by_learner)
        for entry in roster:
            grade = by_learner.pop(matched.get(entry.learner), None) or LearnerGrade(entry.learner)
            rows.append(_row(grade, lesson, points, entry))
    for grade in sorted(by_learner.values(), key=lambda grade: grade.learner):
        row = _row(grade, lesson, points, RosterEntry(grade.learner))
        if roster is not None:
            row.in_roster = False
            row.notes.insert(0, NOT_IN_ROSTER)
        rows.append(row)
    return rows


def _match_roster(roster, by_learner) -> dict:
    """{roster learner: learner found}: the same id, else the same id or email ignoring case."""
    folded = {learner.casefold(): learner for learner in by_learner}
    matched = {}
    for entry in roster:
        for key in (entry.learner, entry.learner.casefold(), entry.email.casefold()):
            found = key if key in by_learner else folded.get(key)
            if key and found and found not in matched.values():
                matched[entry.learner] = found
                break
    return matched


def _row(grade: LearnerGrade, lesson: str, points: dict, entry: RosterEntry) -> Row:
    earned = {name: (value if grade.passed.get(name) else 0.0) for name, value in points.items()}
    feedback = dict(grade.feedback)
    if grade.status == MISSING:
        feedback = {name: "no submission" for name in points}
    elif grade.status != GRADED:
        feedback = {name: f"not graded ({grade.status}): see notes" for name in points}
    return Row(entry.learner, entry.name, entry.email, lesson, grade.status, earned,
               sum(earned.values()), sum(points.values()), feedback, list(grade.notes),
               grade.graded_at, grade.seconds, grade.sealed, grade.submission, entry.columns)
