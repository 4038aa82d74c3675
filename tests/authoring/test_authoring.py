"""The notebook pipeline: build-lessons, check and run-solutions, on the fixture course.

tests/fixtures holds a tiny course (one solution, its lesson); the tests execute it for real.
"""
import shutil
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from course_lib.authoring.commands import build_lessons_main, check_main, run_solutions_main
from course_lib.authoring.build import LessonBuildError, build_lesson, render, stub_regions
from course_lib.authoring.grading import GradingRunError, failure_message, run_nbval
from course_lib.authoring.layout import find_lesson, matches_numbers
from course_lib.authoring.run_solutions import describe_device
from course_lib.authoring.sanitize import render as render_sanitize_rules
from course_lib.authoring.scrub import paths_left, scrub_text

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures"
SOLUTION = FIXTURES / "solutions" / "01_circle.ipynb"
STUB = 'raise NotImplementedError("Exercise: write this part, then run the check cell below")'


@pytest.fixture
def course(tmp_path):
    """A writable copy of the fixture course."""
    shutil.copytree(FIXTURES, tmp_path / "course")
    return tmp_path / "course"


def code_notebook(*sources):
    return new_notebook(cells=[new_code_cell(source) for source in sources],
                        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                 "language": "python"}})


# build-lessons

def test_stub_keeps_the_code_around_the_region_and_its_indent():
    source = ("def area(r):\n    scale = 1\n    ### BEGIN SOLUTION\n    value = 3.14 * r * r\n"
              "    ### END SOLUTION\n    return value * scale\n")
    assert stub_regions(source, "x") == ("def area(r):\n    scale = 1\n    # YOUR CODE HERE\n"
                                         f"    {STUB}\n    return value * scale\n")


def test_stub_replaces_every_region_of_a_cell():
    source = "### BEGIN SOLUTION\na = 1\n### END SOLUTION\nb = 2\n### BEGIN SOLUTION\nc = 3\n### END SOLUTION"
    assert stub_regions(source, "x") == f"# YOUR CODE HERE\n{STUB}\nb = 2\n# YOUR CODE HERE\n{STUB}"


def test_stub_keeps_a_regions_step_comments_in_order_as_a_skeleton():
    source = ("def save(state, path):\n    ### BEGIN SOLUTION\n    # Step 1: write a temporary file\n"
              "    with open(path, 'wb') as f:\n        # Step 2: flush and fsync it\n"
              "        f.flush()  # not a step\n    # Step 3: rename it over path\n"
              "    ### END SOLUTION\n")
    assert stub_regions(source, "x") == (
        "def save(state, path):\n    # YOUR CODE HERE\n    # Step 1: write a temporary file\n"
        "    # Step 2: flush and fsync it\n    # Step 3: rename it over path\n"
        f"    {STUB}\n")
    markdown = "### BEGIN SOLUTION\n# Step 1: an answer\n### END SOLUTION"
    assert stub_regions(markdown, "x", markdown=True) == "YOUR ANSWER HERE"


@pytest.mark.parametrize("source, complaint", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without a ### BEGIN SOLUTION"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside the one opened at line 1"),
])
def test_unbalanced_markers_name_the_cell_and_the_line(source, complaint):
    with pytest.raises(LessonBuildError, match=complaint) as caught:
        stub_regions(source, "03_x.ipynb cell 4")
    assert str(caught.value).startswith("03_x.ipynb cell 4: line")


def test_lesson_drops_solution_cells_and_keeps_no_output_not_even_a_verdict():
    solution = nbformat.read(SOLUTION, as_version=4)
    lesson = build_lesson(solution, SOLUTION.name, FIXTURES)
    assert len(lesson.cells) == len(solution.cells) - 1
    assert not any("solution only" in cell.source for cell in lesson.cells)
    checks = [cell for cell in lesson.cells if cell.source.startswith("# NBVAL_CHECK_OUTPUT")]
    assert len(checks) == 2
    code = [cell for cell in lesson.cells if cell.cell_type == "code"]
    assert all(cell.outputs == [] and cell.execution_count is None for cell in code)
    assert any(cell.source.startswith("# NBVAL_IGNORE_OUTPUT") for cell in code)
    assert STUB in lesson.cells[3].source and "math.pi" not in lesson.cells[3].source
    assert "### BEGIN SOLUTION" in solution.cells[3].source  # the solution itself is untouched


