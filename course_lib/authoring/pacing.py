"""How long a lesson takes a learner, from a model written down: reading, running, exercises.

Each lesson's first cell states "about N minutes (R reading and running, E for the exercises)";
`python -m course_lib pacing` prints what this model gives for each solution notebook (`--write`
restates the first cells; then build-lessons), and tests/authoring/test_pacing.py fails when a first
cell or the README's total says otherwise. A section whose `## ` heading says "(optional)" is extra
practice outside the timed path, and is not counted.
"""
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from .cells import BEGIN_SOLUTION, END_SOLUTION, exercise_name, is_check_cell, is_solution_only

PROSE_WORDS_PER_MINUTE = 180  # technical prose read to understand it (plain text: about 250)
CODE_LINES_PER_MINUTE = 10    # code read line by line, to follow what it does
SECONDS_PER_CODE_CELL = 15    # run a cell, look at what it printed or drew
EXERCISE_MINUTES = {"FILL-IN": 5, "MEASURE": 10, "DIAGNOSE": 12, "BUILD": 15}
EXERCISE_SIZE = {"check_capstone": 3,  # the capstone converts a whole script: three builds' worth
                 "check_fsdp_unit": 2}  # six hooks of one unit, a prefetch among them
PAUSE_OVER_MINUTES = 90       # a longer lesson says where to pause
OPTIONAL = "(optional)"       # in a `## ` heading: a section outside the lesson's timed path

# Seconds each solution took to execute on 2 CPU cores (run-solutions, 2026-11-26, this course's CI
# machine with other work beside it): waiting for cells is part of reading and running.
MEASURED_RUN_SECONDS = {"00": 32, "01": 18, "02": 36, "03": 44, "04": 88, "05": 41, "06": 43,
                        "07": 27, "08": 53, "09": 36, "10": 60, "11": 29, "12": 78, "13": 97,
                        "14": 230, "15": 49, "16": 36, "17": 34,
                        "18": 25, "19": 15, "20": 20, "21": 20}

# What each exercise asks of the learner (its grader's name): fill in a given recipe, build a
# mechanism, measure this machine, or diagnose a broken run they were not told the cause of.
EXERCISE_KINDS = {
    "check_whoami": "FILL-IN", "check_where_output_goes": "FILL-IN",
    "check_throughput": "MEASURE", "check_global_batch_size": "FILL-IN",
    "check_scatter_batch": "BUILD", "check_gather_outputs": "BUILD",
    "check_data_parallel_gradients": "BUILD",
    "check_collective_puzzle": "FILL-IN", "check_ring_all_reduce": "BUILD",
    "check_measure_alpha_beta": "MEASURE", "check_global_loss": "BUILD",
    "check_broadcast_parameters": "FILL-IN", "check_train_step_by_hand": "FILL-IN",
    "check_indices_for_rank": "BUILD", "check_hidden_share": "BUILD",
    "check_best_bucket_cap": "MEASURE",
    "check_train_with_accumulation": "BUILD",
    "check_fp16_round_trip": "BUILD", "check_amp_step": "BUILD", "check_amp_accumulation_step": "BUILD",
    "check_atomic_save": "BUILD", "check_resume": "BUILD", "check_prune_checkpoints": "BUILD",
    "check_log_mean_loss": "DIAGNOSE", "check_wrap_model": "DIAGNOSE",
    "check_indices_per_epoch": "DIAGNOSE", "check_save_checkpoint": "DIAGNOSE",
    "check_replica_health": "BUILD",
    "check_scaling_efficiency": "MEASURE", "check_communication_share": "MEASURE",
    "check_accumulation_plan": "FILL-IN",
    "check_loader_measurement": "MEASURE", "check_fast_loader": "BUILD",
    "check_distributed_evaluation": "BUILD",
    "check_largest_batch": "MEASURE", "check_held_bytes": "MEASURE",
    "check_recipes_that_fit": "BUILD",
    "check_global_rank": "BUILD", "check_ranks_on_my_node": "BUILD",
    "check_health_check": "MEASURE",
    "check_end_of_epoch": "DIAGNOSE", "check_load_data": "DIAGNOSE",
    "check_step_and_loss": "DIAGNOSE", "check_hand_ddp_step": "DIAGNOSE",
    "check_add_noise": "DIAGNOSE", "check_make_loader": "DIAGNOSE", "check_wrap_for_ddp": "DIAGNOSE",
    "check_capstone": "BUILD",
    "check_overlapping_ddp": "BUILD", "check_plan_buckets": "BUILD", "check_bucketed_ddp": "BUILD",
    "check_sharded_optimizer": "BUILD", "check_gather_full": "BUILD", "check_fsdp_unit": "BUILD",
    "check_tensor_parallel": "BUILD", "check_sequence_parallel": "BUILD",
    "check_one_f_one_b": "BUILD", "check_idle_share": "MEASURE",
    "check_checkpoint": "BUILD", "check_mixed_precision_unit": "BUILD",
    "check_mesh_groups": "BUILD", "check_parallelize": "BUILD",
    "check_bytes_per_gpu": "BUILD", "check_fitting_plans": "BUILD",
}
STATED = re.compile(r"(?i)(about\**\s+)(\d+)( minutes\**(?::|\s*\()\s*)(\d+)"
                    r"( (?:to read and run|reading and running)[^,]*,\s*)(\d+)( for)")


