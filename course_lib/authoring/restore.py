"""The course's own check cells, put back into a learner's notebook before it is graded.

A verdict must come from the course's grader call and the course's expected output: a check cell
the learner edited, deleted or replaced by a typed passed line is put back as the solution has it.
"""
import copy
from dataclasses import dataclass, field

from ..checks.engine import passed_line
from .cells import CHECK_MARKER, exercise_name, is_check_cell, is_code, is_solution_only

EDITED = "its check cell was edited; graded with the course's check cell"
TYPED = ("its check cell was replaced by a printed verdict, which never counts; graded with the "
         "course's check cell")
DELETED = "its check cell was deleted; graded with the course's check cell, put back"
NOT_THE_COURSES = "a check cell the course does not have ({name}): run, not graded"


@dataclass
class Restored:
    """The notebook to grade, and what was put back: {exercise: note}, plus notes on cells that
    looked like check cells but are not the course's."""

    notebook: object
    notes: dict = field(default_factory=dict)
    ignored: list = field(default_factory=list)


def restore_check_cells(submission, solution) -> Restored:
    """A copy of `submission` whose check cells are exactly the solution's (source, stored
    verdict, execution count), matched by cell id, else by the grader they call."""
    notebook = copy.deepcopy(submission)
    course = [cell for cell in solution.cells if not is_solution_only(cell)]
    wanted = [cell for cell in course if is_check_cell(cell)]
    restored = Restored(notebook)
    matched = _match(notebook.cells, wanted)
    for position, cell in enumerate(course):
        if not is_check_cell(cell):
            continue
        name = exercise_name(cell)
        index = matched.get(name)
        if index is None:
            index = _insertion_point(notebook.cells, course[:position])
            notebook.cells.insert(index, copy.deepcopy(cell))
            matched = {key: (i + 1 if i >= index else i) for key, i in matched.items()}
            matched[name] = index
            restored.notes[name] = DELETED
            continue
        learner_cell = notebook.cells[index]
        if learner_cell.source.strip() != cell.source.strip():
            restored.notes[name] = TYPED if _prints_a_verdict(learner_cell.source) else EDITED
        learner_cell.source = cell.source
        learner_cell.outputs = copy.deepcopy(cell.outputs)
        learner_cell.execution_count = cell.execution_count
    graded = set(matched.values())
    for index, cell in enumerate(notebook.cells):
        if is_check_cell(cell) and index not in graded:
            restored.ignored.append(NOT_THE_COURSES.format(name=exercise_name(cell)))
            cell.source = cell.source.replace(CHECK_MARKER, "# (not a course check)", 1)
    return restored


def _match(cells, wanted) -> dict:
    """{exercise: index in `cells`} of the learner's cell that stands for each course check cell:
    the same cell id (JupyterLab keeps ids through edits), else a check cell calling its grader."""
    by_id = {cell.get("id"): index for index, cell in enumerate(cells) if cell.get("id")}
    matched, taken = {}, set()
    for cell in wanted:
        index = by_id.get(cell.get("id"))
        if index is not None and is_code(cells[index]):
            matched[exercise_name(cell)] = index
            taken.add(index)
    for cell in wanted:
        name = exercise_name(cell)
        if name in matched:
            continue
        same_grader = [index for index, candidate in enumerate(cells) if index not in taken
                       and is_check_cell(candidate) and exercise_name(candidate) == name]
        if same_grader:
            matched[name] = same_grader[0]
            taken.add(same_grader[0])
    return matched


def _insertion_point(cells, course_before) -> int:
    """Where a deleted check cell goes back: after the learner's copy of the nearest course cell
    before it (its exercise, usually); at the end when none is left."""
    ids = [cell.get("id") for cell in cells]
    for cell in reversed(course_before):
        if cell.get("id") in ids:
            return ids.index(cell.get("id")) + 1
    return len(cells)


def _prints_a_verdict(source: str) -> bool:
    prefix = passed_line("\0").split("\0")[0]
    return prefix in source or "passed" in source and "print" in source
