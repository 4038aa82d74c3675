"""Authoring the course's notebooks: the commands on top, the pipelines they call below.

    commands       check, build-lessons, run-solutions, pacing: flags in, reports printed
    build          lessons/ from solutions/: exercises become stubs, no outputs, deterministic
    grading        one learner's notebook: the course's check cells put back, run under nbval
    judge          the class verdict: each check replayed from the sandbox's record, no learner code
    copy_detection a submission that reaches or copies the course's answers, found by reading it
    sandbox        bubblewrap around a grading: read-only Python, a private folder, no network, limits
    sandbox_entry  what runs first inside it: the limits set, root's uid dropped, then pytest
    submissions    who handed in what: a submission per learner; copies, other lessons noted
    class_grading  a class graded N at a time, each grade kept as it is given (--resume)
    gradebook      a row per learner: roster, points per exercise, total, feedback, notes
    exports        the gradebook as CSV and JSON, and the CSVs Canvas and Gradescope import
    run_solutions  the solutions executed with nbclient: pass/fail, seconds, device
    slurm_run      run-solutions as a SLURM batch job: submit it, follow it, read its report
    slurm_grading  a class as a SLURM job array: a task per chunk of learners, merged grades
    pacing         each lesson's minutes, from a model written down
    restore        the course's check cells put back into a submission
    cells          the roles of a cell (exercise, check, solution-only) and their markers
    layout         where the course's notebooks are, and their names
    sanitize       nbval's rules for output that varies from run to run
    scrub          machine paths out of stored outputs, colours out of reported tracebacks

commands imports the pipelines and no pipeline imports it; no module here is in an import circle
with another (tests/test_layout.py says so).

A maintainer's loop, from the course folder:
    edit solutions/NN_topic.ipynb (solution code between `### BEGIN SOLUTION` / `### END SOLUTION`)
    python -m course_lib run-solutions --only NN --write   # execute it, store outputs, no paths
    python -m course_lib build-lessons                     # write lessons/NN_topic.ipynb
    python -m pytest tests/authoring/test_notebooks.py     # solution passes, lesson fails, fresh

An instructor's run on a GPU node reached through SLURM:
    python -m course_lib run-solutions --slurm --partition P --gpus-per-node N   # the same, through SLURM
    python -m course_lib check NN CLASS --csv grades.csv --slurm --partition P   # grade a class there
"""
