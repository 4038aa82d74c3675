"""A class's gradebook as an instructor and an LMS use it: a row per learner (roster, points,
total, feedback that names the cell that broke), nothing a spreadsheet runs as a formula, files
Canvas and Gradescope import, copies and other lessons reported, a killed run resumed, --jobs.

Fast tests build gradebooks from plain data; the slow ones grade the fixture course's tiny lesson
(tests/fixtures, 01_circle: no torch launches, about 5 s a notebook).
"""
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from course_lib.authoring import class_grading, exports, gradebook, sandbox
from course_lib.authoring.commands import check_main
from course_lib.authoring.grading import CellResult, Grade
from course_lib.authoring.submissions import find_submissions
from test_grading import FIXTURES, LESSON, SOLUTION, solved

EXERCISES = ["check_circle_area", "check_unit_circle_area"]
FORMULAS = ['=HYPERLINK("http://evil.example","click")', "+1", "-1", "@SUM(A1:A2)", "\tx", "\rx",
            " =1+1"]
RISKY_STARTS = ("=", "+", "-", "@", "\t", "\r")


def write(notebook, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, path)
    return path


def syntax_error():
    """The fixture lesson with a SyntaxError in its first exercise cell."""
    notebook = solved()
    cell = next(cell for cell in notebook.cells if cell.source.startswith("def circle_area"))
    cell.source = "def circle_area(radius)\n    return math.pi * radius ** 2"
    return notebook


# -- who handed in what --------------------------------------------------------------------------------

def test_copies_checkpoints_and_other_lessons_are_notes_never_learners_and_never_dropped(tmp_path):
    folder = tmp_path / "class"
    touch = [f"ann/{LESSON.name}", "ann/01_circle (1).ipynb", "ann/01_circle-Copy1.ipynb",
             f"ann/.ipynb_checkpoints/01_circle-checkpoint.ipynb", "ann/05_other.ipynb",
             "ann/scratch.ipynb", "bob.ipynb", "bob (1).ipynb",
             "cy/.ipynb_checkpoints/01_circle-checkpoint.ipynb", "dan/05_other.ipynb",
             "eve/01_circle - Copy.ipynb", "=HYPERLINK(1).ipynb"]
    for name in touch:
        write(solved(), folder / name)
    found = {submission.learner: submission
             for submission in find_submissions([folder, folder / "bob.ipynb"], LESSON.name)}
    assert sorted(found) == ["=HYPERLINK(1)", "ann", "bob", "cy", "dan", "eve"]
    assert found["ann"].notebook == folder / "ann" / LESSON.name
    assert len(found["ann"].notes) == 5 and all("not graded" in note for note in found["ann"].notes)
    assert found["bob"].notebook == folder / "bob.ipynb" and "bob (1).ipynb" in found["bob"].notes[0]
    assert found["cy"].notebook is None and "checkpoint" in found["cy"].notes[0]
    assert found["dan"].notebook is None and "lesson 05" in found["dan"].notes[0]
    assert found["eve"].notebook.name == "01_circle - Copy.ipynb" and "copy" in found["eve"].notes[0]
    assert found["=HYPERLINK(1)"].notebook.name == "=HYPERLINK(1).ipynb"


def test_a_checkpoint_copy_named_by_the_instructor_is_graded_and_noted(tmp_path):
    path = write(solved(), tmp_path / "cy" / ".ipynb_checkpoints" / "01_circle-checkpoint.ipynb")
    [submission] = find_submissions([path], LESSON.name)
    assert (submission.learner, submission.notebook) == ("cy", path)
    assert "chosen by the instructor" in submission.notes[0]


# -- what a learner reads: feedback that names the cell that broke --------------------------------------

