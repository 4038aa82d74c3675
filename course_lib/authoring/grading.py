"""Grading one learner's notebook: the course's check cells put back, then the notebook under nbval.

`grade` returns a Grade (each check cell's result); with `sandbox` (sandbox.Limits) nbval, its
kernel and everything they start run sealed in a sandbox. class_grading.py grades a class with it,
and commands.py prints it for `python -m course_lib check`.
"""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ..checks.engine import FAILED_MARK
from ..runtime.shared.process_group import signal_group
from .cells import is_check_cell, is_code
from .judge import judge_grade, recording_variables
from .layout import SOLUTIONS
from .restore import restore_check_cells
from .sandbox import FOLDER, GRADING, PYTHON, RECORD, Sandbox
from .sanitize import write_sanitize_file
from .scrub import uncolored

EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*$", re.MULTILINE)
VERDICT_LINE = re.compile(rf"^{FAILED_MARK} .*", re.MULTILINE | re.DOTALL)
CELL_NAME = re.compile(r"Cell (\d+)$")
AFTER_A_TIMEOUT = "Previous cell timed out"
DEFAULT_TIMEOUT_S = 900
DEFAULT_CELL_TIMEOUT_S = 300
MAX_SIBLING_BYTES = 20 * 2**20
OUTPUT_KEPT = 2**20  # bytes of pytest's output kept for the report of a notebook that cannot run
# the files a lesson reads beside its notebook, copied in with a submission; no other file is, so
# that none (a torch.py, a pytest.py, a course_lib/) can stand in for a module
FILES_BESIDE = {"14_capstone.ipynb": ("train_ddp.py",)}
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
KERNEL_NAME = "course-graded"  # our kernelspec: this Python, the folder's files never on sys.path
SEED_OFFSETS = 2**20  # a grading's inputs: seeds shifted by one of these, drawn per submission


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
    sealed: bool = False                          # graded inside a sandbox
    verdicts: dict = None                         # {exercise: record.Verdict}: the grade (judge.py)
    seed_offset: int = 0                          # the grading-time inputs the verdicts judged
    findings: list = field(default_factory=list)  # copy_detection's, for the instructor

    @property
    def checks(self) -> list:
        return [result for result in self.results if is_check_cell(result.cell)]


class GradingRunError(RuntimeError):
    """nbval could not run the notebook at all (bad JSON, no kernel, pytest missing, a timeout)."""


def run_nbval(notebook: Path, timeout_s: float = DEFAULT_TIMEOUT_S, sanitize_file=None,
              cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S, env=None, *, sandbox=None) -> list:
    """Run `notebook` under nbval (lax, sanitized, this Python as kernel) in its own folder: one
    CellResult per code cell, in order. A cell past `cell_timeout_s` is interrupted and fails;
    the notebook past `timeout_s` raises GradingRunError. With `sandbox` (a sandbox.Limits), in
    a sandbox: the notebook's folder is copied into it, `env` is all it has of ours."""
    return _nbval(notebook, timeout_s, sanitize_file, cell_timeout_s, env, sandbox)[0]


def _nbval(notebook, timeout_s, sanitize_file, cell_timeout_s, env, sandbox) -> tuple:
    """run_nbval's CellResults, and the checks' record the sandbox copied out (b"" unsealed)."""
    notebook = Path(notebook).resolve()
    code_cells = [cell for cell in nbformat.read(notebook, as_version=4).cells if is_code(cell)]
    with tempfile.TemporaryDirectory(prefix="course-grade-") as scratch:
        grader = Path(scratch) / "grader"
        _write_grader_files(grader, sanitize_file, isolated=sandbox is not None)
        record = b""
        if sandbox is None:
            outcomes, output = _run_here(notebook, grader, timeout_s, cell_timeout_s, env)
        else:
            outcomes, output, record = _run_sealed(notebook, grader, timeout_s, cell_timeout_s,
                                                   env, sandbox)
    if output is None:
        raise GradingRunError(f"{notebook.name} took over {timeout_s:g} s under nbval; "
                              f"look for a cell that hangs")
    if outcomes is None:
        advice = ("nbval is not installed here: pip install nbval\n"
                  if "unrecognized arguments: --nbval" in output else "")
        raise GradingRunError(f"nbval could not run {notebook.name}:\n{advice}{output[-2000:]}")
    return [CellResult(index, cell, *outcomes.get(index, (False, "not run by nbval")))
            for index, cell in enumerate(code_cells)], record


