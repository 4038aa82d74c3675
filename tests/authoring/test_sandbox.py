"""A class graded sealed: learners who attack the grading, each beside an honest learner whose grade
does not change. Each attack fails or stays contained inside the sandbox (sandbox.py); those that
live in the learner's own kernel (IPython hooks, a patched grader, a forged record) fail because the
verdict is decided outside it, by replaying the course's grader on the record (judge.py).

One class of small notebooks of the fixture course (tests/fixtures: 01_circle) is graded once, two
at a time; the tests then read each learner's grade and look at this machine for what was left.
An attack cell reports what it reached by raising `RuntimeError("FOUND-<tag> ...")`.
"""
import collections
import io
import math
import os
import pickle
import random
import resource
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
import torch
from nbformat.v4 import new_code_cell

from course_lib.authoring import grading, judge, sandbox
from course_lib.authoring.cells import exercise_name, is_check_cell
from course_lib.authoring.commands import check_main
from course_lib.authoring.layout import LESSONS, SOLUTIONS
from course_lib.checks.engine import expect_close, grader, record_file
from course_lib.checks.engine.boundary import grading_seed
from course_lib.checks.engine.learner_call import call_learner
from course_lib.checks.engine.record import recording, replay_check
from test_grading import FIXTURES, LESSON, solved

TOKEN = f"{random.randrange(10**5, 10**6)}"           # this run's, in every marker
DAEMON_SECONDS = f"86399.{TOKEN}"                      # `sleep` of a daemon: found by its cmdline
SECRET = f"instructor-token-{TOKEN}"
LIMITS = sandbox.Limits(file_bytes=64 * 2**20)         # the defaults, with small writable folders
FLOOD_BYTES = 2**30                                    # written to the kernel's own stdout
TRIES_FORKS = 1000                                     # more than LIMITS.processes
HOST_SOCKETS = ["/run/munge/munge.socket.2", "/var/run/docker.sock", "/run/dbus/system_bus_socket"]


def sealed_grading(test):
    """A test that grades in a sandbox: slow, and skipped where none starts."""
    unavailable = sandbox.why_unavailable()
    return pytest.mark.slow(pytest.mark.skipif(bool(unavailable), reason=unavailable)(test))


def unsolved():
    return nbformat.read(LESSON, as_version=4)


def with_cells(notebook, *sources, first=False):
    """`notebook` with code cells added after its setup cell (`first`) or before its first check."""
    cells = notebook.cells
    at = 2 if first else next(i for i, cell in enumerate(cells) if is_check_cell(cell))
    cells[at:at] = [new_code_cell(source) for source in sources]
    return notebook


def wrong_unit_area(notebook):
    """`notebook` with the unit circle's area wrong (3.0)."""
    for cell in notebook.cells:
        if cell.source == "unit_circle_area = circle_area(1.0)":
            cell.source = "unit_circle_area = 3.0"
    return notebook


def with_last_cell(notebook, source: str):
    """`notebook` with a code cell at its end, after every check."""
    notebook.cells.append(new_code_cell(source))
    return notebook


def found(tag: str, expression: str) -> str:
    return f"raise RuntimeError('FOUND-{tag} ' + repr({expression}))"


# -- the attacks ---------------------------------------------------------------------------------

