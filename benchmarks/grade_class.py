"""Grading a class at --jobs 1 and --jobs 2 side by side, each lesson's grading time, and a model of
the time for 200 learners x every lesson on a 10-node partition.

The class is 40 submissions of a real lesson (default 01, the quickest): half hand in the solution,
half the lesson's stubs. Each is graded sealed where a sandbox starts here (else without, and it
says so). The two settings alternate in rounds over the same learners, so that whatever else runs
on the machine slows both alike. `--per-lesson` instead grades one submission of each lesson (its
solution) through class grading, once each. Each run stores its figures in RESULTS (the other
run's are kept) and prints the projection from what is there.

    python benchmarks/grade_class.py [--lesson 01] [--learners 40] [--rounds 4]
    python benchmarks/grade_class.py --per-lesson [--only 00,01]
    python benchmarks/grade_class.py --project-only [--nodes 10] [--cores-per-node 32] [--class-size 200]
"""
import argparse
import importlib
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import nbformat

from course_lib.authoring import class_grading, grading, sandbox
from course_lib.authoring.cells import is_solution_only
from course_lib.authoring.layout import (LESSONS, SOLUTIONS, course_notebooks, find_course_root,
                                         find_lesson, matches_numbers)
from course_lib.authoring.pacing import MEASURED_RUN_SECONDS
from course_lib.authoring.submissions import Submission

RANKS = class_grading.RANKS_PER_SUBMISSION
RESULTS = Path(__file__).resolve().parent / "results" / "grade_class.json"
# what a solved submission hands in beside its notebook (grading.FILES_BESIDE), from the course's answer
ANSWERS_BESIDE = {"train_ddp.py": "course_lib.examples.capstone_ddp"}


def solved_copy(solution: Path):
    """The solution as a learner who solved everything hands it in: less its solution-only cells."""
    notebook = nbformat.read(solution, as_version=4)
    notebook.cells = [cell for cell in notebook.cells if not is_solution_only(cell)]
    return notebook


def make_class(root: Path, lesson: Path, learners: int, folder: Path) -> list:
    """`learners` submissions of `lesson`: even ones the solution (less its solution-only cells),
    odd ones the lesson as handed out (its stubs)."""
    solved = solved_copy(root / SOLUTIONS / lesson.name)
    stubs = nbformat.read(root / LESSONS / lesson.name, as_version=4)
    submissions = []
    for number in range(learners):
        path = folder / f"learner{number:03}" / lesson.name
        path.parent.mkdir(parents=True)
        nbformat.write(solved if number % 2 == 0 else stubs, path)
        submissions.append(Submission(path.parent.name, path))
    return submissions


def grade_round(solution: Path, submissions, jobs: int, limits, scratch: Path) -> tuple:
    """(seconds, {learner: passed}) of grading `submissions` at `jobs` at a time."""
    started = time.monotonic()
    grades = class_grading.grade_class(solution, submissions, jobs=jobs, sandbox=limits,
                                       state=scratch / f"jobs{jobs}-{submissions[0].learner}.state.jsonl")
    return time.monotonic() - started, {grade.learner: grade.passed for grade in grades}