def nbval_arguments(notebook: str, grader: str, cell_timeout_s: float, report: str) -> list:
    """pytest's arguments: our configuration only (no conftest, no ini file found from the
    notebook's folder, no cache), our kernel, the notebook the only test file."""
    return ["-c", f"{grader}/pytest.ini", "--noconftest", "-p", "no:cacheprovider",
            "--rootdir", str(Path(notebook).parent), "--nbval-lax",
            "--nbval-kernel-name", KERNEL_NAME, "--nbval-sanitize-with", f"{grader}/sanitize.cfg",
            f"--nbval-cell-timeout={cell_timeout_s:g}", "--color=no", "-q",
            f"--junitxml={report}", notebook]


def _write_grader_files(grader: Path, sanitize_file, isolated: bool) -> None:
    """pytest.ini, sanitize.cfg and the kernelspec nbval starts: this Python with -I in a sandbox
    (-P here, which keeps PYTHONPATH), so that no file beside the notebook is importable first."""
    kernel = grader / "jupyter" / "kernels" / KERNEL_NAME
    kernel.mkdir(parents=True)
    (grader / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    if sanitize_file:
        shutil.copy(sanitize_file, grader / "sanitize.cfg")
    else:
        write_sanitize_file(grader)
    argv = [PYTHON, "-I" if isolated else "-P", "-m", "ipykernel_launcher",
            "--IPKernelApp.ignore_cwd=True", "-f", "{connection_file}"]
    (kernel / "kernel.json").write_text(json.dumps(
        {"argv": argv, "display_name": "Python 3 (graded)", "language": "python"}), encoding="utf-8")


def _run_here(notebook: Path, grader: Path, timeout_s, cell_timeout_s, env):
    """(outcomes or None, output or None on timeout): nbval in a process of this machine."""
    env = dict(os.environ if env is None else env)
    env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(grader / "jupyter"),
                                                         env.get("JUPYTER_PATH")]))
    report = grader.parent / "report.xml"
    command = [sys.executable, "-P", "-m", "pytest",
               *nbval_arguments(str(notebook), str(grader), cell_timeout_s, str(report))]
    output = run_with_deadline(command, notebook.parent, timeout_s, env)
    return read_junit(report.read_bytes() if report.exists() else b""), output


def _run_sealed(notebook: Path, grader: Path, timeout_s, cell_timeout_s, env, limits):
    """The same in a sandbox: the notebook's folder copied into its private folder, the grader's
    files read-only, the report back through a file no process of the learner's can open."""
    inside = f"{GRADING}/grader"
    with Sandbox(limits, notebook.parent, {"grader": grader},
                 dict(env or {}, JUPYTER_PATH=f"{inside}/jupyter")) as box:
        command = box.command("pytest", *nbval_arguments(
            f"{FOLDER}/{notebook.name}", inside, cell_timeout_s, "{result}"))
        output = run_with_deadline(command, grader, timeout_s, pass_fds=box.pass_fds)
        report, record = box.result(), box.record()
    return read_junit(report), output, record


def run_with_deadline(command, folder: Path, timeout_s: float, env=None, pass_fds=()):
    """Run `command` in `folder`; the end of its output, or None if it ran out of time. On
    timeout the whole process group goes (pytest and the notebook's kernel), so no kernel outlives
    the grading. Only the last OUTPUT_KEPT bytes are kept: a kernel may print without end."""
    process = subprocess.Popen(command, cwd=folder, stdout=subprocess.PIPE, env=env,
                               stderr=subprocess.STDOUT, pass_fds=pass_fds,
                               start_new_session=(os.name == "posix"))
    kept = bytearray()

    def keep_the_end():
        for chunk in iter(lambda: process.stdout.read1(2**16), b""):
            kept.extend(chunk)
            if len(kept) > 2 * OUTPUT_KEPT:
                del kept[:-OUTPUT_KEPT]

    reader = threading.Thread(target=keep_the_end, daemon=True)
    reader.start()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_group(process.pid, signal.SIGKILL)
        process.wait()
        return None
    finally:
        reader.join(timeout=5)  # a process left behind (unsealed) may hold the output open
        if not reader.is_alive():
            process.stdout.close()
    return bytes(kept).decode("utf-8", errors="replace")