def test_feedback_names_a_syntax_error_in_the_exercise_cell_not_only_the_later_name_error():
    notebook = syntax_error()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    outcomes = {1: "SyntaxError: expected ':'", 2: "NameError: name 'circle_area' is not defined",
                5: "NameError: name 'circle_area' is not defined",
                6: "NameError: name 'unit_circle_area' is not defined"}
    grade = Grade(Path("cy.ipynb"), [CellResult(index, cell, index not in outcomes, outcomes.get(index, ""))
                                     for index, cell in enumerate(code)], seconds=4.0)
    result = gradebook.learner_grade("cy", grade, roles=gradebook.cell_roles(SOLUTION))
    first = result.feedback["check_circle_area"]
    assert first.startswith("code cell 1 (exercise: def circle_area(radius)) failed: SyntaxError")
    assert "then its check: NameError" in first
    assert result.feedback["check_unit_circle_area"].startswith("code cell 5 (exercise: unit_circle_area")
    assert result.passed == {"check_circle_area": False, "check_unit_circle_area": False}


# -- points, roster, rows ------------------------------------------------------------------------------

def test_points_come_from_the_check_cells_metadata_and_the_instructor_overrides_them(tmp_path):
    notebook = nbformat.read(SOLUTION, as_version=4)
    next(cell for cell in notebook.cells if "check_circle_area(" in cell.source
         and cell.source.startswith("# NBVAL")).metadata["points"] = 3
    solution = write(notebook, tmp_path / SOLUTION.name)
    assert gradebook.course_points(solution) == {"check_circle_area": 3, "check_unit_circle_area": 1}
    (tmp_path / "points.txt").write_text("# instructor's points\ncheck_unit_circle_area = 2.5\n")
    assert gradebook.override_points(gradebook.course_points(solution),
                                     ["check_circle_area=4", str(tmp_path / "points.txt")]) == {
        "check_circle_area": 4, "check_unit_circle_area": 2.5}
    with pytest.raises(LookupError, match="no exercise 'check_area'.*check_circle_area"):
        gradebook.override_points({"check_circle_area": 1}, ["check_area=2"])


def graded(learner, passes, notes=()):
    return gradebook.LearnerGrade(learner, f"/class/{learner}.ipynb", gradebook.GRADED,
                                  dict(zip(EXERCISES, passes)),
                                  {name: "passed" if ok else "✗ wrong" for name, ok in zip(EXERCISES, passes)},
                                  list(notes), "2025-01-01T00:00:00+00:00", 4.2, True)


def canvas_roster(path: Path, learners) -> Path:
    """A roster as Canvas exports it: its columns, the Points Possible row, a student per row."""
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "Quiz 1 (111)"])
        writer.writerow(["    Points Possible", "", "", "", "", "10.00"])
        for number, (login, name) in enumerate(learners, start=1):
            writer.writerow([name, str(1000 + number), f"S{number:03}", login, "Sec 1", ""])
    return path


def test_the_roster_gives_every_learner_a_row_and_reports_submissions_of_learners_not_in_it(tmp_path):
    roster = gradebook.read_roster(canvas_roster(tmp_path / "roster.csv", [
        ("ann", "Ann Lee"), ("Bob", "Bob Ray"), ("gus", "Gus Moe")]))
    grades = [graded("ann", [True, True]), graded("bob", [False, True]), graded("zed", [True, True])]
    rows = gradebook.gradebook_rows(grades, [], LESSON.name, {name: 1.0 for name in EXERCISES}, roster)
    assert [(row.learner, row.status, row.total, row.in_roster) for row in rows] == [
        ("ann", "graded", 2, True), ("Bob", "graded", 1, True), ("gus", "missing", 0, True),
        ("zed", "graded", 2, False)]
    assert rows[2].feedback == {name: "no submission" for name in EXERCISES}
    assert rows[3].notes == [gradebook.NOT_IN_ROSTER]
    with pytest.raises(LookupError, match="no learner id column"):
        (tmp_path / "bad.csv").write_text("who,score\nann,1\n")
        gradebook.read_roster(tmp_path / "bad.csv")


# -- what an LMS and a spreadsheet read --------------------------------------------------------------

def rows_for(learners, roster=None):
    grades = [graded(learner, [True, index % 2 == 0]) for index, learner in enumerate(learners)]
    return gradebook.gradebook_rows(grades, [], LESSON.name, {"check_circle_area": 3.0,
                                                              "check_unit_circle_area": 1.0}, roster)


