"""Grading a class: each submission in its own nbval process (and sandbox), N at a time, each
learner's grade appended to a JSON-lines state file as it finishes, so a killed run resumes.

The processes share the machine's cores: each gets threads = cores // (jobs * ranks).
"""
import datetime
import hashlib
import json
import os
import secrets
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

from . import grading
from .gradebook import ERROR, LearnerGrade, cell_roles, learner_grade

RANKS_PER_SUBMISSION = 2  # the lessons launch 2 ranks on a CPU
STATE_FORMAT = "course_lib class grading state, one learner a line"


class StateFileError(LookupError):
    """The state file belongs to another run (another lesson or solution), or is damaged."""


def state_path_for(output: Path) -> Path:
    """grades.state.jsonl beside grades.csv."""
    return Path(output).with_suffix(".state.jsonl")


def threads_per_job(jobs: int, cores: int = None, ranks: int = RANKS_PER_SUBMISSION) -> int:
    """Intra-op threads for one rank of one submission, so that `jobs` submissions of `ranks`
    processes each use the cores once over and do not fight for them."""
    cores = cores or len(os.sched_getaffinity(0))
    return max(1, cores // (jobs * ranks))


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def grade_class(solution: Path, submissions, *, timeout_s: float = grading.DEFAULT_TIMEOUT_S,
                cell_timeout_s: float = grading.DEFAULT_CELL_TIMEOUT_S, jobs: int = 1,
                sandbox=None, state: Path = None, resume: bool = False, on_graded=None,
                seed_offset: int = None) -> list:
    """A LearnerGrade per submission that has a notebook, in the order of `submissions`: graded
    `jobs` at a time, each appended to `state` as it finishes (with `resume`, those already
    there are kept and not graded again). `on_graded(grade, done, total)` follows progress.
    Each submission is judged on inputs of its own (a seed offset drawn for it, kept in its
    grade, and drawn again the same on --resume), or all on `seed_offset` when given."""
    gradable = [submission for submission in submissions if submission.notebook is not None]
    journal = StateFile(state, solution) if state else None
    kept = journal.start(resume) if journal else {}
    grades, pending, offsets = {}, [], {}
    for submission in gradable:
        earlier = kept.get(submission.learner)
        if earlier is not None and earlier.sha256 == file_sha256(submission.notebook):
            grades[submission.learner] = earlier
        else:
            pending.append(submission)
            offsets[submission.learner] = (seed_offset or getattr(earlier, "seed_offset", 0)
                                           or 1 + secrets.randbelow(grading.SEED_OFFSETS))
    threads, roles = threads_per_job(jobs), cell_roles(solution)

    def finish(grade: LearnerGrade, crashed: bool) -> None:
        grades[grade.learner] = grade
        if journal and not crashed:  # a crash of the grader itself is retried by --resume
            journal.append(grade)
        if on_graded:
            on_graded(grade, len(grades), len(gradable))

    def run(submission):
        return _grade_one(submission, solution, timeout_s, cell_timeout_s, sandbox, threads, roles,
                          offsets[submission.learner])

    if on_graded and grades:
        on_graded(None, len(grades), len(gradable))
    if jobs <= 1:
        for submission in pending:
            finish(*run(submission))
    else:
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="grade") as pool:
            futures = {pool.submit(run, submission) for submission in pending}
            try:
                for future in as_completed(futures):
                    futures.discard(future)
                    finish(*future.result())
            except KeyboardInterrupt:  # start no more; keep what the running gradings give
                running = [future for future in futures if not future.cancel()]
                for future in running:
                    finish(*future.result())
                raise
    return [grades[submission.learner] for submission in gradable]


def _grade_one(submission, solution, timeout_s, cell_timeout_s, sandbox, threads, roles, seed_offset):
    """(LearnerGrade, crashed): the grade of one submission, in its own process (and sandbox)."""
    sha256 = file_sha256(submission.notebook)
    try:
        result = grading.grade(submission.notebook, solution, timeout_s, cell_timeout_s,
                               sandbox=sandbox, threads=threads, seed_offset=seed_offset)
    except Exception as error:  # the grader failed, not the learner: say so, retry on --resume
        crashed = LearnerGrade(submission.learner, str(submission.notebook), ERROR,
                               notes=list(submission.notes) + [
                                   f"grading crashed ({type(error).__name__}: {error}); "
                                   f"run again with --resume to grade it again"],
                               graded_at=_now(), sha256=sha256, seed_offset=seed_offset)
        return crashed, True
    return learner_grade(submission.learner, result, submission.notes, _now(), sha256, roles), False


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class StateFile:
    """The JSON-lines journal of a class grading: a header line (lesson, solution's hash), then a
    LearnerGrade per line, each flushed to disk before the next learner is counted done."""

    def __init__(self, path: Path, solution: Path):
        self.path = Path(path)
        self.header = {"format": STATE_FORMAT, "lesson": Path(solution).name,
                       "solution_sha256": file_sha256(solution)}

    def start(self, resume: bool) -> dict:
        """{learner: LearnerGrade} kept from an earlier run (with `resume`); a new file otherwise."""
        if not resume:
            if self.path.exists():
                raise StateFileError(
                    f"{self.path} holds the grades of an earlier run: add --resume to keep them and "
                    f"grade only the learners it lacks, or delete it to grade everyone again")
            self._rewrite([])
            return {}
        if not self.path.exists():
            self._rewrite([])
            return {}
        kept = self._read()
        self._rewrite(kept.values())  # drops a line cut short by a kill
        return kept

    def append(self, grade: LearnerGrade) -> None:
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps(asdict(grade), ensure_ascii=False) + "\n")
            file.flush()
            os.fsync(file.fileno())

    def _read(self) -> dict:
        # a last line without its newline was cut short by a kill: it is left out
        complete = self.path.read_text(encoding="utf-8").split("\n")[:-1]
        if not complete:
            return {}
        header = self._parse(complete[0], 1)
        for key in ("lesson", "solution_sha256"):
            if header.get(key) != self.header[key]:
                raise StateFileError(
                    f"{self.path} was written grading {header.get('lesson')} with another version of "
                    f"its solution's check cells ({key} differs): grades from two versions must "
                    f"not mix; delete it to grade everyone again")
        kept = {}
        for number, line in enumerate(complete[1:], start=2):
            if line.strip():
                grade = LearnerGrade(**self._parse(line, number))
                kept[grade.learner] = grade
        return kept

    def _parse(self, line: str, number: int) -> dict:
        try:
            return json.loads(line)
        except json.JSONDecodeError as error:
            raise StateFileError(f"line {number} of {self.path} is not JSON ({error}): the file "
                                 f"was edited or damaged; delete it to grade everyone again") from None

    def _rewrite(self, grades) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        with open(temporary, "w", encoding="utf-8") as file:
            file.write(json.dumps(self.header) + "\n")
            for grade in grades:
                file.write(json.dumps(asdict(grade), ensure_ascii=False) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
