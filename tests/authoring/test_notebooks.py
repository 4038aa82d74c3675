"""The course's notebooks under nbval: every solution passes, every unsolved lesson fails in its
exercises (never in setup), lessons/ is up to date, and no output names a machine path.

Runs on solutions/ and lessons/, and on the fixture course in tests/fixtures so the machinery is
exercised before the first lesson exists. Each notebook takes about a minute on 2 CPU cores;
they run two at a time, on copies in folders of their own (notebook_runs.py), the performance
lessons alone.
"""
from pathlib import Path

import nbformat
import pytest

from course_lib.authoring.build import build_lessons
from course_lib.authoring.cells import is_check_cell, is_exercise_cell
from course_lib.authoring.layout import LESSONS, SOLUTIONS, course_notebooks
from course_lib.authoring.scrub import paths_left
from notebook_runs import NotebookRuns

pytestmark = pytest.mark.slow  # every notebook under nbval

TESTS = Path(__file__).resolve().parents[1]
ROOTS = [TESTS.parent, TESTS / "fixtures"]
SANITIZE_FILE = TESTS / "sanitize.cfg"
NOTEBOOK_TIMEOUT_S = 600


# Solutions whose cells lean most on torch APIs that change between releases: the collectives
# (reduce_scatter, all_to_all on gloo), autocast's op lists, DTensor and distributed checkpoints,
# the flight recorder and torchfrtrace, FSDP2 and ZeroRedundancyOptimizer, DTensor's parallel styles,
# the pipelining schedules. CI runs these on the newest torch as well as the pinned one (.ci/run).
TORCH_API_LESSONS = {"03", "06", "07", "13", "16", "17", "18", "19", "20"}

# Lessons whose cells measure speed (what a step, an overlap, a speedup costs): under nbval they run
# with no other notebook beside them (notebook_runs.py runs the others two at a time).
PERFORMANCE_LESSONS = {"01", "09", "10", "15"}
NBVAL_TESTS = ("test_solution_passes_nbval", "test_unsolved_lesson_fails_in_every_check_and_nowhere_else")


def notebooks(folder_name):
    found = [path for root in ROOTS for path in course_notebooks(root / folder_name)]
    return [pytest.param(path, id=str(path.relative_to(TESTS.parent)),
                         marks=[pytest.mark.torch_api] if folder_name == SOLUTIONS and root_is_course(path)
                         and path.name[:2] in TORCH_API_LESSONS else [])
            for path in found]


def root_is_course(path) -> bool:
    return path.resolve().parent.parent == TESTS.parent


def runs_alone(notebook) -> bool:
    return root_is_course(notebook) and notebook.name[:2] in PERFORMANCE_LESSONS


@pytest.fixture(scope="module")
def nbval_runs(request):
    """The selected notebooks' nbval runs, in the tests' order, two at a time."""
    order = [item.callspec.params["notebook"] for item in request.session.items
             if item.module is request.module and item.originalname in NBVAL_TESTS]
    runs = NotebookRuns(order, runs_alone, NOTEBOOK_TIMEOUT_S, SANITIZE_FILE)
    yield runs
    runs.wait_all()


def describe_failures(results) -> str:
    return "\n".join(f"code cell {result.index}:\n{result.cell.source}\n--> {result.message}"
                     for result in results if not result.passed)


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S + 60)
@pytest.mark.parametrize("notebook", notebooks(SOLUTIONS))
def test_solution_passes_nbval(notebook, nbval_runs):
    results = nbval_runs.results(notebook)
    assert all(result.passed for result in results), (
        f"{notebook.name} fails under nbval; fix it, then store its outputs with "
        f"`python -m course_lib run-solutions --only {notebook.name[:2]} --write`:\n"
        + describe_failures(results))


@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S + 60)
@pytest.mark.parametrize("notebook", notebooks(LESSONS))
def test_unsolved_lesson_fails_in_every_check_and_nowhere_else(notebook, nbval_runs):
    results = nbval_runs.results(notebook)
    checks = [result for result in results if is_check_cell(result.cell)]
    assert checks, f"{notebook.name} has no check cell (# NBVAL_CHECK_OUTPUT) to grade"
    passing_checks = [result.index for result in checks if result.passed]
    assert not passing_checks, (
        f"check cells {passing_checks} of {notebook.name} pass on the stubs: a grader that "
        f"cannot fail is a defect")
    outside_exercises = [result for result in results if not result.passed
                         and not is_check_cell(result.cell) and not is_exercise_cell(result.cell)]
    assert not outside_exercises, (
        f"{notebook.name} fails outside its exercises; a later cell must not depend on an "
        f"unfinished exercise (use the library's reference implementation):\n"
        + describe_failures(outside_exercises))


@pytest.mark.parametrize("root", ROOTS, ids=["course", "fixtures"])
def test_lessons_are_up_to_date(root):
    problems = build_lessons(root, check=True)
    assert not problems, ("; ".join(problems)
                          + "\nrun `python -m course_lib build-lessons` and commit lessons/")


@pytest.mark.parametrize("notebook", notebooks(SOLUTIONS) + notebooks(LESSONS))
def test_outputs_name_no_machine_path(notebook):
    left = paths_left(nbformat.read(notebook, as_version=4))
    assert not left, (f"{notebook.name} has machine paths in its outputs ({', '.join(left)}); "
                      f"store outputs with `python -m course_lib run-solutions --write`, "
                      f"which scrubs them, then rebuild the lessons")
