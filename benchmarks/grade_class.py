"""Grading a class at --jobs 1 and --jobs 2 side by side: the seconds, their ratio, and the time
projected for 200 learners x 17 lessons on a 10-node partition.

The class is 40 submissions of a real lesson (default 01, the quickest): half hand in the solution,
half the lesson's stubs. Each is graded sealed where a sandbox starts here (else without, and it
says so). The two settings alternate in rounds over the same learners, so that whatever else runs
on the machine slows both alike.

    python benchmarks/grade_class.py [--lesson 01] [--learners 40] [--rounds 4]
                                     [--nodes 10] [--cores-per-node 32] [--class-size 200]
"""
import argparse
import os
import tempfile
import time
from pathlib import Path

import nbformat

from course_lib.authoring import class_grading, sandbox
from course_lib.authoring.cells import is_solution_only
from course_lib.authoring.layout import LESSONS, SOLUTIONS, find_course_root, find_lesson
from course_lib.authoring.pacing import MEASURED_RUN_SECONDS
from course_lib.authoring.submissions import Submission

RANKS = class_grading.RANKS_PER_SUBMISSION


def make_class(root: Path, lesson: Path, learners: int, folder: Path) -> list:
    """`learners` submissions of `lesson`: even ones the solution (less its solution-only cells),
    odd ones the lesson as handed out (its stubs)."""
    solved = nbformat.read(root / SOLUTIONS / lesson.name, as_version=4)
    solved.cells = [cell for cell in solved.cells if not is_solution_only(cell)]
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


def project(per_submission_s: float, lesson: str, args) -> None:
    """Print the model and its figure: a submission of lesson L takes L's notebook run time plus
    the grading overhead measured here (sandbox, pytest, kernel), nodes x jobs per node at once."""
    run_seconds = MEASURED_RUN_SECONDS
    overhead_s = max(0.0, per_submission_s - run_seconds[lesson])
    course_s = sum(seconds + overhead_s for seconds in run_seconds.values())
    jobs_per_node = max(1, args.cores_per_node // RANKS)
    slots = args.nodes * jobs_per_node
    total_s = args.class_size * course_s / slots
    print(f"\nmodel: a submission of lesson L takes run(L) + {overhead_s:.1f} s, the overhead measured "
          f"here ({per_submission_s:.1f} s a submission of {lesson} at --jobs 1, less its run of "
          f"{run_seconds[lesson]} s); run(L): each solution's seconds on 2 cores "
          f"(pacing.MEASURED_RUN_SECONDS), {len(run_seconds)} lessons, {course_s:.0f} s a learner. "
          f"A node of {args.cores_per_node} cores grades {jobs_per_node} submissions at a time "
          f"({RANKS} ranks, 1 thread each), each as fast as one at --jobs 1 on 2 cores here; "
          f"SLURM's queueing and start-up are not counted")
    print(f"projected: {args.class_size} learners x {len(run_seconds)} lessons on {args.nodes} nodes "
          f"({slots} at a time): {total_s / 60:.0f} minutes "
          f"({args.class_size * course_s / 3600:.1f} hours one at a time on one such 2-core machine)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lesson", default="01")
    parser.add_argument("--learners", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=4, help="alternations of --jobs 1 and 2")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--cores-per-node", type=int, default=32)
    parser.add_argument("--class-size", type=int, default=200)
    args = parser.parse_args()
    root = find_course_root()
    lesson = find_lesson(args.lesson, root)
    solution = root / SOLUTIONS / lesson.name
    missing = sandbox.why_unavailable()
    limits = None if missing else sandbox.Limits()
    cores = len(os.sched_getaffinity(0))
    print(f"{lesson.stem}: {args.learners} submissions (half solved, half stubs), "
          f"{'sealed (bubblewrap)' if limits else 'NOT sealed: ' + missing}, {cores} cores, "
          f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
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
    project(seconds[1] / args.learners, lesson.name[:2], args)


if __name__ == "__main__":
    main()
