"""A class's gradebook: one row per learner and exercise, from a lesson's submissions.

A pipeline of plain functions: find the submissions, grade each in its own process and folder with
a timeout (grading.grade), turn each grade into rows, write the rows as CSV or JSON for a
spreadsheet or an LMS. commands.py prints them as a table.
"""
import csv
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .cells import exercise_name
from .grading import DEFAULT_CELL_TIMEOUT_S, DEFAULT_TIMEOUT_S, grade
from .layout import NOTEBOOK_NAME

CHECKPOINTS = ".ipynb_checkpoints"


@dataclass
class Row:
    learner: str
    submission: str
    exercise: str
    result: str      # pass, fail, or error (the notebook could not be graded)
    message: str     # the verdict's first lines, when it failed
    note: str        # why the course's check cell was put back, if it was
    seconds: float   # the whole submission's grading time


def find_submissions(paths, lesson_name: str) -> list:
    """[(learner, notebook)] from files and folders. In a folder: the notebooks named like the
    lesson (in a folder per learner) and those named after no lesson (alice.ipynb)."""
    found = []
    for path in map(Path, paths):
        if path.is_file():
            found.append((_learner(path.parent, path, lesson_name), path))
        elif path.is_dir():
            notebooks = sorted(nb for nb in path.rglob("*.ipynb") if CHECKPOINTS not in nb.parts)
            found += [(_learner(path, nb, lesson_name), nb) for nb in notebooks
                      if nb.name[:3] == lesson_name[:3] or not NOTEBOOK_NAME.match(nb.name)]
        else:
            raise LookupError(f"no submission at {path}: give notebooks or folders of them")
    if not found:
        raise LookupError(f"no notebooks in {', '.join(map(str, paths))}")
    return _unique_names(found)


def _learner(folder: Path, notebook: Path, lesson_name: str) -> str:
    """alice for alice.ipynb, class/alice.ipynb and class/alice/03_collectives.ipynb."""
    relative = notebook.resolve().relative_to(folder.resolve())
    if not (NOTEBOOK_NAME.match(notebook.name) and notebook.name[:3] == lesson_name[:3]):
        return relative.with_suffix("").as_posix()  # the notebook's own name says who
    return relative.parent.as_posix() if relative.parent != Path(".") else folder.resolve().name


def _unique_names(found) -> list:
    seen, unique = {}, []
    for learner, notebook in found:
        seen[learner] = seen.get(learner, 0) + 1
        unique.append((learner if seen[learner] == 1 else f"{learner} ({notebook})", notebook))
    return unique


def rows_of(learner: str, result) -> list:
    """The gradebook rows of one graded submission: one per exercise of the course."""
    if result.problem and not result.results:
        return [Row(learner, str(result.notebook), "(whole notebook)", "error", result.problem,
                    "", round(result.seconds, 1))]
    rows = []
    for cell in result.checks:
        name = exercise_name(cell.cell)
        rows.append(Row(learner, str(result.notebook), name, "pass" if cell.passed else "fail",
                        "" if cell.passed else cell.message[:2000],
                        "; ".join(filter(None, [result.notes.get(name, "")] + result.ignored)),
                        round(result.seconds, 1)))
    return rows


def grade_class(solution: Path, submissions, timeout_s: float = DEFAULT_TIMEOUT_S,
                cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S) -> list:
    """The rows of every (learner, notebook) in `submissions`, graded with `solution`'s check cells,
    one after the other."""
    rows = []
    for learner, notebook in submissions:
        rows += rows_of(learner, grade(notebook, solution, timeout_s, cell_timeout_s))
    return rows


def write_csv(rows, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(Row.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)


def write_json(rows, path: Path, lesson: str) -> None:
    Path(path).write_text(json.dumps({"lesson": lesson, "rows": [asdict(row) for row in rows]},
                                     indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