def test_build_is_deterministic_and_the_fixture_lesson_is_up_to_date(course, capsys):
    assert build_lessons_main(["--check", "--root", str(FIXTURES)]) == 0
    solution = nbformat.read(SOLUTION, as_version=4)
    assert render(build_lesson(solution, SOLUTION.name)) == render(build_lesson(solution, SOLUTION.name))
    (course / "lessons" / SOLUTION.name).unlink()
    assert build_lessons_main(["--root", str(course)]) == 0
    assert (course / "lessons" / SOLUTION.name).read_bytes() == \
        (FIXTURES / "lessons" / SOLUTION.name).read_bytes()


def test_check_reports_stale_missing_and_orphan_lessons(course, capsys):
    solution = nbformat.read(course / "solutions" / SOLUTION.name, as_version=4)
    solution.cells[0].source += "\nA new sentence."
    nbformat.write(solution, course / "solutions" / SOLUTION.name)
    shutil.copy(course / "lessons" / SOLUTION.name, course / "lessons" / "02_orphan.ipynb")
    assert build_lessons_main(["--check", "--root", str(course)]) == 1
    out = capsys.readouterr().out
    assert "lessons/01_circle.ipynb is out of date" in out
    assert "lessons/02_orphan.ipynb has no solutions/02_orphan.ipynb" in out
    assert "run `python -m course_lib build-lessons`" in out
    (course / "lessons" / SOLUTION.name).unlink()
    assert build_lessons_main(["--check", "--root", str(course)]) == 1
    assert "lessons/01_circle.ipynb is missing" in capsys.readouterr().out


def test_an_unexecuted_check_cell_stops_its_lesson_with_advice_and_not_the_others(course, capsys):
    nbformat.write(code_notebook("# NBVAL_CHECK_OUTPUT\ncheck_x(x)"),
                   course / "solutions" / "02_unrun.ipynb")
    (course / "lessons" / SOLUTION.name).unlink()
    assert build_lessons_main(["--root", str(course)]) == 1
    out = capsys.readouterr().out
    assert "solutions/02_unrun.ipynb cannot be built" in out and "run-solutions --only 02 --write" in out
    assert "wrote       lessons/01_circle.ipynb" in out  # the good lesson is still built
    assert not (course / "lessons" / "02_unrun.ipynb").exists()


def test_only_builds_the_lessons_named(course, capsys):
    nbformat.write(code_notebook("# NBVAL_CHECK_OUTPUT\ncheck_x(x)"),
                   course / "solutions" / "02_unrun.ipynb")
    (course / "lessons" / SOLUTION.name).unlink()
    assert build_lessons_main(["--root", str(course), "--only", "1"]) == 0
    out = capsys.readouterr().out
    assert "wrote       lessons/01_circle.ipynb" in out and "02_unrun" not in out


@pytest.mark.parametrize("outputs", [
    [nbformat.v4.new_output("stream", name="stdout", text="launch: 2 ranks, gloo\n✓ x: passed\n")],
    [nbformat.v4.new_output("stream", name="stdout", text="✓ x: passed\n"),
     nbformat.v4.new_output("stream", name="stderr", text="UserWarning: slow\n")],
], ids=["launch banner", "warning"])
def test_a_check_cell_storing_more_than_grader_lines_stops_the_build(outputs):
    cell = new_code_cell("# NBVAL_CHECK_OUTPUT\ncheck_x(x)", outputs=outputs, execution_count=1)
    with pytest.raises(LessonBuildError, match="output='none'"):
        build_lesson(new_notebook(cells=[cell]), "03_x.ipynb")


# machine paths, sanitize rules, lesson lookup

def test_scrub_removes_machine_paths(tmp_path):
    text = (f"{tmp_path}/solutions/data.pt; {Path.home()}/x; "
            "File /tmp/ipykernel_4242/123456.py:3")
    scrubbed = scrub_text(text, tmp_path)
    assert scrubbed == "./solutions/data.pt; ~/x; File <notebook cell>:3"
    nb = code_notebook("print(1)")
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text=text)]
    assert paths_left(nb) and not paths_left(code_notebook("print(1)"))


def test_tests_sanitize_file_is_the_shipped_rules():
    assert (TESTS / "sanitize.cfg").read_text(encoding="utf-8") == render_sanitize_rules(), (
        "regenerate it: python -c 'from course_lib.authoring.sanitize import render; "
        "print(render(), end=\"\")' > tests/sanitize.cfg")


