"""A class's gradebook: one row per learner and exercise, from a lesson's submissions.

Each submission is graded in its own process and folder, with a timeout (check.grade); the rows
are printed as a table and written as CSV or JSON for a spreadsheet or an LMS.
"""
import csv
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .cells import exercise_name
from .check import grade
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


def grade_class(solution: Path, submissions, args) -> int:
    """Grade every submission, print a table, write CSV/JSON; 0 when every exercise passes."""
    from tqdm.auto import tqdm

    found = find_submissions(submissions, solution.name)
    rows = []
    bar = tqdm(found, desc=f"grading {solution.stem}", unit="notebook", file=sys.stderr)
    for learner, notebook in bar:
        bar.set_postfix_str(learner)
        rows += rows_of(learner, grade(notebook, solution, args.timeout, args.cell_timeout))
    bar.close()
    print_table(rows)
    if args.csv:
        write_csv(rows, args.csv)
    if args.json:
        args.json.write_text(json.dumps({"lesson": solution.name, "rows": [asdict(row) for row in rows]},
                                        indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0 if all(row.result == "pass" for row in rows) else 1


def print_table(rows) -> None:
    width = max(len(row.learner) for row in rows)
    print(f"{'learner':<{width}}  result  exercise")
    for row in rows:
        print(f"{row.learner:<{width}}  {row.result:<6}  {row.exercise}")
        if row.result != "pass" and row.message:
            print(" " * (width + 10) + row.message.splitlines()[0][:150])
        if row.note:
            print(" " * (width + 10) + f"note: {row.note}")
    learners = {row.learner for row in rows}
    passing = sum(row.result == "pass" for row in rows)
    print(f"{passing} of {len(rows)} exercises pass, {len(learners)} learners.")


def write_csv(rows, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=list(Row.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(row) for row in rows)
