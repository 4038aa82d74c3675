"""Lesson lengths a learner can plan by: each first cell states what the pacing model computes
from the notebook (course_lib/authoring/pacing.py), a long lesson says where to pause, every
exercise has a kind, and the README's total is the model's.
"""
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.authoring.cells import exercise_name, is_check_cell
from course_lib.authoring.layout import SOLUTIONS, course_notebooks
from course_lib.authoring.pacing import (EXERCISE_KINDS, EXERCISE_MINUTES, MEASURED_RUN_SECONDS,
                                         PAUSE_OVER_MINUTES, pace, restate, stated)

ROOT = Path(__file__).resolve().parents[2]
SOLUTION_NOTEBOOKS = course_notebooks(ROOT / SOLUTIONS)


def first_cell(path) -> str:
    return nbformat.read(path, as_version=4).cells[0].source


@pytest.mark.parametrize("path", SOLUTION_NOTEBOOKS, ids=lambda path: path.name)
def test_every_exercise_has_a_kind_and_every_lesson_a_measured_run_time(path):
    names = [exercise_name(cell) for cell in nbformat.read(path, as_version=4).cells if is_check_cell(cell)]
    assert all(EXERCISE_KINDS.get(name) in EXERCISE_MINUTES for name in names), (
        f"{path.name}: give each exercise a kind in pacing.EXERCISE_KINDS: "
        f"{[name for name in names if name not in EXERCISE_KINDS]}")
    assert path.name[:2] in MEASURED_RUN_SECONDS, f"{path.name}: add its run time (run-solutions)"


@pytest.mark.parametrize("path", SOLUTION_NOTEBOOKS, ids=lambda path: path.name)
def test_the_first_cell_states_the_models_minutes_and_a_long_lesson_where_to_pause(path):
    lesson = pace(path)
    assert stated(first_cell(path)) == (lesson.minutes, lesson.reading_and_running,
                                        lesson.exercise_minutes), (
        f"{path.name}: the model gives about {lesson.minutes} minutes ({lesson.reading_and_running} "
        f"reading and running, {lesson.exercise_minutes} for the exercises); restate the first cell")
    if lesson.minutes > PAUSE_OVER_MINUTES:
        assert f'stop before section "{lesson.pause_before}"' in first_cell(path), (
            f"{path.name} takes {lesson.minutes} minutes: say where to pause ({lesson.pause_before!r})")


def test_a_first_cell_that_says_otherwise_is_seen():
    path = SOLUTION_NOTEBOOKS[0]
    lesson = pace(path)
    lesson.prose_words += 2000  # ten more minutes of reading
    assert stated(restate(first_cell(path), lesson)) != stated(first_cell(path))


def test_an_optional_section_is_outside_the_timed_path(tmp_path):
    def lesson_with(heading):
        path = tmp_path / "99_lesson.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[
            nbformat.v4.new_markdown_cell("# 99 lesson"),
            nbformat.v4.new_markdown_cell("## 1 timed\n\n" + "word " * 900),
            nbformat.v4.new_markdown_cell(heading + "\n\n" + "word " * 1800),
            nbformat.v4.new_code_cell("x = 1\n" * 20),
            nbformat.v4.new_markdown_cell("## Summary\n\n" + "word " * 180)]), path)
        return pace(path)

    timed = lesson_with("## 2 More practice (optional)")
    assert (timed.prose_words, timed.code_lines, timed.code_cells) == (2 + 902 + 181, 0, 0)
    counted = lesson_with("## 2 More practice")  # the same section, not marked: all of it counts
    assert (counted.prose_words, counted.code_lines, counted.code_cells) == (
        2 + 902 + 1803 + 181, 20, 1)


def test_the_readme_total_is_the_models():
    plan = (ROOT / "README.md").read_text().split("## Plan your time", 1)[1].split("\n## ", 1)[0]
    hours = int(re.search(r"In all, about (\d+) hours", plan).group(1))
    assert hours == round(sum(pace(path).minutes for path in SOLUTION_NOTEBOOKS) / 60)