def test_no_cell_a_spreadsheet_opens_starts_like_a_formula(tmp_path):
    rows = rows_for(FORMULAS)
    for row in rows:
        row.name, row.notes = row.learner, ["-- a note that starts like a formula"]
    exports.write_gradebook_csv(rows, tmp_path / "grades.csv", EXERCISES)
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8-sig") as file:
        cells = list(csv.reader(file))
    risky = [cell for row in cells for cell in row if cell.lstrip(" ").startswith(RISKY_STARTS)]
    assert not risky, f"cells a spreadsheet would run as formulas: {risky}"
    assert sorted(row[0][1:] for row in cells[1:]) == sorted(FORMULAS)  # text, behind one '
    assert sorted(row[cells[0].index("total")] for row in cells[1:]) == ["3"] * 3 + ["4"] * 4


def read_as_canvas(path: Path, roster) -> dict:
    """What Canvas's gradebook import takes from the file: the columns of its export, the Points
    Possible row, a student found by ID, SIS User ID or SIS Login ID, a number per assignment."""
    with open(path, newline="", encoding="utf-8") as file:
        header, points_possible, *students = list(csv.reader(file))
    assert header[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
    assert len(header) == 6, "one assignment column"
    assert points_possible[0].strip() == "Points Possible"
    float(points_possible[5])
    assert len(students) == len(roster), "one row per roster learner, nobody else"
    scores = {}
    for student in students:
        canvas_id, sis_user_id, sis_login_id = student[1:4]
        assert canvas_id or sis_user_id or sis_login_id, f"Canvas cannot find {student[0]}"
        scores[sis_login_id] = (canvas_id, sis_user_id, float(student[5]))
    return {"assignment": header[5], "points_possible": float(points_possible[5]), "scores": scores}


def test_canvas_imports_the_export_as_it_is(tmp_path):
    roster = gradebook.read_roster(canvas_roster(tmp_path / "roster.csv", [
        ("ann", "Lee, Ann"), ("bob", "=HYPERLINK(\"x\")"), ("gus", "Moe, Gus")]))
    rows = gradebook.gradebook_rows([graded("ann", [True, True]), graded("bob", [True, False]),
                                     graded("zed", [True, True])], [], LESSON.name,
                                    {"check_circle_area": 3.0, "check_unit_circle_area": 1.0}, roster)
    exports.write_canvas(rows, tmp_path / "canvas.csv", "01 circle (4242)")
    canvas = read_as_canvas(tmp_path / "canvas.csv", roster)
    assert canvas["assignment"] == "01 circle (4242)" and canvas["points_possible"] == 4
    assert canvas["scores"] == {"ann": ("1001", "S001", 4), "bob": ("1002", "S002", 3),
                                "gus": ("1003", "S003", 0)}


def read_as_gradescope(path: Path, roster, points: dict) -> dict:
    """What Gradescope's score import takes: Email to find the learner, a number per question."""
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == len(roster), "one row per roster learner, nobody else"
    questions = [f"{number}: {name} ({value:g} pts)" for number, (name, value) in
                 enumerate(points.items(), start=1)]
    scores = {}
    for row in rows:
        assert "@" in row["Email"], f"Gradescope cannot find {row['Name']} without an email"
        values = [float(row[question]) for question in questions]
        assert float(row["Total Score"]) == sum(values) and float(row["Max Points"]) == sum(points.values())
        scores[row["Email"]] = values
    return scores


def test_gradescope_imports_the_export_as_it_is(tmp_path):
    (tmp_path / "roster.csv").write_text("learner,name,email\nann,Ann,ann@uni.edu\n"
                                         "bob,Bob,bob@uni.edu\ngus,Gus,gus@uni.edu\n")
    roster = gradebook.read_roster(tmp_path / "roster.csv")
    points = {"check_circle_area": 3.0, "check_unit_circle_area": 1.0}
    rows = gradebook.gradebook_rows([graded("ann", [True, True]), graded("bob", [True, False]),
                                     graded("zed", [True, True])], [], LESSON.name, points, roster)
    assert exports.write_gradescope(rows, tmp_path / "gradescope.csv", points) == []
    assert read_as_gradescope(tmp_path / "gradescope.csv", roster, points) == {
        "ann@uni.edu": [3, 1], "bob@uni.edu": [3, 0], "gus@uni.edu": [0, 0]}


# -- the state file: each grade kept as it is given ----------------------------------------------------

def test_the_state_file_keeps_whole_lines_refuses_another_solution_and_a_silent_restart(tmp_path):
    state = class_grading.StateFile(tmp_path / "grades.state.jsonl", SOLUTION)
    assert state.start(resume=False) == {}
    state.append(graded("ann", [True, True]))
    with open(state.path, "a", encoding="utf-8") as file:
        file.write('{"learner": "bob", "status": "gra')  # killed while writing
    with pytest.raises(class_grading.StateFileError, match="--resume"):
        state.start(resume=False)
    assert list(state.start(resume=True)) == ["ann"]
    assert state.path.read_text().endswith("}\n"), "the cut line is gone"
    other = write(syntax_error(), tmp_path / "other" / SOLUTION.name)
    with pytest.raises(class_grading.StateFileError, match="another version"):
        class_grading.StateFile(state.path, other).start(resume=True)


def test_each_learner_is_judged_on_inputs_of_its_own_and_resume_keeps_them(tmp_path, monkeypatch):
    """A seed offset drawn per submission (the grading-time inputs, judge.py), kept in the state
    file; a learner graded again on --resume (a changed notebook) is judged on the same inputs."""
    given = {}

    def grade_one(submission, solution, timeout_s, cell_timeout_s, sandbox, threads, roles, offset):
        given.setdefault(submission.learner, []).append(offset)
        return gradebook.LearnerGrade(submission.learner, status=gradebook.GRADED, seed_offset=offset,
                                      sha256=class_grading.file_sha256(submission.notebook)), False

    monkeypatch.setattr(class_grading, "_grade_one", grade_one)
    for learner in ("ann", "bob", "cy"):
        write(solved(), tmp_path / "class" / learner / LESSON.name)
    state = tmp_path / "grades.state.jsonl"
    found = find_submissions([tmp_path / "class"], LESSON.name)
    first = class_grading.grade_class(SOLUTION, found, state=state)
    offsets = {grade.learner: grade.seed_offset for grade in first}
    assert len(set(offsets.values())) == 3 and 0 not in offsets.values()
    assert {learner: line["seed_offset"] for learner, line in state_records(state).items()} == offsets
    write(solved(wrong_area=True), tmp_path / "class" / "bob" / LESSON.name)  # handed in again
    class_grading.grade_class(SOLUTION, found, state=state, resume=True)
    assert given == {"ann": [offsets["ann"]], "bob": [offsets["bob"]] * 2, "cy": [offsets["cy"]]}


def test_jobs_share_the_cores():
    assert class_grading.threads_per_job(1, cores=16) == 8
    assert class_grading.threads_per_job(4, cores=16) == 2
    assert class_grading.threads_per_job(8, cores=2) == 1


# -- a class graded for real: the fixture lesson --------------------------------------------------------

CLASS = {"ann": solved, "cy": syntax_error}
VARYING = ("graded_at", "seconds", "submission",  # the same class, graded in another folder,
           "seed_offset")  # on inputs drawn for each grading


@pytest.fixture(scope="module")
def sealing():
    """No flag where a sandbox starts (graded sealed, as an instructor would); else --no-sandbox."""
    return [] if sandbox.why_unavailable() == "" else ["--no-sandbox"]


def make_class(folder: Path) -> Path:
    for learner, notebook in CLASS.items():
        write(notebook(), folder / learner / LESSON.name)
    return folder


def state_records(path: Path) -> dict:
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[1:]]
    assert len(lines) == len({line["learner"] for line in lines}), "a learner graded twice"
    return {line["learner"]: line for line in lines}


