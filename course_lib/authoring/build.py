"""Building lessons/ from solutions/: exercises become stubs, solution-only cells go away, and
no code cell keeps an output (an unsolved exercise shows no verdict).

Deterministic: the same solution always gives the same bytes, so `--check` can spot a stale lesson.
"""
import copy
from pathlib import Path

import nbformat

from ..checks.engine import passed_line
from .cells import (BEGIN_SOLUTION, END_SOLUTION, SKELETON_STEP, STUB, is_check_cell, is_code,
                    is_solution_only)
from .layout import LESSONS, SOLUTIONS, course_notebooks, matches_numbers
from .scrub import scrub_outputs

MARKDOWN_STUB = "YOUR ANSWER HERE"


class LessonBuildError(ValueError):
    """A solution notebook cannot become a lesson; the message says which cell and why."""


def stub_regions(source: str, where: str, markdown: bool = False) -> str:
    """Replace each BEGIN/END SOLUTION region of `source` with a stub at the region's indent.

    A code region's `# Step ...` comments stay in its stub, in order, before the `raise`: a
    skeleton of a multi-step exercise that says what to do, not how.
    """
    kept, region_start = [], None
    for number, line in enumerate(source.splitlines(), start=1):
        marker = line.strip()
        if marker == BEGIN_SOLUTION:
            if region_start is not None:
                raise LessonBuildError(f"{where}: line {number} opens a region inside the one "
                                       f"opened at line {region_start}; close it with {END_SOLUTION}")
            region_start = number
            indent = line[: len(line) - len(line.lstrip())]
            kept += [indent + MARKDOWN_STUB] if markdown else [indent + "# YOUR CODE HERE"]
        elif marker == END_SOLUTION:
            if region_start is None:
                raise LessonBuildError(f"{where}: line {number} has {END_SOLUTION} without a "
                                       f"{BEGIN_SOLUTION} before it")
            region_start = None
            if not markdown:
                kept.append(indent + STUB)
        elif region_start is None:
            kept.append(line)
        elif not markdown and marker.startswith(SKELETON_STEP):
            kept.append(indent + marker)
    if region_start is not None:
        raise LessonBuildError(f"{where}: line {region_start} opens a region that is never "
                               f"closed; add {END_SOLUTION} after the solution code")
    return "\n".join(kept) + ("\n" if source.endswith("\n") else "")


def build_lesson(solution, name: str = "notebook", root: Path = Path(".")):
    """The lesson made from a solution notebook (which is left unchanged)."""
    lesson, kept = copy.deepcopy(solution), []
    for index, cell in enumerate(lesson.cells):
        if is_solution_only(cell):
            continue
        kept.append(cell)
        where = f"{name} cell {index}"  # counted in the solution, where the author will look
        cell.source = stub_regions(cell.source, where, markdown=not is_code(cell))
        cell.metadata.pop("execution", None)  # timestamps would make every build differ
        if is_check_cell(cell):
            require_grader_lines(cell, where, name)
        if is_code(cell):
            # no verdict before the learner runs the check; `check` grades against the
            # solution's own check cells (restore.py), never against what a lesson stores
            cell.outputs, cell.execution_count = [], None
    lesson.cells = kept
    return scrub_outputs(lesson, root)


def require_grader_lines(cell, where: str, name: str) -> None:
    """A check cell's stored output must be its graders' fixed lines and nothing else, or the
    lesson would compare against output that varies (a launch banner, a warning, a timing)."""
    if not cell.outputs:
        raise LessonBuildError(f"{where} is a check cell with no stored output; execute the "
                               f"solution first: python -m course_lib run-solutions "
                               f"--only {name[:2]} --write")
    texts = [output.get("text", "") for output in cell.outputs
             if output.get("output_type") == "stream" and output.get("name") == "stdout"]
    lines = "".join(texts).splitlines()
    if len(texts) != len(cell.outputs) or not lines or not all(map(is_passed_line, lines)):
        raise LessonBuildError(f"{where} is a check cell whose output is not only its graders' "
                               f"'{passed_line('exercise')}' lines: {cell.outputs!r:.300}; print "
                               f"nothing else there (launch graders' ranks with output='none')")


def is_passed_line(line: str) -> bool:
    prefix, suffix = passed_line("\0").split("\0")
    return line.startswith(prefix) and line.endswith(suffix)


def render(nb) -> bytes:
    """The notebook's bytes, in nbformat's fixed JSON layout."""
    return (nbformat.writes(nb) + "\n").encode("utf-8")


def build_lessons(root: Path, check: bool = False, only=(), say=lambda line: None) -> list:
    """Write (or, with `check`, compare) every lesson (or those `only` names), calling `say` with
    a line for each lesson that is up to date or written.

    Returns the problems found. A solution that cannot be built is one problem: the other
    lessons are still built.
    """
    problems = []
    solutions = course_notebooks(root / SOLUTIONS)
    for solution_path in (path for path in solutions if matches_numbers(path, only)):
        lesson_path = root / LESSONS / solution_path.name
        solution = nbformat.read(solution_path, as_version=4)
        try:
            wanted = render(build_lesson(solution, solution_path.name, root))
        except LessonBuildError as error:
            problems.append(f"{SOLUTIONS}/{solution_path.name} cannot be built: {error}")
            continue
        current = lesson_path.read_bytes() if lesson_path.exists() else None
        if current == wanted:
            say(f"up to date  {LESSONS}/{lesson_path.name}")
        elif check:
            problems.append(f"{LESSONS}/{lesson_path.name} is "
                            f"{'missing' if current is None else 'out of date'}")
        else:
            lesson_path.parent.mkdir(exist_ok=True)
            lesson_path.write_bytes(wanted)
            say(f"wrote       {LESSONS}/{lesson_path.name}")
    solution_names = {path.name for path in solutions}
    for lesson_path in course_notebooks(root / LESSONS):
        if lesson_path.name not in solution_names and matches_numbers(lesson_path, only):
            problems.append(f"{LESSONS}/{lesson_path.name} has no {SOLUTIONS}/{lesson_path.name}; "
                            f"delete the lesson or add its solution")
    return problems
