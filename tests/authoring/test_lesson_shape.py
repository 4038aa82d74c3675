"""What a learner reads before running anything: each lesson's first cell says how long it takes,
what it needs and what they will have built, the README's plan gives the same minutes, and no
code cell, in a lesson or its solution, runs past 30 lines (longer code lives in course_lib, shown
with inspect, or in a file a cell writes).
"""
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.authoring.layout import LESSONS, SOLUTIONS, course_notebooks

ROOT = Path(__file__).resolve().parents[2]
MAX_CODE_CELL_LINES = 30
LENGTH = re.compile(r"\babout (\d+) minutes\b", re.IGNORECASE)
PLAN_ENTRY = re.compile(r"\b(\d\d) [^,(|]+\((\d+)(?: min)?\)")  # "04 the DDP flow (75)"


def first_cell(path):
    return nbformat.read(path, as_version=4).cells[0].source


def stated_minutes(path):
    found = LENGTH.search(first_cell(path))
    return int(found.group(1)) if found else None


def long_code_cells(path):
    """[(index, lines)] of the code cells over MAX_CODE_CELL_LINES lines."""
    cells = nbformat.read(path, as_version=4).cells
    return [(index, len(cell.source.splitlines())) for index, cell in enumerate(cells)
            if cell.cell_type == "code" and len(cell.source.splitlines()) > MAX_CODE_CELL_LINES]


def readme_plan():
    """{lesson number: minutes} from the README's two-day plan."""
    table = (ROOT / "README.md").read_text().split("## Plan your time", 1)[1].split("\n## ", 1)[0]
    return {number: int(minutes) for number, minutes in PLAN_ENTRY.findall(table)}


SOLUTION_NOTEBOOKS = course_notebooks(ROOT / SOLUTIONS)


@pytest.mark.parametrize("path", SOLUTION_NOTEBOOKS, ids=lambda path: path.name)
def test_the_first_cell_says_how_long_what_it_needs_and_what_you_build(path):
    text = first_cell(path)
    assert stated_minutes(path), f"{path.name}: the first cell should say 'about N minutes'"
    assert re.search(r"\bneeds\b", text, re.IGNORECASE), f"{path.name}: say what it needs"
    assert re.search(r"\bbuil[dt]\b", text, re.IGNORECASE), f"{path.name}: say what you build"


def test_the_readme_plan_gives_each_lesson_the_minutes_its_first_cell_states():
    stated = {path.name[:2]: stated_minutes(path) for path in SOLUTION_NOTEBOOKS}
    assert readme_plan() == stated


@pytest.mark.parametrize("path", course_notebooks(ROOT / LESSONS) + SOLUTION_NOTEBOOKS,
                         ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_code_cell_is_over_30_lines(path):
    # solutions too: instructors read them, and a long answer belongs in a file the cell writes
    assert long_code_cells(path) == [], (f"{path.parent.name}/{path.name}: split these cells or "
                                         f"move code to course_lib")


def test_the_checks_see_a_long_cell_and_a_missing_length(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# 99 · A lesson\n\nNo length here."),
        nbformat.v4.new_code_cell("\n".join(f"x{n} = {n}" for n in range(31)))])
    path = tmp_path / "99_lesson.ipynb"
    nbformat.write(notebook, path)
    assert stated_minutes(path) is None
    assert long_code_cells(path) == [(1, 31)]
    assert PLAN_ENTRY.findall("| 1 | 00 welcome (25 min), 04 the DDP flow (75) | 7 h |") == [
        ("00", "25"), ("04", "75")]
