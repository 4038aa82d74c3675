"""The authoring commands, as `python -m course_lib COMMAND` runs them: check, build-lessons,
run-solutions and pacing. Each parses its flags, calls the pipelines below with plain arguments
and prints their report; no pipeline imports this module (nbgrader keeps its apps apart the same way).
"""
import argparse
import contextlib
import sys
from pathlib import Path

from . import (build, class_grading, exports, gradebook, grading, pacing, run_solutions, sandbox,
               slurm_grading, slurm_run, submissions)
from .cells import exercise_name, is_check_cell, is_exercise_cell
from .layout import SOLUTIONS, course_notebooks, find_course_root, find_lesson, matches_numbers


# -- check: grade a lesson, or a class's submissions of it -----------------------------------------

def check_main(argv) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib check",
        description="Grade a lesson's exercises: your own lessons/NN, or learners' submissions. "
                    "The course's check cells are put back before grading.")
    parser.add_argument("lesson", help="the lesson: its number (3 or 03) or its path")
    parser.add_argument("submissions", nargs="*", type=Path, metavar="SUBMISSION",
                        help="learners' notebooks, or folders of them (a gradebook row per "
                             "learner); none: grade the lesson itself")
    parser.add_argument("--csv", type=Path, metavar="FILE",
                        help="write the gradebook (a row per learner) as CSV; FILE's .state.jsonl "
                             "beside it keeps each grade as it is given")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the gradebook as JSON")
    _add_gradebook_arguments(parser)
    parser.add_argument("--timeout", type=float, default=grading.DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds one notebook may take (default {grading.DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--cell-timeout", type=float, default=grading.DEFAULT_CELL_TIMEOUT_S, metavar="S",
                        help=f"seconds one cell may take before it is interrupted and fails "
                             f"(default {grading.DEFAULT_CELL_TIMEOUT_S:g})")
    _add_sandbox_arguments(parser)
    _add_class_slurm_arguments(parser)
    args = parser.parse_args(argv)
    try:
        root = find_course_root()
        lesson = find_lesson(args.lesson, root)
        solution = grading.course_solution(lesson, root)
        if args.submissions:
            return _grade_class(solution, args)
        print(f"Grading {lesson} (save it first: this grades the file on disk) ...", flush=True)
        result = grading.grade(lesson, solution, args.timeout, args.cell_timeout)
    except LookupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if result.problem and not result.results:
        print(f"error: {result.problem}", file=sys.stderr)
        return 2
    return 0 if print_grade(result) else 1


def _add_sandbox_arguments(parser) -> None:
    sealed = parser.add_argument_group(
        "the sandbox each submission is graded in (with SUBMISSIONs; Linux, bubblewrap)")
    defaults = sandbox.Limits()
    sealed.add_argument("--no-sandbox", action="store_true",
                        help="grade without a sandbox: learners' code runs as you, with your files, "
                             "environment and network (the gradebook says sealed=False)")
    sealed.add_argument("--memory", type=_bytes, default=defaults.memory_bytes, metavar="SIZE",
                        help=f"memory each process of a submission may allocate, e.g. 2G "
                             f"(default {defaults.memory_bytes / sandbox.GiB:g}G)")
    sealed.add_argument("--cpu-time", type=int, default=defaults.cpu_seconds, metavar="S",
                        help=f"CPU seconds each process of a submission may use "
                             f"(default {defaults.cpu_seconds})")


def _bytes(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    number, unit = (text[:-1], text[-1].upper()) if text[-1:].upper() in units else (text, "")
    try:
        return int(float(number) * units.get(unit, 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give bytes, or a number with K, M, G or T")


def _sandbox_limits(args):
    """The sandbox.Limits each submission is graded under; None with --no-sandbox. Refuses (a
    LookupError that says what to install) where no sandbox starts."""
    if args.no_sandbox:
        print("warning: --no-sandbox: each submission runs as you, with your files, environment "
              "and network", file=sys.stderr)
        return None
    missing = "" if args.slurm else sandbox.why_unavailable()  # the nodes grade: each task checks
    if missing:
        raise LookupError(f"cannot grade a class sealed here: {missing}; or, knowing that "
                          f"learners' code then runs as you, add --no-sandbox")
    return sandbox.Limits(memory_bytes=args.memory, cpu_seconds=args.cpu_time)


def _add_gradebook_arguments(parser) -> None:
    book = parser.add_argument_group("a class's gradebook (with SUBMISSIONs)")
    book.add_argument("--roster", type=Path, metavar="FILE",
                      help="a CSV of the class (a learner, login, username, SIS Login ID, id or "
                           "email column; name and email optional; a Canvas export works): every "
                           "learner gets a row, those without a submission as missing")
    book.add_argument("--points", action="append", default=[], metavar="EXERCISE=N|FILE",
                      help="points of an exercise (its grader's name, e.g. check_circle_area=3), "
                           "or a file of such lines; default: the course's (1 each unless a check "
                           "cell's metadata says \"points\")")
    book.add_argument("--canvas", type=Path, metavar="FILE",
                      help="also write a CSV that Canvas imports (Grades > Import)")
    book.add_argument("--canvas-assignment", metavar="TITLE",
                      help="the Canvas assignment column, e.g. '07 checkpointing (12345)' with "
                           "its Canvas id; default: the lesson's name (a new assignment)")
    book.add_argument("--gradescope", type=Path, metavar="FILE",
                      help="also write a CSV of scores that Gradescope imports (matched by email)")
    book.add_argument("--resume", action="store_true",
                      help="keep the grades the --csv/--json FILE's .state.jsonl holds from a run "
                           "that stopped, and grade only the learners it lacks")
    book.add_argument("--jobs", type=int, default=1, metavar="N",
                      help="grade N submissions at a time, each in its own process, the cores "
                           "shared between them (default 1)")


def _grade_class(solution: Path, args) -> int:
    """Grade every submission into a row per learner, print it, write the files asked for; 0 when
    every learner has every point."""
    state = class_grading.state_path_for(args.csv or args.json) if (args.csv or args.json) else None
    if args.resume and state is None:
        raise LookupError("--resume needs --csv FILE (or --json FILE): the grades kept so far are "
                          "in FILE's .state.jsonl")
    if args.jobs < 1:
        raise LookupError(f"--jobs {args.jobs}: give a number of submissions at a time, 1 or more")
    limits = _sandbox_limits(args)  # before any grading: where no sandbox starts, it refuses
    points = gradebook.override_points(gradebook.course_points(solution), args.points)
    roster = gradebook.read_roster(args.roster) if args.roster else None
    found = submissions.find_submissions(args.submissions, solution.name)
    with _progress_bar(sum(item.notebook is not None for item in found), solution.stem) as follow:
        if args.slurm:
            grades = _grade_class_on_slurm(solution, found, args, limits, state, follow)
            if grades is None:
                return 130
        else:
            grades = class_grading.grade_class(
                solution, found, timeout_s=args.timeout, cell_timeout_s=args.cell_timeout,
                jobs=args.jobs, sandbox=limits, state=state, resume=args.resume, on_graded=follow)
    rows = gradebook.gradebook_rows(grades, found, solution.name, points, roster)
    print_gradebook(rows, points)
    strangers = [row.learner for row in rows if not row.in_roster]
    if strangers:
        print(f"warning: {len(strangers)} submission(s) of learners not in {args.roster}, graded but "
              f"left out of the Canvas and Gradescope files: {', '.join(strangers)}", file=sys.stderr)
    if args.csv:
        exports.write_gradebook_csv(rows, args.csv, list(points))
    if args.json:
        exports.write_json(rows, args.json, solution.name, points)
    if args.canvas:
        exports.write_canvas(rows, args.canvas, args.canvas_assignment or solution.stem)
    if args.gradescope:
        unmatched = exports.write_gradescope(rows, args.gradescope, points)
        if unmatched:
            print(f"warning: Gradescope matches learners by email, and the roster gives none for "
                  f"{', '.join(unmatched)}: add an email column to --roster", file=sys.stderr)
    return 0 if all(row.total == row.maximum for row in rows) else 1


def _add_class_slurm_arguments(parser) -> None:
    array = parser.add_argument_group("a class through SLURM (with SUBMISSIONs and --csv or --json)")
    array.add_argument("--slurm", action="store_true",
                       help="submit the class as a SLURM job array (a task per --chunk learners, "
                            "--jobs at a time in each, on 2 x --jobs CPUs), follow it, and merge "
                            "its grades into the gradebook; the class folder, the gradebook's "
                            "folder and this Python must be on storage the nodes see")
    array.add_argument("--chunk", type=int, default=1, metavar="K",
                       help="learners per array task (default 1)")
    array.add_argument("--partition", help="the SLURM partition (default: the site's)")
    array.add_argument("--time", metavar="HH:MM:SS",
                       help="each task's time limit (default: --timeout for each of its learners "
                            "in turn, plus 5 minutes)")
    array.add_argument("--sbatch-option", action="append", default=[], metavar="OPTION",
                       help="an sbatch option passed through as it is, e.g. "
                            "--sbatch-option=--account=course (repeat it)")


def _grade_class_on_slurm(solution: Path, found, args, limits, state, follow):
    """The --slurm path of a class: its grades, or None after Ctrl-C (the arrays cancelled)."""
    if state is None or args.chunk < 1:
        raise LookupError("--slurm needs --csv FILE (or --json FILE), whose .state.jsonl the "
                          "tasks' grades are merged into, and --chunk 1 or more")
    request = slurm_grading.ArrayRequest(args.partition, args.time, args.chunk, args.jobs,
                                         tuple(args.sbatch_option))
    try:
        return slurm_grading.grade_class_on_slurm(
            solution, found, request, state=state, resume=args.resume, timeout_s=args.timeout,
            cell_timeout_s=args.cell_timeout, sandbox=limits, on_graded=follow,
            say=lambda line: print(line, flush=True))
    except slurm_run.SlurmError as error:
        raise LookupError(f"check --slurm: {error}") from None
    except KeyboardInterrupt:
        print(f"interrupted: cancelled the class's SLURM jobs; the grades given so far are in "
              f"{state}, and --resume grades the rest", file=sys.stderr)
        return None


@contextlib.contextmanager
def _progress_bar(total: int, lesson: str):
    """A progress bar on stderr, and the function that moves it as each learner is graded."""
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=f"grading {lesson}", unit="notebook", file=sys.stderr)

    def follow(grade, done, total):
        bar.n = done
        if grade is not None:
            bar.set_postfix_str(f"{grade.learner}: {grade.status}", refresh=False)
        bar.refresh()

    try:
        yield follow
    finally:
        bar.close()


def print_grade(result) -> bool:
    """Print PASS/FAIL per exercise (check cell) and any other failing cell; True if all pass."""
    print(f"Grading {result.notebook.name}")
    if result.problem:
        print(f"  error  {result.problem}")
        return False
    verdicts, solved = result.verdicts or {}, 0
    for cell in result.results:
        passed, message = cell.passed, cell.message
        if is_check_cell(cell.cell):
            name = exercise_name(cell.cell)
            if name in verdicts:  # the judge's verdict (judge.py), not the kernel's output
                passed, message = verdicts[name].passed, verdicts[name].message
            solved += passed
            print(f"  {'PASS' if passed else 'FAIL'}  {name}")
            if name in result.notes:
                print(f"        note: {result.notes[name]}")
        elif not passed:
            role = "exercise" if is_exercise_cell(cell.cell) else "setup"
            print(f"  note  {role} cell (code cell {cell.index}) failed:")
        if not passed:
            print("\n".join("        " + line for line in message.splitlines()))
    for note in [*result.ignored, *result.findings]:
        print(f"  note  {note}")
    print(f"{solved} of {len(result.checks)} exercises pass.")
    return solved == len(result.checks) and all(cell.passed for cell in result.results)


def print_gradebook(rows, points: dict) -> None:
    """A line per learner (status, points), then each exercise it lost and each note, indented."""
    width = max([len("learner")] + [len(row.learner) for row in rows])
    print(f"{'learner':<{width}}  {'status':<10}  points")
    for row in rows:
        print(f"{row.learner:<{width}}  {row.status:<10}  {row.total:g} of {row.maximum:g}")
        indent = " " * (width + 2)
        if row.status == gradebook.GRADED:
            for name in points:
                if row.points[name] < points[name]:
                    print(f"{indent}FAIL  {name}: {row.feedback.get(name, '').splitlines()[0][:150]}")
        for note in row.notes:
            print(f"{indent}note: {note.splitlines()[0][:150]}")
    counts = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    full = sum(row.total == row.maximum for row in rows)
    print(f"{len(rows)} learner{'s' * (len(rows) != 1)} "
          f"({', '.join(f'{n} {status}' for status, n in counts.items())}); "
          f"{full} with every point.")


# -- build-lessons: lessons/ from solutions/ ---------------------------------------------------------

def build_lessons_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib build-lessons",
                                     description="Write lessons/ from solutions/.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; fail when lessons/ is not what a build would write")
    parser.add_argument("--only", action="append", default=[], metavar="NN",
                        help="build only lesson NN (repeat it, or give a list: --only 3,4)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the course folder (default: found from the current folder)")
    args = parser.parse_args(argv)
    root = find_course_root(args.root)
    problems = build.build_lessons(root, check=args.check, only=args.only, say=print)
    for problem in problems:
        print(f"problem     {problem}")
    if problems and args.check:
        print("lessons/ is stale: run `python -m course_lib build-lessons` and commit lessons/")
    return 1 if problems else 0


# -- run-solutions: execute the solutions, here or through SLURM -------------------------------------

def run_solutions_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib run-solutions",
                                     description="Execute the solution notebooks with nbclient.")
    parser.add_argument("--only", action="append", default=[], metavar="NN",
                        help="run only lesson NN (repeat it, or give a list: --only 3,4)")
    parser.add_argument("--timeout", type=float, default=run_solutions.DEFAULT_TIMEOUT_S, metavar="S",
                        help=f"seconds each notebook may take (default {run_solutions.DEFAULT_TIMEOUT_S})")
    parser.add_argument("--write", action="store_true",
                        help="store the outputs of each passing notebook back into it "
                             "(machine paths scrubbed); then run build-lessons")
    parser.add_argument("--root", type=Path, default=None,
                        help="the course folder (default: found from the current folder)")
    _add_slurm_arguments(parser)
    args = parser.parse_args(argv)
    root = find_course_root(args.root)
    notebooks = [path for path in course_notebooks(root / SOLUTIONS)
                 if matches_numbers(path, args.only)]
    if not notebooks:
        print(f"no solution notebooks to run in {root / SOLUTIONS}"
              + (f" for --only {','.join(args.only)}" if args.only else ""), file=sys.stderr)
        return 2
    if args.slurm:  # the same run, on a compute node: its report printed here
        return _run_on_slurm(args, root, notebooks)
    device = run_solutions.describe_device()
    runs = []
    for number, path in enumerate(notebooks, start=1):
        # slurm_run.latest_progress reads these "[n/N] " lines from a job's log
        print(f"[{number}/{len(notebooks)}] running {path.name} ...", flush=True)
        nb, run = run_solutions.execute(path, args.timeout)
        runs.append(run)
        print(f"[{number}/{len(notebooks)}] {'pass' if run.passed else 'FAIL'} {path.name} "
              f"in {run.seconds:.1f} s", flush=True)
        if args.write and run.passed:
            run_solutions.store_outputs(nb, path, root)
            print(f"stored its outputs in {SOLUTIONS}/{path.name}; now run "
                  f"`python -m course_lib build-lessons`", flush=True)
        elif args.write:
            print(f"left {SOLUTIONS}/{path.name} as it was, since it failed", flush=True)
    print_runs(runs, device)
    if args.report_json:
        run_solutions.write_report(args.report_json, runs, device)
    return 0 if all(run.passed for run in runs) else 1


def _add_slurm_arguments(parser) -> None:
    slurm = parser.add_argument_group("through SLURM (instructors on a cluster)")
    defaults = slurm_run.JobRequest()
    slurm.add_argument("--slurm", action="store_true",
                       help="submit one batch job that runs the notebooks on a compute node, "
                            "follow it, and print its report here")
    slurm.add_argument("--partition", default=defaults.partition,
                       help="the SLURM partition (default: the site's)")
    slurm.add_argument("--gpus-per-node", type=int, default=defaults.gpus_per_node, metavar="N",
                       help=f"GPUs to ask for (default {defaults.gpus_per_node}: a CPU node)")
    slurm.add_argument("--cpus-per-task", type=int, default=defaults.cpus_per_task, metavar="N",
                       help=f"CPU cores to ask for (default {defaults.cpus_per_task})")
    slurm.add_argument("--time", default=defaults.time_limit, metavar="HH:MM:SS",
                       help=f"the job's time limit (default {defaults.time_limit})")
    # the node's side of --slurm: where it writes its report
    slurm.add_argument("--report-json", type=Path, default=None, help=argparse.SUPPRESS)


def _run_on_slurm(args, root: Path, notebooks: list) -> int:
    """The --slurm path of run-solutions: submit, follow, print the node's report; its exit code."""
    request = slurm_run.JobRequest(args.partition, args.gpus_per_node, args.cpus_per_task, args.time)
    try:
        job = slurm_run.submit_run(root, [path.name[:2] for path in notebooks], request,
                                   args.timeout, args.write)
        print(f"submitted job {job.id} ({len(notebooks)} notebooks, partition "
              f"{request.partition or 'default'}, {request.gpus_per_node} GPUs, "
              f"{request.cpus_per_task} CPUs, time limit {request.time_limit}): {job.script}", flush=True)
        try:
            info = slurm_run.follow(job.id, job.log, say=lambda line: print(line, flush=True),
                                    run_limit_s=slurm_run.seconds_of(request.time_limit) + 120)
        except KeyboardInterrupt:
            slurm_run.cancel(job.id)
            print(f"interrupted: cancelled job {job.id}", file=sys.stderr)
            return 130
    except slurm_run.SlurmError as error:
        print(f"run-solutions --slurm: {error}", file=sys.stderr)
        return 2
    if not job.report.exists():
        print(f"run-solutions --slurm: {slurm_run.why_no_report(job, info)}", file=sys.stderr)
        return 1
    runs, device = run_solutions.read_report(job.report)
    print_runs(runs, device)
    return 0 if runs and all(run.passed for run in runs) else 1


def print_runs(runs, device: str) -> None:
    rows = [("notebook", "result", "seconds", "device")]
    rows += [(run.name, "pass" if run.passed else f"FAIL {run.error}", f"{run.seconds:.1f}", device)
             for run in runs]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3])


# -- pacing: each lesson's minutes from the model ----------------------------------------------------

def pacing_main(argv) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib pacing",
                                     description="Each lesson's minutes, from the pacing model.")
    parser.add_argument("--write", action="store_true",
                        help="restate each solution's first cell with the model's minutes")
    args = parser.parse_args(argv)
    total = 0
    print("lesson  minutes  reading+running  exercises  stated    pause before")
    for path in course_notebooks(find_course_root() / SOLUTIONS):
        lesson, said = pacing.pace(path), pacing.stated_in(path)
        total += lesson.minutes
        print(f"{lesson.lesson:<6}  {lesson.minutes:>7}  {lesson.reading_and_running:>15}  "
              f"{lesson.exercise_minutes:>9}  {said!s:<8}  {lesson.pause_before}")
        if args.write:
            pacing.restate_notebook(path, lesson)
    print(f"in all about {total / 60:.1f} hours")
    return 0