def read_junit(report: bytes):
    """{code cell index: (passed, message)} from pytest's junit XML report; None when there is
    none, or it is cut short (pytest was killed while writing it)."""
    try:
        cases = list(ElementTree.fromstring(report).iter("testcase"))
    except ElementTree.ParseError:
        return None
    outcomes = {}
    for case in cases:
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
          cell_timeout_s: float = DEFAULT_CELL_TIMEOUT_S, sanitize_file=None, *, sandbox=None,
          threads=None, seed_offset: int = None) -> Grade:
    """Grade `submission` with the check cells of `solution`, in a folder of its own with the
    files its lesson reads beside it. With `sandbox` (a sandbox.Limits), sealed in a sandbox with
    none of this process's environment; without, with it but its own TMPDIR. `threads`: the
    intra-op threads it may use (None: the thread variables set here, if any).

    Either way the verdicts are the judge's (judge.py): the kernel records each check on inputs
    shifted by `seed_offset` (None: one drawn now), and the solution's checks are replayed here
    from that record; nbval's results are the learner's feedback on the other cells."""
    started = time.monotonic()
    if seed_offset is None:
        seed_offset = 1 + secrets.randbelow(SEED_OFFSETS)
    result = Grade(Path(submission), sealed=sandbox is not None, seed_offset=seed_offset)
    with tempfile.TemporaryDirectory(prefix="course-submission-") as folder:
        folder = Path(folder)
        try:
            learner_notebook = nbformat.read(submission, as_version=4)
        except Exception as error:  # not JSON, not a notebook: a grade of its own, not a crash
            result.problem = f"{Path(submission).name} is not a readable notebook ({error})"[:300]
            return result
        solution_notebook = nbformat.read(solution, as_version=4)
        restored = restore_check_cells(learner_notebook, solution_notebook)
        result.notes, result.ignored = restored.notes, restored.ignored
        _copy_lesson_files(Path(submission), folder, solution.name)
        graded = folder / solution.name
        nbformat.write(restored.notebook, graded)
        record_here = folder / ".record" / "checks.pt"
        env = dict(thread_variables(threads),
                   **recording_variables(seed_offset, RECORD if sandbox else record_here))
        if sandbox is None:
            (folder / "tmp").mkdir()
            record_here.parent.mkdir()
            env = dict(os.environ, TMPDIR=str(folder / "tmp"), **env)
        record = b""
        try:
            result.results, record = _nbval(graded, timeout_s, sanitize_file, cell_timeout_s, env,
                                            sandbox)
        except GradingRunError as error:
            result.problem = str(error)
        judge_grade(result, learner_notebook, solution_notebook, record if sandbox else record_here)
    result.seconds = time.monotonic() - started
    return result


def thread_variables(threads=None) -> dict:
    """OMP_NUM_THREADS and its kin: `threads` in each, or (None) those set here."""
    if threads is None:
        return {name: os.environ[name] for name in THREAD_VARIABLES if name in os.environ}
    return {name: str(threads) for name in THREAD_VARIABLES}


def _copy_lesson_files(submission: Path, folder: Path, lesson: str) -> None:
    """The files beside a submission that its lesson reads (FILES_BESIDE: lesson 14's
    train_ddp.py), each up to MAX_SIBLING_BYTES; nothing else."""
    for name in FILES_BESIDE.get(lesson, ()):
        path = submission.resolve().parent / name
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_SIBLING_BYTES:
            shutil.copy(path, folder / name)
