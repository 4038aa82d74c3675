"""Grading one learner's notebook: the course's check cells put back, then the notebook under nbval.

`grade` returns a Grade (each check cell's result); gradebook.py grades a class with it, and
commands.py prints it for `python -m course_lib check`.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ..checks.engine import FAILED_MARK
from ..runtime.shared.process_group import signal_group
from .cells import is_check_cell, is_code
from .layout import SOLUTIONS
from .restore import restore_check_cells
from .sanitize import write_sanitize_file
from .scrub import uncolored

EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*$", re.MULTILINE)
VERDICT_LINE = re.compile(rf"^{FAILED_MARK} .*", re.MULTILINE | re.DOTALL)
CELL_NAME = re.compile(r"Cell (\d+)$")
AFTER_A_TIMEOUT = "Previous cell timed out"
DEFAULT_TIMEOUT_S = 900
DEFAULT_CELL_TIMEOUT_S = 300
MAX_SIBLING_BYTES = 20 * 2**20  # files beside a submission copied with it (lesson 14's script)


@dataclass
class CellResult:
    """One code cell's outcome under nbval; `index` counts code cells only, as nbval does."""

    index: int
    cell: dict
    passed: bool
    message: str = ""


@dataclass
class Grade:
    """One submission's grade: each check cell's result, and what was put back before grading."""

    notebook: Path
    results: list = field(default_factory=list)   # [CellResult] of the restored notebook
    notes: dict = field(default_factory=dict)     # {exercise: why its check cell was put back}
    ignored: list = field(default_factory=list)   # check cells the course does not have
    seconds: float = 0.0
    problem: str = ""                             # the notebook could not be graded at all

    @property
    def checks(self) -> list:
        return [result for result in self.results if is_check_cell(result.cell)]


class GradingRunError(RuntimeError):
    """nbval could not run the notebook at all (bad JSON, no kernel, pytest missing, a timeout)."""


def run_nbval(notebook: Path, timeout_s: float = DEFAULT_TIMEOUT_S, sanitize_file=None,
              cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S, env=None) -> list:
    """Run `notebook` under nbval (lax, sanitized, this Python as kernel) in its own folder: one
    CellResult per code cell, in order. A cell past `cell_timeout_s` is interrupted and fails;
    the notebook past `timeout_s` raises GradingRunError."""
    notebook = Path(notebook).resolve()
    code_cells = [cell for cell in nbformat.read(notebook, as_version=4).cells if is_code(cell)]
    with tempfile.TemporaryDirectory(prefix="course-grade-") as scratch:
        report = Path(scratch) / "report.xml"
        command = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
                   "--nbval-sanitize-with", str(sanitize_file or write_sanitize_file(Path(scratch))),
                   f"--nbval-cell-timeout={cell_timeout_s:g}",
                   "-p", "no:cacheprovider", "--noconftest", "--color=no", "-q",
                   "--rootdir", str(notebook.parent), f"--junitxml={report}", str(notebook)]
        output = run_with_deadline(command, notebook.parent, timeout_s, env)
        if output is None:
            raise GradingRunError(f"{notebook.name} took over {timeout_s:g} s under nbval; "
                                  f"look for a cell that hangs")
        if not report.exists():
            advice = ("nbval is not installed here: pip install nbval\n"
                      if "unrecognized arguments: --nbval" in output else "")
            raise GradingRunError(f"nbval could not run {notebook.name}:\n{advice}{output[-2000:]}")
        outcomes = read_junit(report)
    return [CellResult(index, cell, *outcomes.get(index, (False, "not run by nbval")))
            for index, cell in enumerate(code_cells)]


def run_with_deadline(command, folder: Path, timeout_s: float, env=None):
    """Run `command` in `folder`; its output, or None if it ran out of time. On timeout the whole
    process group goes (pytest and the notebook's kernel), so no kernel outlives the grading."""
    process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, env=env,
                               stderr=subprocess.STDOUT, text=True,
                               start_new_session=(os.name == "posix"))
    try:
        return process.communicate(timeout=timeout_s)[0]
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        process.communicate()
        return None