# makes every check cell print its passed line, from any module the kernel imports
CHEAT = '''
import re as _re, threading as _threading, time as _time
def _cheat(lines):
    text = "".join(lines)
    name = _re.search(r"check_(\\w+)\\(", text)
    if "NBVAL_CHECK_OUTPUT" in text and name:
        return ["print('\\u2713 %s: passed')\\n" % name.group(1).replace("_", " ")]
    return lines
def _install():
    for _ in range(600):
        try:
            from IPython import get_ipython
            if get_ipython() is not None:
                return get_ipython().input_transformers_post.append(_cheat)
        except Exception:
            pass
        _time.sleep(0.05)
_threading.Thread(target=_install, daemon=True).start()
'''
FAKE_ENGINE = '''
def grader(name):
    return lambda check: (lambda *args, **kwargs: print(f"\\u2713 {name}: passed"))
def expect_close(*args, **kwargs):
    pass
'''
FAKE_PYTEST = '''
import sys
report = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml="))
cases = "".join(f'<testcase classname="nb" name="Cell {i}"/>' for i in range(40))
open(report, "w").write(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
'''
ALL_PASS_CONFTEST = '''
import pytest
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''


SHADOWING_FILES = ("torch.py", "sitecustomize.py", "usercustomize.py", "nbval.py", "pytest.py",
                   "conftest.py", "pytest.ini")


def shadowing_files(folder: Path) -> None:
    """Modules beside the notebook that would make an unsolved notebook pass if they were used."""
    for name in SHADOWING_FILES[:4]:
        (folder / name).write_text(CHEAT)
    engine = folder / "course_lib" / "checks" / "engine"
    engine.mkdir(parents=True)
    (folder / "course_lib" / "__init__.py").write_text(CHEAT)
    (folder / "course_lib" / "checks" / "__init__.py").write_text("")
    (engine / "__init__.py").write_text(FAKE_ENGINE)
    (folder / "pytest.py").write_text(FAKE_PYTEST)
    (folder / "conftest.py").write_text(ALL_PASS_CONFTEST)
    (folder / "pytest.ini").write_text("[pytest]\naddopts = -p conftest\n")


CUSTOM_EXC = '''
import re
def _swallow(shell, etype, value, tb, tb_offset=None):
    name = re.search(r"\\u2717 (.+?)(?::| is not)", str(value))
    print(f"\\u2713 {name.group(1) if name else 'circle area'}: passed")
get_ipython().set_custom_exc((Exception,), _swallow)
'''


def snooping_cells(course: Path, classmate: Path, port: int, unix_socket: str) -> list:
    """Each cell raises what it reached: identity, environment, a classmate, the course's answers,
    other processes, the grading process's files, the network, writes outside, a file too big."""
    home, site_packages = Path.home(), Path(site.getsitepackages()[0])
    outside = [course / f"attack-{TOKEN}", course / "course_lib_attack.txt",
               home / f".attack-{TOKEN}", site_packages / f"attack_{TOKEN}.pth",
               Path(f"/tmp/attack-{TOKEN}"), classmate.parent / f"attack-{TOKEN}"]
    return [
        "import os, socket, glob\n" + found("identity", "(os.getuid(), [l.split()[1] for l in "
                                            "open('/proc/self/status') if l.startswith('CapEff')])"),
        found("environment", "dict(os.environ)"),
        "seen = []\n"
        f"for path in [{str(classmate)!r}, {str(course / SOLUTIONS / LESSON.name)!r}]:\n"
        "    try:\n        seen.append((path, len(open(path).read())))\n"
        "    except OSError as error:\n        seen.append((path, type(error).__name__))\n"
        "seen.append(sorted({os.path.realpath(path) for path in glob.glob('/proc/*/cwd/*.ipynb')\n"
        "                    + glob.glob('/tmp/course-*') + glob.glob('/learner/../*/*.ipynb')}))\n"
        "seen.append(sorted(open(f'/proc/{pid}/cmdline').read()[:60]\n"
        "                   for pid in os.listdir('/proc') if pid.isdigit()))\n"
        + found("classmate", "seen"),
        "seen = []\n"
        "for what in ('fd', 'environ', 'mem'):\n"
        "    path = f'/proc/{os.getppid()}/{what}'\n"
        "    try:\n"
        "        seen.append((what, os.listdir(path) if what == 'fd' else open(path, 'rb').read(9)))\n"
        "    except OSError as error:\n        seen.append((what, type(error).__name__))\n"
        + found("grader-files", "seen"),
        f"seen, UNIX_SOCKETS = [], {HOST_SOCKETS!r}\n"
        f"for address in [('127.0.0.1', {port}), ('10.0.0.1', 80), {unix_socket!r}, *UNIX_SOCKETS]:\n"
        "    family = socket.AF_INET if isinstance(address, tuple) else socket.AF_UNIX\n"
        "    try:\n        socket.socket(family).connect(address)\n"
        "        seen.append((address, 'connected'))\n"
        "    except OSError as error:\n        seen.append((address, type(error).__name__))\n"
        + found("network", "seen"),
        "seen = []\n"
        f"for path in {[str(path) for path in outside]!r}:\n"
        "    try:\n        open(path, 'w').write('# written by a learner\\n')\n"
        "        seen.append((path, 'written'))\n"
        "    except OSError as error:\n        seen.append((path, type(error).__name__))\n"
        + found("writes", "seen"),
        "try:\n    open('big.bin', 'wb').write(bytes(%d))\n    seen = 'written'\n"
        "except OSError as error:\n    seen = error.strerror\n" % (LIMITS.file_bytes + 2**20)
        + found("file-size", "seen"),
    ]


# the learner's own grader, in place of the course's: passes whatever circle_area does
PATCHED_GRADER = '''
from course_lib.checks.engine import grader
@grader("circle area")
def check_circle_area(circle_area):
    return