@dataclass
class Pace:
    lesson: str
    prose_words: int
    code_lines: int
    code_cells: int
    exercises: list  # [(grader name, kind)]
    pause_before: str = ""  # the section heading nearest the lesson's middle, for a long lesson

    @property
    def reading_and_running(self) -> int:
        minutes = (self.prose_words / PROSE_WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE
                   + self.code_cells * SECONDS_PER_CODE_CELL / 60
                   + MEASURED_RUN_SECONDS.get(self.lesson, 60) / 60)
        return _to_five(minutes)

    @property
    def exercise_minutes(self) -> int:
        return _to_five(sum(EXERCISE_MINUTES[kind] * EXERCISE_SIZE.get(name, 1)
                            for name, kind in self.exercises))

    @property
    def minutes(self) -> int:
        return self.reading_and_running + self.exercise_minutes


def pace(path: Path) -> Pace:
    """The model's count of a solution notebook: prose and code a learner reads (not the exercise
    regions, which the learner writes, nor check cells), code cells run, exercises by kind; an
    optional section is left out (_timed_path)."""
    cells = _timed_path([cell for cell in nbformat.read(path, as_version=4).cells
                         if not is_solution_only(cell)])
    words = sum(len(re.findall(r"[A-Za-z0-9_']+", cell.source)) for cell in cells
                if cell.cell_type == "markdown")
    code = [cell for cell in cells if cell.cell_type == "code" and not is_check_cell(cell)]
    lines = sum(len(_read_lines(cell.source)) for cell in code)
    exercises = [(exercise_name(cell), EXERCISE_KINDS.get(exercise_name(cell), "?"))
                 for cell in cells if is_check_cell(cell)]
    lesson = Pace(Path(path).name[:2], words, lines, len(code), exercises)
    if lesson.minutes > PAUSE_OVER_MINUTES:
        lesson.pause_before = _middle_section(cells)
    return lesson


def _timed_path(cells) -> list:
    """The cells but those of optional sections: a section whose `## ` heading says "(optional)",
    from the markdown cell that opens with that heading to the next cell that opens with a `## `
    heading. An extra for those who want more practice is not part of the lesson's length."""
    kept, optional = [], False
    for cell in cells:
        opening = cell.source.lstrip().splitlines()[0] if cell.source.strip() else ""
        if cell.cell_type == "markdown" and opening.startswith("## "):
            optional = OPTIONAL in opening.lower()
        if not optional:
            kept.append(cell)
    return kept


def _middle_section(cells) -> str:
    """The `## ` section whose start is nearest to half of the lesson's minutes (reading its prose
    and code, doing its exercises)."""
    weights = [len(re.findall(r"[A-Za-z0-9_']+", cell.source)) / PROSE_WORDS_PER_MINUTE
               if cell.cell_type == "markdown" else _exercise_minutes(cell) if is_check_cell(cell)
               else len(_read_lines(cell.source)) / CODE_LINES_PER_MINUTE for cell in cells]
    half, elapsed, best = sum(weights) / 2, 0.0, ("", float("inf"))
    for cell, weight in zip(cells, weights):
        headings = [line for line in cell.source.splitlines() if line.startswith("## ")]
        if cell.cell_type == "markdown" and headings and abs(elapsed - half) < best[1]:
            best = (headings[0][3:].strip(), abs(elapsed - half))
        elapsed += weight
    return best[0]


def stated(first_cell: str):
    """(minutes, reading and running, exercises) as a lesson's first cell states them, or None."""
    found = STATED.search(first_cell)
    return (int(found.group(2)), int(found.group(4)), int(found.group(6))) if found else None


def restate(first_cell: str, lesson: Pace) -> str:
    """The first cell with the model's three numbers in place of the stated ones."""
    return STATED.sub(lambda m: f"{m.group(1)}{lesson.minutes}{m.group(3)}{lesson.reading_and_running}"
                                f"{m.group(5)}{lesson.exercise_minutes}{m.group(7)}", first_cell, count=1)


def stated_in(path: Path):
    """stated() of the first cell of the notebook at `path`."""
    return stated(nbformat.read(path, as_version=4).cells[0].source)


def restate_notebook(path: Path, lesson: Pace) -> bool:
    """Restate the first cell of the notebook at `path` with the model's minutes where it states
    other ones; whether the file changed."""
    notebook = nbformat.read(path, as_version=4)
    said = stated(notebook.cells[0].source)
    if not said or said == (lesson.minutes, lesson.reading_and_running, lesson.exercise_minutes):
        return False
    notebook.cells[0].source = restate(notebook.cells[0].source, lesson)
    nbformat.write(notebook, path)
    return True


def _exercise_minutes(check_cell) -> float:
    name = exercise_name(check_cell)
    return EXERCISE_MINUTES.get(EXERCISE_KINDS.get(name), 0) * EXERCISE_SIZE.get(name, 1)


def _read_lines(source: str) -> list:
    """The non-blank lines outside exercise regions: what the learner reads, not writes."""
    kept, inside = [], False
    for line in source.splitlines():
        if line.strip() == BEGIN_SOLUTION:
            inside = True
        elif line.strip() == END_SOLUTION:
            inside = False
        elif not inside and line.strip():
            kept.append(line)
    return kept


def _to_five(minutes: float) -> int:
    return max(5, int(5 * round(minutes / 5)))
