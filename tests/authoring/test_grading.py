"""A check cell's verdict is what the learner did: no verdict is stored in a lesson, a typed or
edited check cell never counts, a failure reads as a verdict (no grader frames), and an instructor
grades a class into one row per learner.

The fixture course (tests/fixtures: 01_circle, two exercises) keeps these fast; one test runs a
real lesson-00 grader in a real kernel.
"""
import csv
import json
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from course_lib.authoring.commands import check_main
from course_lib.authoring.cells import is_check_cell
from course_lib.authoring.layout import LESSONS, course_notebooks
from course_lib.authoring.restore import DELETED, EDITED, TYPED, restore_check_cells

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures"
SOLUTION = FIXTURES / "solutions" / "01_circle.ipynb"
LESSON = FIXTURES / "lessons" / "01_circle.ipynb"
TYPED_VERDICT = '# NBVAL_CHECK_OUTPUT\nprint("✓ circle area: passed")'


def read(path):
    return nbformat.read(path, as_version=4)


def solved(wrong_area=False, typed=False, hang=False, delete_first_check=False):
    """The fixture lesson as a learner hands it in: solved, or with a mistake of one kind."""
    notebook = read(LESSON)
    for cell in list(notebook.cells):
        if cell.source.startswith("def circle_area"):
            body = "math.pi * radius" if wrong_area else "math.pi * radius ** 2"
            cell.source = f"def circle_area(radius):\n    return {body}"
            if hang:
                cell.source = "import time\ntime.sleep(3600)\n" + cell.source
        elif "raise NotImplementedError" in cell.source:
            cell.source = "unit_circle_area = circle_area(1.0)"
        elif is_check_cell(cell) and "check_circle_area" in cell.source:
            if typed:
                cell.source = TYPED_VERDICT
                cell.outputs = [new_output("stream", name="stdout", text="✓ circle area: passed\n")]
                cell.execution_count = 4
            if delete_first_check:
                notebook.cells.remove(cell)
    return notebook


# no verdict before the learner runs a check

@pytest.mark.parametrize("root", [TESTS.parent, FIXTURES], ids=["course", "fixtures"])
def test_no_lesson_stores_a_verdict_or_any_output(root):
    stored = [f"{path.name} cell {index}" for path in course_notebooks(root / LESSONS)
              for index, cell in enumerate(read(path).cells)
              if cell.cell_type == "code" and (cell.outputs or cell.execution_count)]
    assert not stored, f"lesson cells with stored outputs (a verdict before running): {stored}"


def test_the_scan_sees_a_stored_verdict(tmp_path):
    notebook = read(LESSON)
    check = next(cell for cell in notebook.cells if is_check_cell(cell))
    check.outputs = [new_output("stream", name="stdout", text="✓ circle area: passed\n")]
    (tmp_path / LESSONS).mkdir()
    nbformat.write(notebook, tmp_path / LESSONS / LESSON.name)
    with pytest.raises(AssertionError, match="01_circle.ipynb cell"):
        test_no_lesson_stores_a_verdict_or_any_output(tmp_path)


# the course's check cells are put back before grading

def test_a_typed_verdict_is_replaced_by_the_courses_check_cell_and_noted():
    restored = restore_check_cells(solved(typed=True), read(SOLUTION))
    checks = [cell for cell in restored.notebook.cells if is_check_cell(cell)]
    course = [cell for cell in read(SOLUTION).cells if is_check_cell(cell)]
    assert [cell.source for cell in checks] == [cell.source for cell in course]
    assert [cell.outputs for cell in checks] == [cell.outputs for cell in course]
    assert restored.notes == {"check_circle_area": TYPED}


def test_an_edited_check_cell_is_put_back_and_noted():
    notebook = solved()
    check = next(cell for cell in notebook.cells
                 if is_check_cell(cell) and "check_unit_circle_area" in cell.source)
    check.source += "  # I changed this"
    restored = restore_check_cells(notebook, read(SOLUTION))
    assert restored.notes == {"check_unit_circle_area": EDITED}


def test_a_deleted_check_cell_goes_back_right_after_its_exercise():
    restored = restore_check_cells(solved(delete_first_check=True), read(SOLUTION))
    sources = [cell.source for cell in restored.notebook.cells]
    exercise = next(i for i, source in enumerate(sources) if source.startswith("def circle_area"))
    assert sources[exercise + 1].endswith("check_circle_area(circle_area)")
    assert restored.notes == {"check_circle_area": DELETED}


def test_a_check_cell_moved_into_a_new_cell_is_found_by_its_grader_and_others_are_not_graded():
    notebook = solved()
    check = next(cell for cell in notebook.cells
                 if is_check_cell(cell) and "check_unit_circle_area" in cell.source)
    check["id"] = "made-by-the-learner"
    notebook.cells.append(new_code_cell("# NBVAL_CHECK_OUTPUT\nprint('my own check')"))
    restored = restore_check_cells(notebook, read(SOLUTION))
    assert restored.notes == {}
    assert len(restored.ignored) == 1 and "not graded" in restored.ignored[0]
    assert sum(is_check_cell(cell) for cell in restored.notebook.cells) == 2