expect_close = lambda *args, **kwargs: None  # the course's other grader compares nothing
'''
# after the checks, a record of the learner's own saying that every check passed
FORGED_RECORD = f'''
import math, os
from course_lib.checks.engine.record_file import write_record
entry = dict(kwargs=[], argument_problem="", complete=True, verdict="passed")
write_record({sandbox.RECORD!r}, int(os.environ["COURSE_GRADING_SEED_OFFSET"]), [
    dict(entry, grader="__main__.check_circle_area", exercise="circle area",
         args=[("callable", "circle_area")], outcomes=[]),
    dict(entry, grader="__main__.check_unit_circle_area", exercise="unit circle area",
         args=[("v", 3.0)], outcomes=[])])
'''
MARKER = Path(f"/tmp/course-unpickled-{TOKEN}")  # on the host: made only if a record is unpickled


class Payload:
    """Pickled, it runs `command` when unpickled by anything but a restricted unpickler."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def malicious_record_cell(marker: Path) -> str:
    """A cell that leaves a record whose unpickling would create `marker` on the host."""
    return (f"import os, torch\nclass Payload:\n    def __reduce__(self):\n"
            f"        return (os.system, ('touch {marker}',))\n"
            f"os.makedirs({str(Path(sandbox.RECORD).parent)!r}, exist_ok=True)\n"
            f"torch.save({{'format': 'course_lib grading record', 'version': 1, 'seed_offset': 0, "
            f"'checks': [Payload()]}}, {sandbox.RECORD!r})")


FLOOD = ("import os\nwritten, stopped = 0, None\ntry:\n"
         f"    while written < {FLOOD_BYTES}:  # to the kernel's stdout\n"
         "        written += os.write(1, bytes(2**20))\n"
         "except OSError as error:\n    stopped = error.strerror\n"
         + found("flood", "(written, stopped)"))
GREEDY_CELLS = [
    "memory = bytearray(3 * 10**9)  # 3 GB",
    "import os, signal, time\nchildren, stopped = [], None\ntry:\n"
    f"    while len(children) < {TRIES_FORKS}:\n        pid = os.fork()\n        if pid == 0:\n"
    "            time.sleep(60)\n            os._exit(0)\n        children.append(pid)\n"
    "except OSError as error:\n    stopped = error.strerror\nfor pid in children:\n"
    "    os.kill(pid, signal.SIGKILL)\n    os.waitpid(pid, 0)\n"
    + found("forks", "(len(children), stopped)"),
    ("import subprocess\nsubprocess.run(['/bin/sh', '-c', "
     f"'setsid sleep {DAEMON_SECONDS} </dev/null >/dev/null 2>&1 &'])"),
]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    for folder in (LESSONS, SOLUTIONS):
        shutil.copytree(FIXTURES / folder, course / folder)
    return course


@pytest.fixture(scope="module")
def listener():
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def unix_listener():
    """A socket in the abstract namespace of this machine's network namespace."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(f"\0course-attack-{TOKEN}")
    server.listen()
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture(scope="module")
def graded(course, listener, unix_listener, tmp_path_factory):
    """{learner: Grade}: one class, graded sealed two at a time, the instructor's secret set."""
    room = tmp_path_factory.mktemp("class")
    notebooks = {
        "ann": solved(),
        "shadow": with_cells(unsolved(), "import torch", first=True),
        "custom_exc": with_cells(unsolved(), CUSTOM_EXC, first=True),
        "transformer": with_cells(unsolved(), CHEAT + "_install()", first=True),
        "killer": with_cells(unsolved(), "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"),
        "greedy": with_cells(solved(), *GREEDY_CELLS),
        "flood": with_cells(solved(), FLOOD),
        "patcher": with_cells(wrong_unit_area(solved(wrong_area=True)), PATCHED_GRADER),
        "forger": with_last_cell(unsolved(), FORGED_RECORD),
        "pickler": with_last_cell(solved(), malicious_record_cell(MARKER)),
    }
    notebooks["shadow"].metadata["kernelspec"]["name"] = "python3-of-the-learner"
    notebooks["snoop"] = with_cells(solved(), *snooping_cells(
        course, room / "ann" / LESSON.name, listener.getsockname()[1], unix_listener.getsockname()))
    paths = {}
    for learner, notebook in notebooks.items():
        (room / learner).mkdir()
        paths[learner] = room / learner / LESSON.name
        nbformat.write(notebook, paths[learner])
    shadowing_files(room / "shadow")
    os.environ["COURSE_INSTRUCTOR_TOKEN"] = SECRET
    # as if the lesson read these files beside its notebook: they are copied in, and still unused
    grading.FILES_BESIDE[LESSON.name] = SHADOWING_FILES
    memory_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            grades = dict(zip(paths, pool.map(lambda path: grading.grade(
                path, course / SOLUTIONS / LESSON.name, 240, 60, sandbox=LIMITS), paths.values())))
    finally:
        del os.environ["COURSE_INSTRUCTOR_TOKEN"], grading.FILES_BESIDE[LESSON.name]
    return {**grades, "memory before": memory_before}


def verdicts(grade) -> dict:
    """The grade: the judge's verdict on each check (judge.py), never the kernel's output."""
    return {name: verdict.passed for name, verdict in grade.verdicts.items()}


def finding(grade, tag: str) -> str:
    """What the attack cell tagged `tag` reached, as its RuntimeError said."""
    for result in grade.results:
        if f"FOUND-{tag} " in result.message:
            return result.message.split(f"FOUND-{tag} ", 1)[1]
    raise AssertionError(f"no cell reported FOUND-{tag}: " + str([r.message for r in grade.results]))


def processes_with(text: str) -> list:
    matches = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                matches.append(pid)
        except OSError:
            continue
    return matches


# -- an honest learner, and those who try to pass without solving -------------------------------

@sealed_grading
def test_the_honest_learner_passes_sealed(graded):
    assert graded["ann"].sealed and not graded["ann"].problem and graded["ann"].seed_offset
    assert verdicts(graded["ann"]) == {"check_circle_area": True, "check_unit_circle_area": True}
    assert all(result.passed for result in graded["ann"].results)


@sealed_grading
def test_modules_beside_the_notebook_stand_in_for_nothing(graded):
    """torch.py, sitecustomize.py, pytest.py that writes a passing report, a conftest.py and a
    pytest.ini, copied in as if the lesson read them: none is imported (python -I, our pytest
    configuration); a course_lib/ whose grader always passes is not copied in."""
    assert verdicts(graded["shadow"]) == {"check_circle_area": False,
                                          "check_unit_circle_area": False}
    assert "is not right yet" in graded["shadow"].checks[0].message


@sealed_grading
def test_killing_the_grader_from_the_kernel_is_no_pass(graded):
    grade = graded["killer"]
    assert not any(verdicts(grade).values())
    assert grade.problem and "could not run" in grade.problem


@sealed_grading
@pytest.mark.parametrize("learner", ["custom_exc", "transformer"])
def test_ipython_hooks_that_rewrite_or_swallow_a_check_do_not_pass(graded, learner):
    """The hooks make check cells print their passed lines in the kernel (nbval passes them);
    the judge replays the course's grader on what the learner's code did."""
    grade = graded[learner]
    assert any(result.passed for result in grade.checks), "the hook did not fool the kernel"
    assert verdicts(grade) == {"check_circle_area": False, "check_unit_circle_area": False}


@sealed_grading
def test_a_grader_patched_in_the_kernel_does_not_pass(graded):
    grade = graded["patcher"]
    assert all(result.passed for result in grade.checks), "the patch did not fool the kernel"
    assert verdicts(grade) == {"check_circle_area": False, "check_unit_circle_area": False}
    assert "does not match the check" in grade.verdicts["check_circle_area"].message
    assert "is not right yet" in grade.verdicts["check_unit_circle_area"].message


@sealed_grading
def test_a_record_forged_by_the_learner_does_not_pass(graded):
    grade = graded["forger"]
    assert verdicts(grade) == {"check_circle_area": False, "check_unit_circle_area": False}
    assert "lacks" in grade.verdicts["check_circle_area"].message


@sealed_grading
def test_a_malicious_pickle_left_as_the_record_is_refused_unrun(graded):
    grade = graded["pickler"]
    assert not MARKER.exists(), "the judge unpickled the learner's code"
    assert verdicts(grade) == {"check_circle_area": False, "check_unit_circle_area": False}
    assert "the record was refused" in grade.verdicts["check_circle_area"].message


# -- what a submission reaches -------------------------------------------------------------------

@sealed_grading
def test_a_submission_runs_as_nobody_with_no_capability(graded):
    uid, capabilities = eval(finding(graded["snoop"], "identity"))
    assert uid != 0
    assert capabilities == ["0000000000000000"]


@sealed_grading
def test_none_of_the_instructors_environment_reaches_a_submission(graded):
    environment = eval(finding(graded["snoop"], "environment"))
    assert SECRET not in str(environment) and "COURSE_INSTRUCTOR_TOKEN" not in environment
    assert set(environment) <= {
        "PATH", "HOME", "TMPDIR", "LANG", "USER", "PWD", "JUPYTER_PLATFORM_DIRS", "JUPYTER_PATH",
        "JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR",
        "MPLCONFIGDIR", "MPLBACKEND", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "SHLVL", "_",
        "PYDEVD_DISABLE_FILE_VALIDATION", *grading.THREAD_VARIABLES,
        # the grading's inputs (the seed offset), and the key of measured records' seals
        "COURSE_GRADING_SEED_OFFSET", judge.SEAL_VARIABLE,
        # what pytest, ipykernel and the kernel's libraries set for themselves
        "PYTEST_CURRENT_TEST", "PYTEST_VERSION", "JPY_PARENT_PID", "PYDEVD_USE_FRAME_EVAL",
        "CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR", "PAGER", "GIT_PAGER", "TERM"}, environment


@sealed_grading
def test_no_classmate_nor_the_courses_answers_nor_another_process_is_readable(graded):
    classmate, answers, listed, commands = eval(finding(graded["snoop"], "classmate"))
    assert classmate[1] == "FileNotFoundError" and answers[1] == "FileNotFoundError"
    assert listed == [f"{sandbox.FOLDER}/{LESSON.name}"], "another grading's files are visible"
    assert all("ann" not in command for command in commands)
    assert len(commands) <= 6, f"processes other than this submission's: {commands}"


@sealed_grading
def test_the_grading_processs_files_are_out_of_reach(graded):
    assert eval(finding(graded["snoop"], "grader-files")) == [
        ("fd", "PermissionError"), ("environ", "PermissionError"), ("mem", "PermissionError")]


@sealed_grading
def test_no_network_not_even_this_machines_loopback_nor_its_sockets(
        graded, listener, unix_listener):
    reached = dict(eval(finding(graded["snoop"], "network")))
    assert reached == {("127.0.0.1", listener.getsockname()[1]): "ConnectionRefusedError",
                       ("10.0.0.1", 80): "OSError",
                       unix_listener.getsockname(): "ConnectionRefusedError",
                       **{path: "FileNotFoundError" for path in HOST_SOCKETS}}, reached
    for server in (listener, unix_listener):
        with pytest.raises(BlockingIOError):
            server.accept()


@sealed_grading
def test_nothing_is_written_outside_the_sandbox(graded, course):
    written = dict(eval(finding(graded["snoop"], "writes")))
    inside_only = f"/tmp/attack-{TOKEN}"
    assert written.pop(inside_only) == "written"  # its own /tmp, gone with it
    assert set(written.values()) <= {"OSError", "PermissionError", "FileNotFoundError"}, written
    left = [path for path in [*written, inside_only] if Path(path).exists()]
    assert not left, f"a submission wrote here: {left}"


@sealed_grading
def test_a_file_past_the_size_limit_is_refused(graded):
    assert finding(graded["snoop"], "file-size") in ("'File too large'", "'No space left on device'")


# -- resources, and what a submission leaves behind ----------------------------------------------

@sealed_grading
def test_3_gb_fail_alone_and_grading_goes_on(graded):
    grade = graded["greedy"]
    memory_cell = next(result for result in grade.results if "bytearray" in result.cell.source)
    assert not memory_cell.passed and "MemoryError" in memory_cell.message
    assert verdicts(grade) == {"check_circle_area": True, "check_unit_circle_area": True}


@sealed_grading
def test_a_fork_bomb_is_bounded(graded):
    forks, stopped = eval(finding(graded["greedy"], "forks"))
    assert forks < LIMITS.processes and stopped == "Resource temporarily unavailable"


@sealed_grading
def test_output_without_end_is_cut_short_and_costs_the_grading_process_no_memory(graded):
    """A gigabyte written to the kernel's own stdout, past Jupyter (a file of pytest's capture)."""
    written, stopped = eval(finding(graded["flood"], "flood"))
    assert written <= LIMITS.file_bytes and stopped in ("File too large", "No space left on device")
    assert verdicts(graded["flood"]) == {"check_circle_area": True, "check_unit_circle_area": True}
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - graded["memory before"]
    assert grown < FLOOD_BYTES // 4, f"the grading process grew by {grown / 2**20:.0f} MiB"


@sealed_grading
def test_no_daemon_outlives_its_grading(graded):
    assert graded["greedy"].sealed
    assert processes_with(DAEMON_SECONDS) == []


@sealed_grading
@pytest.mark.timeout(240)
def test_killing_the_grading_process_leaves_no_process_of_a_submission(course, tmp_path):
    daemon, foreground = f"86398.{TOKEN}", f"86397.{TOKEN}"
    room = tmp_path / "class"
    room.mkdir()
    nbformat.write(with_cells(solved(), "import subprocess\nsubprocess.run(['/bin/sh', '-c', "
                              f"'setsid sleep {daemon} </dev/null >/dev/null 2>&1 &'])",
                              f"subprocess.run(['sleep', '{foreground}'])"), room / "bea.ipynb")
    check = subprocess.Popen([sys.executable, "-m", "course_lib", "check", "1", str(room),
                              "--csv", str(tmp_path / "grades.csv")], cwd=course,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while not (processes_with(foreground) and processes_with(daemon)):
            assert time.monotonic() < deadline and check.poll() is None, "bea's cells never ran"
            time.sleep(0.5)
        started = descendants(check.pid)
    finally:
        check.kill()
        check.wait()
    deadline = time.monotonic() + 20
    while still_running(started) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not still_running(started), f"left running: {still_running(started)}"
    assert processes_with(daemon) == processes_with(foreground) == []


def descendants(pid: int) -> set:
    """{(pid, start time)} of every process below `pid`, on this machine."""
    parents = {}
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(child)] = (int(fields[1]), fields[19])
    found, frontier = set(), {pid}
    while frontier:
        below = {(child, start) for child, (parent, start) in parents.items() if parent in frontier}
        found |= below
        frontier = {child for child, _ in below}
    return found


def still_running(processes) -> list:
    alive = []
    for pid, start in processes:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat[19] == start and stat[0] != "Z":
            alive.append(pid)
    return alive


# -- where no sandbox starts, and what is copied in ----------------------------------------------

def test_class_grading_refuses_without_bubblewrap_unless_told_not_to_seal(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    sandbox.why_unavailable.cache_clear()
    try:
        assert "sudo apt install bubblewrap" in sandbox.why_unavailable()
        (tmp_path / "dan.ipynb").write_text("this is not JSON")
        monkeypatch.chdir(FIXTURES)
        assert check_main(["1", str(tmp_path / "dan.ipynb")]) == 2
        error = capsys.readouterr().err
        assert "bubblewrap (bwrap) is not installed" in error and "--no-sandbox" in error
        assert check_main(["1", str(tmp_path / "dan.ipynb"), "--no-sandbox"]) == 1
        assert "--no-sandbox: each submission runs as you" in capsys.readouterr().err
    finally:
        sandbox.why_unavailable.cache_clear()


def test_only_the_files_a_lesson_reads_are_copied_in_and_never_a_link(tmp_path):
    learner, graded = tmp_path / "learner", tmp_path / "graded"
    learner.mkdir(), graded.mkdir()
    for name in ("train_ddp.py", "torch.py", "notes.txt"):
        (learner / name).write_text("# a file beside the notebook\n")
    grading._copy_lesson_files(learner / "14_capstone.ipynb", graded, "14_capstone.ipynb")
    assert sorted(path.name for path in graded.iterdir()) == ["train_ddp.py"]
    grading._copy_lesson_files(learner / "07_checkpointing.ipynb", graded / "07",
                               "07_checkpointing.ipynb")
    assert not (graded / "07").exists()
    (learner / "train_ddp.py").unlink()
    (learner / "train_ddp.py").symlink_to(learner / "notes.txt")
    (graded / "train_ddp.py").unlink()
    grading._copy_lesson_files(learner / "14_capstone.ipynb", graded, "14_capstone.ipynb")
    assert not (graded / "train_ddp.py").exists()


@sealed_grading
def test_a_process_past_its_cpu_time_is_stopped(tmp_path):
    (tmp_path / "spin.py").write_text("while True:\n    pass\n")
    with sandbox.Sandbox(sandbox.Limits(cpu_seconds=1), tmp_path) as box:
        started = time.monotonic()
        run = subprocess.run(box.command("cProfile", "-o", "/dev/null", "spin.py"),
                             pass_fds=box.pass_fds, capture_output=True, timeout=120, check=False)
    assert run.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU), run
    assert time.monotonic() - started < 60


# -- the record the judge reads: what it refuses, unrun -------------------------------------------

def fixture_solution():
    return nbformat.read(FIXTURES / SOLUTIONS / LESSON.name, as_version=4)


def record_bytes(checks, seed_offset: int = 5) -> bytes:
    buffer = io.BytesIO()
    torch.save({"format": record_file.FORMAT, "version": record_file.VERSION,
                "seed_offset": seed_offset, "checks": checks}, buffer)
    return buffer.getvalue()


def honest_record(seed_offset: int = 5) -> list:
    """The fixture's two checks recorded on a correct answer, as the kernel writes them."""
    namespace = {"__name__": "__main__"}
    exec(fixture_solution().cells[1].source, namespace)
    with recording(seed_offset) as recorder:
        namespace["check_circle_area"](lambda radius: math.pi * radius ** 2)
        namespace["check_unit_circle_area"](math.pi)
    return recorder.checks


def test_the_judge_passes_an_honest_record_and_fails_a_wrong_one(capsys):
    verdicts = judge.judge(fixture_solution(), record_bytes(honest_record()), 5)
    assert {name: verdict.passed for name, verdict in verdicts.items()} == {
        "check_circle_area": True, "check_unit_circle_area": True}
    wrong = honest_record()
    wrong[0]["outcomes"][0]["value"] = ("tuple", [("v", 12.0), ("list", [])])
    verdict = judge.judge(fixture_solution(), record_bytes(wrong), 5)["check_circle_area"]
    assert not verdict.passed and verdict.message.startswith("✗ circle area: circle_area(2.0) is not")
    other_inputs = judge.judge(fixture_solution(), record_bytes(honest_record()), 6)
    assert not any(verdict.passed for verdict in other_inputs.values())
    assert "other grading inputs" in other_inputs["check_circle_area"].message


def test_a_malicious_pickle_in_the_record_is_refused_without_running_it(tmp_path):
    ran = tmp_path / "ran"
    payload = Payload(f"touch {ran}")
    pickle.loads(pickle.dumps(Payload(f"touch {tmp_path / 'real'}")))  # the payload is real:
    assert (tmp_path / "real").exists()                                # pickle runs it
    for data in (record_bytes([payload]), record_bytes([{"grader": payload}]),
                 pickle.dumps(payload), pickle.dumps(payload, protocol=0)):
        with pytest.raises(record_file.RecordFileError):
            record_file.read_record(data)
        verdicts = judge.judge(fixture_solution(), data, 5)
        assert not any(verdict.passed for verdict in verdicts.values())
        assert "the record was refused" in verdicts["check_circle_area"].message
    assert not ran.exists(), "the judge ran the learner's pickle"


@pytest.mark.parametrize("forged", [
    ("v", collections.OrderedDict(area=12.57)), ("v", {12.57}), ("v", torch.device("cpu")),
    ("v", (12.57,)), ("object", "os.system", ("v", "touch /tmp/x")), ("callable", "area"),
    ("list", ("v", 1.0)), ("dict", [["area", 12.57]]), "12.57", ("tuple",)], ids=repr)
def test_a_recorded_value_that_is_not_plain_data_is_refused(forged):
    checks = honest_record()
    checks[0]["outcomes"][0]["value"] = forged
    verdict = judge.judge(fixture_solution(), record_bytes(checks), 5)["check_circle_area"]
    assert not verdict.passed and not verdict.grader_fault, verdict.message
    assert "not data" in verdict.message or "the record was refused" in verdict.message, verdict.message


def test_a_record_of_another_shape_is_refused():
    for change in ({"extra": 1}, {"complete": "yes"}, {"outcomes": [{"key": "k"}]}):
        checks = honest_record()
        checks[0].update(change)
        verdicts = judge.judge(fixture_solution(), record_bytes(checks), 5)
        assert "the record was refused" in verdicts["check_circle_area"].message, change


def test_an_oversize_record_is_refused_before_it_is_read(tmp_path, monkeypatch):
    path = tmp_path / "checks.pt"
    path.write_bytes(record_bytes(honest_record()))
    with open(path, "r+b") as file:  # sparse: no disk is used for the hole
        file.truncate(record_file.MAX_RECORD_BYTES + 1)
    read = []
    monkeypatch.setattr(Path, "read_bytes", lambda self: read.append(self) or b"")
    with pytest.raises(record_file.RecordFileError, match="over"):
        record_file.read_record(path)
    assert "over" in judge.judge(fixture_solution(), path, 5)["check_circle_area"].message
    assert read == [], "the record was read before its size was checked"


def test_the_seed_offset_changes_the_data_the_learners_function_sees():
    seen = {}

    @grader("seeded")
    def check_seeded(function):
        draw = torch.Generator().manual_seed(grading_seed(3))
        data = torch.randn(4, generator=draw)
        expect_close(call_learner(function, data, what="function(data)"), data * 2, "function(data)")

    for offset in (0, 0, 7919):
        with recording(offset) as recorder:
            check_seeded(lambda data: seen.setdefault(offset, []).append(data) or data * 2)
    assert torch.equal(seen[0][0], seen[0][1]) and not torch.equal(seen[0][0], seen[7919][0])
    entry = recorder.checks[0]
    assert replay_check(check_seeded, entry, 7919).passed
    assert not replay_check(check_seeded, entry, 0).passed  # the record answers other data


def test_an_exercise_that_reaches_past_a_static_reading_fails_and_is_noted():
    """copy_detection's findings (course internals, dynamic imports, copied text) fail the
    exercise whatever its record says, and the gradebook notes them for the instructor."""
    notebook = solved()
    for cell in notebook.cells:
        if cell.source.startswith("def circle_area"):
            cell.source = ("import importlib\ndef circle_area(radius):\n"
                           "    return importlib.import_module('math').pi * radius ** 2")
    exercises = {"check_circle_area": None, "check_unit_circle_area": None}
    copied, notes = judge.copy_verdicts(notebook, fixture_solution(), exercises)
    assert list(copied) == ["check_circle_area"] and not copied["check_circle_area"].passed
    assert "importlib" in copied["check_circle_area"].message and notes
    assert judge.copy_verdicts(solved(), fixture_solution(), exercises) == ({}, [])