def comparable(records: dict) -> dict:
    return {learner: {key: value for key, value in record.items() if key not in VARYING}
            for learner, record in records.items()}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory, sealing):
    """The class graded once, one submission at a time, without interruption."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    make_class(folder / "class")
    cwd = os.getcwd()
    os.chdir(FIXTURES)
    try:
        code = check_main(["1", str(folder / "class"), "--csv", str(folder / "grades.csv"),
                           "--jobs", "1", *sealing])
    finally:
        os.chdir(cwd)
    assert code == 1
    return folder


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_uninterrupted_class_gradebook(graded_class, sealing):
    records = state_records(graded_class / "grades.state.jsonl")
    assert {learner: record["passed"] for learner, record in records.items()} == {
        "ann": {"check_circle_area": True, "check_unit_circle_area": True},
        "cy": {"check_circle_area": False, "check_unit_circle_area": False}}
    assert records["cy"]["feedback"]["check_circle_area"].startswith(
        "code cell 1 (exercise: def circle_area(radius)) failed: SyntaxError")
    with open(graded_class / "grades.csv", newline="", encoding="utf-8-sig") as file:
        rows = {row["learner"]: row for row in csv.DictReader(file)}
    assert {learner: (row["total"], row["maximum"], row["sealed"]) for learner, row in rows.items()} == {
        "ann": ("2", "2", "no" if sealing else "yes"), "cy": ("0", "2", "no" if sealing else "yes")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_jobs_at_a_time_give_the_same_grades_as_one(graded_class, sealing, tmp_path, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    assert check_main(["1", str(graded_class / "class"), "--csv", str(tmp_path / "grades.csv"),
                       "--jobs", "2", *sealing]) == 1
    assert comparable(state_records(tmp_path / "grades.state.jsonl")) == comparable(
        state_records(graded_class / "grades.state.jsonl"))


def freeze_and_kill(pid: int) -> None:
    """SIGKILL a process and everything it started: stopped first, so none starts another."""
    def children(parent):
        found = []
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
        return found

    tree, queue = [], [pid]
    while queue:
        current = queue.pop()
        tree.append(current)
        try:
            os.kill(current, signal.SIGSTOP)
        except ProcessLookupError:
            continue
        queue += children(current)
    for process in tree:
        try:
            os.kill(process, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_once_graded(process, state: Path, timeout_s: float = 200) -> None:
    """SIGKILL `process` (and all it started) once the state file holds its first learner's grade."""
    try:
        deadline = time.monotonic() + timeout_s
        while not (state.exists() and len(state.read_text().splitlines()) >= 2):
            assert process.poll() is None, "the grading ended before it could be killed"
            assert time.monotonic() < deadline, f"no learner graded in {timeout_s:g} s"
            time.sleep(0.05)
    finally:
        freeze_and_kill(process.pid)
        process.wait()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_class_grading_killed_after_its_first_learner_resumes_with_nothing_lost(
        graded_class, sealing, tmp_path, monkeypatch):
    make_class(tmp_path / "class")
    command = [sys.executable, "-m", "course_lib", "check", "1", str(tmp_path / "class"),
               "--csv", str(tmp_path / "grades.csv"), *sealing]
    state = tmp_path / "grades.state.jsonl"
    (tmp_path / "tmp").mkdir()  # what the killed run leaves in its temporary folders stays here
    process = subprocess.Popen(command, cwd=FIXTURES, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")))
    kill_once_graded(process, state)
    first = state_records(state)
    assert len(first) == 1 and not (tmp_path / "grades.csv").exists()
    monkeypatch.chdir(FIXTURES)
    assert check_main(["1", str(tmp_path / "class"), "--csv", str(tmp_path / "grades.csv"),
                       *sealing]) == 2, "a second run must not start over without --resume"
    assert check_main(["1", str(tmp_path / "class"), "--csv", str(tmp_path / "grades.csv"),
                       "--resume", *sealing]) == 1
    resumed = state_records(state)
    assert comparable(resumed) == comparable(state_records(graded_class / "grades.state.jsonl"))
    [(learner, record)] = first.items()
    assert resumed[learner]["graded_at"] == record["graded_at"], "graded again after the kill"
    assert resumed[learner]["seed_offset"] == record["seed_offset"] != 0
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8-sig") as file:
        assert sorted(row["learner"] for row in csv.DictReader(file)) == sorted(CLASS)