def compare_jobs(root: Path, args, limits) -> dict:
    """The class of `--learners` submissions graded at --jobs 1 and --jobs 2, alternating in rounds."""
    lesson = find_lesson(args.lesson, root)
    solution = root / SOLUTIONS / lesson.name
    seconds, results = {1: 0.0, 2: 0.0}, {1: {}, 2: {}}
    with tempfile.TemporaryDirectory(prefix="grade-class-bench-") as scratch:
        scratch = Path(scratch)
        submissions = make_class(root, lesson, args.learners, scratch / "class")
        size = -(-len(submissions) // args.rounds)
        for start in range(0, len(submissions), size):
            chunk = submissions[start:start + size]
            for jobs in ((1, 2) if start // size % 2 == 0 else (2, 1)):
                took, passed = grade_round(solution, chunk, jobs, limits, scratch)
                seconds[jobs] += took
                results[jobs].update(passed)
                print(f"  --jobs {jobs}: {len(chunk)} submissions in {took:.1f} s", flush=True)
    same = results[1] == results[2]
    print(f"\n--jobs 1: {seconds[1]:.1f} s ({seconds[1] / args.learners:.1f} s a submission)")
    print(f"--jobs 2: {seconds[2]:.1f} s ({seconds[2] / args.learners:.1f} s a submission)")
    print(f"ratio (jobs 1 / jobs 2): {seconds[1] / seconds[2]:.2f}x; the same grades both ways: {same}; "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    return {"lesson": lesson.name, "learners": args.learners, "jobs_1_s": round(seconds[1], 1),
            "jobs_2_s": round(seconds[2], 1), "same_grades": same}


def time_each_lesson(root: Path, only, limits) -> dict:
    """{lesson number: {seconds, passed}}: one submission of each lesson's solution graded through
    class grading (sealed where a sandbox starts), once each, the wall time of grade_class."""
    measured = {}
    with tempfile.TemporaryDirectory(prefix="grade-lesson-bench-") as scratch:
        for solution in course_notebooks(root / SOLUTIONS):
            if not matches_numbers(solution, only):
                continue
            path = Path(scratch) / solution.stem / solution.name
            path.parent.mkdir(parents=True)
            nbformat.write(solved_copy(solution), path)
            for name in grading.FILES_BESIDE.get(solution.name, ()):
                shutil.copy(importlib.import_module(ANSWERS_BESIDE[name]).__file__, path.parent / name)
            started = time.monotonic()
            [grade] = class_grading.grade_class(solution, [Submission(solution.stem, path)],
                                                sandbox=limits)
            seconds = time.monotonic() - started
            passed = grade.status == "graded" and all(grade.passed.values())
            measured[solution.name[:2]] = {"seconds": round(seconds, 1), "passed": passed,
                                           "load_average": round(os.getloadavg()[0], 1)}
            failed = [name for name, ok in grade.passed.items() if not ok] or grade.notes[-1:]
            print(f"  {solution.name}: {seconds:.1f} s, "
                  f"{'every check passed' if passed else f'NOT all passed ({grade.status}): {failed}'}",
                  flush=True)
    return measured


def per_lesson_seconds(results: dict, jobs_run: dict) -> dict:
    """{lesson: (seconds, how we know)}: measured where --per-lesson timed it; else the solution's
    run time (pacing.MEASURED_RUN_SECONDS) plus the grading overhead that lesson's own figures give."""
    measured = results.get("per_lesson", {}).get("lessons", {})
    overheads = [entry["seconds"] - MEASURED_RUN_SECONDS[number] for number, entry in measured.items()]
    if jobs_run:
        number = jobs_run["lesson"][:2]
        overheads.append(jobs_run["jobs_1_s"] / jobs_run["learners"] - MEASURED_RUN_SECONDS[number])
    overhead = max(0.0, sum(overheads) / len(overheads)) if overheads else 0.0
    return {number: ((measured[number]["seconds"], "measured") if number in measured else
                     (run + overhead, f"assumed: run {run} s + overhead {overhead:.1f} s"))
            for number, run in MEASURED_RUN_SECONDS.items()}


def project(results: dict, args) -> dict:
    """The model: each learner's submission of each lesson is a job of 2 ranks x 1 thread on 2
    cores, as fast as one graded at --jobs 1 on this machine; a node of C cores grades C/2 at once;
    a job array's tasks go to whichever slot frees first, so the class takes at most
    (all the work / slots) + the longest one submission (Graham's bound for list scheduling)."""
    seconds = per_lesson_seconds(results, results.get("jobs"))
    work_per_learner = sum(value for value, _ in seconds.values())
    jobs_per_node = max(1, args.cores_per_node // RANKS)
    slots = args.nodes * jobs_per_node
    longest = max(value for value, _ in seconds.values())
    lower = args.class_size * work_per_learner / slots
    upper = lower + longest
    model = {
        "label": "a model, not a measurement",
        "assumptions": [
            f"a node of {args.cores_per_node} cores grades {jobs_per_node} submissions at a time "
            f"({RANKS} ranks of 1 thread each), each as fast as one at --jobs 1 on this machine's "
            f"2 cores (memory bandwidth shared on the node is not counted)",
            "the job array's tasks start at once on free slots: SLURM's queueing and the time "
            "before the partition is free are not counted, nor about 1 s of task start-up; a "
            "lesson is one `check --slurm` (200 tasks at --chunk 1, under SLURM's default "
            f"MaxArraySize of 1001), the {len(seconds)} submitted together",
            "per-lesson seconds: 'measured' ones graded here sealed, once each; 'assumed' ones are "
            "the solution's run time plus the mean grading overhead measured" + _load_said(results)],
        "nodes": args.nodes, "cores_per_node": args.cores_per_node, "class_size": args.class_size,
        "lessons": len(seconds), "slots": slots,
        "seconds_per_lesson": {number: {"seconds": round(value, 1), "source": source}
                               for number, (value, source) in seconds.items()},
        "seconds_per_learner": round(work_per_learner),
        "one_at_a_time_hours": round(args.class_size * work_per_learner / 3600, 1),
        "projected_minutes": [round(lower / 60), round(upper / 60)],
    }
    print(f"\nmodel (not a measurement): {', '.join(model['assumptions'])}.")
    for number, (value, source) in seconds.items():
        print(f"  lesson {number}: {value:6.1f} s  {source}")
    print(f"projected: {args.class_size} learners x {len(seconds)} lessons = "
          f"{args.class_size * len(seconds)} submissions, {work_per_learner:.0f} s a learner, on "
          f"{args.nodes} nodes of {args.cores_per_node} cores ({slots} at a time): "
          f"{lower / 60:.0f} to {upper / 60:.0f} minutes ({model['one_at_a_time_hours']} hours one "
          f"at a time on one 2-core machine)")
    return model


def _load_said(results: dict) -> str:
    """How busy the machine was while the lessons were timed: above its cores, they are slower."""
    runs = results.get("per_lesson", {}).get("runs", [])
    lessons = results.get("per_lesson", {}).get("lessons", {})
    started = {number: run["load_average_at_start"] for run in runs for number in run["lessons"]}  # the last run's
    loads = [entry.get("load_average", started.get(number)) for number, entry in lessons.items()]
    loads = [load for load in loads if load is not None]
    if not loads or max(loads) <= runs[0]["cores"]:
        return ""
    return (f"; the {runs[0]['cores']}-core machine was shared with other work (load average "
            f"{min(loads):g} to {max(loads):g} where recorded), so the measured seconds are high")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lesson", default="01")
    parser.add_argument("--learners", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4, help="alternations of --jobs 1 and 2")
    parser.add_argument("--per-lesson", action="store_true",
                        help="time one submission of each lesson instead of the --jobs comparison")
    parser.add_argument("--only", action="append", default=[], metavar="NN",
                        help="with --per-lesson: only lesson NN (repeat it, or 3,4)")
    parser.add_argument("--project-only", action="store_true",
                        help="measure nothing: print the projection from RESULTS")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--cores-per-node", type=int, default=32)
    parser.add_argument("--class-size", type=int, default=200)
    args = parser.parse_args()
    root = find_course_root()
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if not args.project_only:
        missing = sandbox.why_unavailable()
        limits = None if missing else sandbox.Limits()
        machine = {"cores": len(os.sched_getaffinity(0)), "cpu": platform.processor() or platform.machine(),
                   "sealed": limits is not None, "load_average_at_start": round(os.getloadavg()[0], 1),
                   "date": time.strftime("%Y-%m-%d", time.gmtime())}
        print(f"{machine['cores']} cores, {'sealed (bubblewrap)' if limits else 'NOT sealed: ' + missing}, "
              f"load average {machine['load_average_at_start']} at the start", flush=True)
        if args.per_lesson:
            earlier = results.get("per_lesson", {"runs": [], "lessons": {}})
            timed = time_each_lesson(root, args.only, limits)
            earlier["runs"].append(dict(machine, lessons=sorted(timed)))
            earlier["lessons"] = dict(sorted({**earlier["lessons"], **timed}.items()))
            results["per_lesson"] = earlier
        else:
            results["jobs"] = dict(compare_jobs(root, args, limits), machine=machine)
    results["projection"] = project(results, args)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written to {RESULTS.relative_to(root)}")


if __name__ == "__main__":
    main()
