"""Grading a notebook with nbval: which cells pass, and which exercises a learner has solved.

`python -m course_lib check 3` runs lessons/03_*.ipynb under nbval and reports each check cell.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ..runtime.shared.process_group import signal_group
from .cells import exercise_name, is_check_cell, is_code, is_exercise_cell
from .layout import find_course_root, find_lesson
from .sanitize import write_sanitize_file

# junit XML writes the escape character as the text "#x1B"
ANSI_COLOR = re.compile(r"(?:\x1b|#x1B)\[[0-9;]*m")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*$", re.MULTILINE)
CELL_NAME = re.compile(r"Cell (\d+)$")
DEFAULT_TIMEOUT_S = 900


@dataclass
class CellResult:
    """One code cell's outcome under nbval; `index` counts code cells only, as nbval does."""

    index: int
    cell: dict
    passed: bool
    message: str = ""


class GradingRunError(RuntimeError):
    """nbval could not run the notebook at all (bad JSON, no kernel, pytest missing...)."""


def run_nbval(notebook: Path, timeout_s: float = DEFAULT_TIMEOUT_S, sanitize_file=None) -> list:
    """Run `notebook` under nbval (lax, sanitized, this Python as kernel): one CellResult per
    code cell, in order. `sanitize_file` defaults to the rules shipped in this package."""
    notebook = Path(notebook).resolve()
    code_cells = [cell for cell in nbformat.read(notebook, as_version=4).cells if is_code(cell)]
    with tempfile.TemporaryDirectory(prefix="course-grade-") as scratch:
        report = Path(scratch) / "report.xml"
        command = [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
                   "--nbval-sanitize-with", str(sanitize_file or write_sanitize_file(Path(scratch))),
                   "-p", "no:cacheprovider", "--noconftest", "--color=no", "-q",
                   "--rootdir", str(notebook.parent), f"--junitxml={report}", str(notebook)]
        output = run_with_deadline(command, notebook.parent, timeout_s)
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


def run_with_deadline(command, folder: Path, timeout_s: float):
    """Run `command` in `folder`; its output, or None if it ran out of time. On timeout the whole
    process group goes (pytest and the notebook's kernel), so no kernel outlives the grading."""
    process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE,
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
        problem = case.find("failure")
        problem = case.find("error") if problem is None else problem
        passed = problem is None
        outcomes[int(cell.group(1))] = (passed, "" if passed else failure_message(
            problem.text or problem.get("message") or ""))
    return outcomes


def failure_message(text: str) -> str:
    """The exception a cell raised (e.g. a GradingError's full message), or why outputs differ."""
    text = ANSI_COLOR.sub("", text)
    traceback = text.split("Traceback:", 1)[-1]
    exceptions = list(EXCEPTION_LINE.finditer(traceback))
    if exceptions:
        last = traceback[exceptions[-1].start():]
        # the message ends where pytest's report resumes (a blank line, then its own text)
        return last.split("\n\n", 1)[0].strip()
    if "Cell outputs differ" in text:
        return ("its output differs from the expected one: the grader printed something else, "
                "or the check cell was edited (restore it from the lesson)")
    return text.strip().splitlines()[-1] if text.strip() else "failed"


def report(results, notebook: Path) -> bool:
    """Print PASS/FAIL per exercise (check cell) and any other failing cell; True if all pass."""
    checks = [result for result in results if is_check_cell(result.cell)]
    print(f"Grading {notebook.name}")
    for result in results:
        if is_check_cell(result.cell):
            name = exercise_name(result.cell)
            print(f"  {'PASS' if result.passed else 'FAIL'}  {name}")
        elif not result.passed:
            role = "exercise" if is_exercise_cell(result.cell) else "setup"
            print(f"  note  {role} cell (code cell {result.index}) failed:")
        if not result.passed:
            print("\n".join("        " + line for line in result.message.splitlines()))
    solved = sum(result.passed for result in checks)
    print(f"{solved} of {len(checks)} exercises pass.")
    return all(result.passed for result in results)


def check_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib check",
                                     description="Grade your lesson's exercises with nbval.")
    parser.add_argument("lesson", help="the lesson: its number (3 or 03) or its path")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds the whole notebook may take (default {DEFAULT_TIMEOUT_S})")
    args = parser.parse_args(argv)
    try:
        notebook = find_lesson(args.lesson, find_course_root())
        print(f"Running {notebook} (save it first: this grades the file on disk) ...", flush=True)
        results = run_nbval(notebook, args.timeout)
    except (LookupError, GradingRunError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0 if report(results, notebook) else 1