@pytest.mark.slow
def test_a_typed_passed_line_fails_check_and_the_report_says_so(tmp_path, monkeypatch, capsys):
    course = tmp_path / "course"
    shutil.copytree(FIXTURES, course)
    nbformat.write(solved(wrong_area=True, typed=True), course / LESSONS / LESSON.name)
    monkeypatch.chdir(course)
    assert check_main(["1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  check_circle_area" in out and "1 of 2 exercises pass." in out
    assert "✗ circle area: circle_area(2.0) is not right yet." in out
    assert TYPED in out


# a failure reads as a verdict

GRADED_IN_A_KERNEL = [
    "from course_lib.checks.lesson00 import check_whoami",
    "def whoami():\n    return (0, 1)",              # the same answer on every rank
    "check_whoami(whoami)",
    "def whoami():\n    raise ValueError('my own bug')",
    "check_whoami(whoami)",
]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_failed_check_in_a_real_kernel_shows_the_verdict_and_no_grader_frame(tmp_path):
    from nbclient import NotebookClient

    notebook = new_notebook(cells=[new_code_cell(source) for source in GRADED_IN_A_KERNEL],
                            metadata={"kernelspec": {"name": "python3", "language": "python",
                                                     "display_name": "Python 3"}})
    NotebookClient(notebook, timeout=180, allow_errors=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    wrong, crashed = (cell.outputs[-1] for cell in notebook.cells[2::2])
    for output in (wrong, crashed):
        assert output.output_type == "error" and output.ename == "GradingError"
        shown = "\n".join(output.traceback)
        assert "course_lib/checks" not in shown and "run_check" not in shown, shown
        assert shown.startswith("✗ who am I: launch(whoami, nprocs=2) is not right yet."), shown
    assert "expected: [(0, 2), (1, 2)]" in "\n".join(wrong.traceback)
    crash = "\n".join(crashed.traceback)
    assert "rank 0's traceback" in crash or "rank 1's traceback" in crash, crash
    assert "ValueError: my own bug" in crash and "raise ValueError('my own bug')" in crash


# a class: one row per learner

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_class_of_three_one_right_one_wrong_one_hanging(tmp_path, monkeypatch, capsys):
    submissions = tmp_path / "class"
    submissions.mkdir()
    ann = solved()
    ann.cells.append(new_code_cell("open('written.txt', 'w').write('ann was here')"))
    nbformat.write(ann, submissions / "ann.ipynb")
    nbformat.write(solved(wrong_area=True, typed=True), submissions / "bob.ipynb")
    for learner in ("cy",):  # a folder per learner, the lesson's own name inside
        (submissions / learner).mkdir()
        nbformat.write(solved(hang=True), submissions / learner / LESSON.name)
        (submissions / learner / "notes.txt").write_text("a file beside the notebook")
    monkeypatch.chdir(FIXTURES)
    code = check_main(["1", str(submissions), "--cell-timeout", "8", "--csv",
                       str(tmp_path / "grades.csv"), "--json", str(tmp_path / "grades.json")])
    assert code == 1
    rows = {row["learner"]: row for row in csv.DictReader(open(tmp_path / "grades.csv", encoding="utf-8-sig"))}
    assert {learner: (row["check_circle_area"], row["check_unit_circle_area"], row["total"])
            for learner, row in rows.items()} == {
        "ann": ("1", "1", "2"), "bob": ("0", "1", "1"), "cy": ("0", "0", "0")}
    bob = rows["bob"]["check_circle_area feedback"]
    assert bob.startswith("✗ circle area: circle_area(2.0) is not right yet.") and bob.endswith(TYPED)
    assert "interrupted" in rows["cy"]["check_circle_area feedback"]
    assert [(row["learner"], row["total"]) for row in json.loads(
        (tmp_path / "grades.json").read_text())["learners"]] == [("ann", 2), ("bob", 1), ("cy", 0)]
    written = [path for folder in (submissions, FIXTURES, tmp_path) for path in folder.rglob("written.txt")]
    assert not written, f"a submission wrote outside its own folder: {written}"
    assert "3 learners (3 graded); 1 with every point." in capsys.readouterr().out


def test_a_submission_that_is_not_a_notebook_is_an_error_row(tmp_path, monkeypatch, capsys):
    (tmp_path / "dan.ipynb").write_text("this is not JSON")
    monkeypatch.chdir(FIXTURES)
    assert check_main(["1", str(tmp_path / "dan.ipynb")]) == 1
    out = capsys.readouterr().out
    assert any(line.split()[:2] == ["dan", "error"] for line in out.splitlines()), out
    assert "not a readable notebook" in out