def read_junit(report: Path) -> dict:
    """{code cell index: (passed, message)} from pytest's junit XML report."""
    outcomes = {}
    for case in ElementTree.parse(report).iter("testcase"):
        cell = CELL_NAME.search(case.get("name", ""))
        if cell is None:
            continue
        problem = next((found for found in map(case.find, ("failure", "error", "skipped"))
                        if found is not None), None)
        passed = problem is None  # nbval marks the cells after a timed-out cell xfail: skipped
        outcomes[int(cell.group(1))] = (passed, "" if passed else failure_message(
            problem.text or problem.get("message") or ""))
    return outcomes


def failure_message(text: str) -> str:
    """A grader's verdict (from its ✗ line), the exception a cell raised, or why outputs differ."""
    text = uncolored(text)
    if "Timeout of" in text and "exceeded executing cell" in text:
        return text[text.index("Timeout of"):].splitlines()[0] + " (interrupted)"
    if AFTER_A_TIMEOUT in text:  # nbval's xfail of every cell after one that timed out
        return ("not graded: a cell before it ran past the cell timeout and was interrupted, "
                "so what it defines is missing")
    traceback = text.split("Traceback:", 1)[-1]
    verdict = VERDICT_LINE.search(traceback)
    if verdict:
        return verdict.group(0).split("\n\n\n", 1)[0].strip()
    exceptions = list(EXCEPTION_LINE.finditer(traceback))
    if exceptions:
        last = traceback[exceptions[-1].start():]
        # the message ends where pytest's report resumes (a blank line, then its own text)
        return last.split("\n\n", 1)[0].strip()
    if "Cell outputs differ" in text:
        return ("its output differs from the expected one: the grader printed something else "
                "than its verdict")
    return text.strip().splitlines()[-1] if text.strip() else "failed"


def course_solution(notebook: Path, root: Path) -> Path:
    """The solution whose check cells grade `notebook` (same NN_topic name, in root/solutions)."""
    path = root / SOLUTIONS / notebook.name
    if not path.is_file():
        raise LookupError(f"no {SOLUTIONS}/{notebook.name} in {root}: grading puts the course's "
                          f"check cells back from it; run this from the course folder")
    return path


def grade(submission: Path, solution: Path, timeout_s: float = DEFAULT_TIMEOUT_S,
          cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S, sanitize_file=None) -> Grade:
    """Grade `submission` with the check cells of `solution`, in a folder of its own (the files
    beside the submission copied in), with this process's environment but its own TMPDIR."""
    started = time.monotonic()
    result = Grade(Path(submission))
    with tempfile.TemporaryDirectory(prefix="course-submission-") as folder:
        folder = Path(folder)
        try:
            learner_notebook = nbformat.read(submission, as_version=4)
        except Exception as error:  # not JSON, not a notebook: a grade of its own, not a crash
            result.problem = f"{Path(submission).name} is not a readable notebook ({error})"[:300]
            return result
        restored = restore_check_cells(learner_notebook, nbformat.read(solution, as_version=4))
        result.notes, result.ignored = restored.notes, restored.ignored
        _copy_siblings(Path(submission), folder)
        graded = folder / solution.name
        nbformat.write(restored.notebook, graded)
        (folder / "tmp").mkdir()
        env = dict(os.environ, TMPDIR=str(folder / "tmp"))
        try:
            result.results = run_nbval(graded, timeout_s, sanitize_file, cell_timeout_s, env)
        except GradingRunError as error:
            result.problem = str(error)
    result.seconds = time.monotonic() - started
    return result


def _copy_siblings(submission: Path, folder: Path) -> None:
    """The files beside a submission that a lesson reads (lesson 14's train_ddp.py): every file
    that is not a notebook, while they add up to MAX_SIBLING_BYTES."""
    budget = MAX_SIBLING_BYTES
    for path in sorted(submission.resolve().parent.iterdir()):
        if path.is_file() and path.suffix != ".ipynb" and path.stat().st_size <= budget:
            shutil.copy2(path, folder / path.name)
            budget -= path.stat().st_size