def test_find_lesson_by_number_or_path_and_explain_unknown_numbers():
    assert find_lesson("1", FIXTURES).name == find_lesson("01", FIXTURES).name == SOLUTION.name
    assert find_lesson(str(SOLUTION), FIXTURES) == SOLUTION
    with pytest.raises(LookupError, match="no lesson '7'.*lessons there: 01"):
        find_lesson("7", FIXTURES)
    assert matches_numbers(Path("03_x.ipynb"), ["1", "3,4"]) and matches_numbers(Path("03_x.ipynb"), [])
    assert not matches_numbers(Path("03_x.ipynb"), ["04"])


# check

@pytest.mark.slow
def test_check_grades_each_exercise_of_the_fixture_lesson(monkeypatch, capsys):
    monkeypatch.chdir(FIXTURES)
    assert check_main(["1"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  check_circle_area" in out and "0 of 2 exercises pass." in out
    assert "✗ circle area is not right yet." in out
    assert "hint:     replace the `raise NotImplementedError(...)`" in out
    assert "note  exercise cell (code cell 5) failed:" in out and "FAIL  check_unit_circle_area" in out
    assert check_main(["9"]) == 2
    assert "no lesson '9'" in capsys.readouterr().err


@pytest.mark.slow
def test_grading_a_hanging_notebook_stops_at_the_timeout(tmp_path):
    nbformat.write(code_notebook("import time\ntime.sleep(60)"), tmp_path / "01_hang.ipynb")
    with pytest.raises(GradingRunError, match="took over 6 s under nbval"):
        run_nbval(tmp_path / "01_hang.ipynb", timeout_s=6)


def test_failure_message_explains_differing_output():
    text = "Notebook cell execution failed\nCell 4: Cell outputs differ\n\nInput:\ncheck_x(x)\n"
    assert "output differs from the expected one" in failure_message(text)
    assert failure_message("Traceback:\n#x1B[0;31mValueError#x1B[0m: bad\n  shape\n\nmore") == \
        "ValueError: bad\n  shape"


# run-solutions

@pytest.mark.slow
def test_run_solutions_writes_outputs_without_machine_paths(course, capsys):
    executed = course / "solutions" / SOLUTION.name
    before = nbformat.read(executed, as_version=4)
    for cell in before.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nbformat.write(before, executed)
    assert run_solutions_main(["--root", str(course), "--write", "--timeout", "120"]) == 0
    out = capsys.readouterr().out
    assert "[1/1] running 01_circle.ipynb" in out and "01_circle.ipynb  pass" in out
    after = nbformat.read(executed, as_version=4)
    assert paths_left(after) == [] and "now run `python -m course_lib build-lessons`" in out
    assert "working in ./solutions" in after.cells[6].outputs[0]["text"]
    assert after.cells[5].outputs[0]["text"] == "✓ circle area: passed\n"


@pytest.mark.slow
def test_run_solutions_reports_failures_and_timeouts_and_writes_neither(course, capsys):
    broken, slow = course / "solutions" / "02_broken.ipynb", course / "solutions" / "03_slow.ipynb"
    nbformat.write(code_notebook("x = 1", "raise ValueError('bad shape')"), broken)
    nbformat.write(code_notebook("import time\ntime.sleep(60)"), slow)
    assert run_solutions_main(["--root", str(course), "--only", "2,3", "--timeout", "10",
                               "--write"]) == 1
    rows_before = capsys.readouterr().out.splitlines()
    rows = rows_before[-3:]
    assert rows[0].startswith("notebook") and "device" in rows[0]
    assert rows[1].startswith("02_broken.ipynb  FAIL ValueError: bad shape")
    assert rows[2].startswith("03_slow.ipynb") and "FAIL timed out after 10 s" in rows[2]
    assert nbformat.read(broken, as_version=4).cells[0].outputs == []
    assert "left solutions/02_broken.ipynb as it was, since it failed" in "\n".join(rows_before)
    assert run_solutions_main(["--root", str(course), "--only", "7"]) == 2


def test_device_names_gpus_or_cpu_cores_and_the_backend_launch_really_picks(monkeypatch):
    import torch.distributed as dist

    from course_lib.authoring import run_solutions as run

    assert describe_device().startswith("cpu x") or "(nccl)" in describe_device()
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    for gpus in (2, 1):
        monkeypatch.setattr(run.env, "gpu_count", lambda: gpus)
        monkeypatch.setattr(run, "gpu_descriptions", lambda: [("NVIDIA H200", 150 * 10**9)] * gpus)
        described = describe_device()
        if gpus == 2:
            assert described == "2x NVIDIA H200 (nccl)"
        else:  # launch(nprocs=2) on a 1-GPU node runs gloo on the CPU: say so, not "(nccl)"
            assert described == "1x NVIDIA H200 (gloo: 2 ranks but only 1 GPU, ranks run on the CPU)"
