"""Authoring the course's notebooks: build lessons from solutions, grade them, execute them.

The CLI's build-lessons, check and run-solutions commands call the three `*_main` functions.

A maintainer's loop, from the course folder:
    edit solutions/NN_topic.ipynb (solution code between `### BEGIN SOLUTION` / `### END SOLUTION`)
    python -m course_lib run-solutions --only NN --write   # execute it, store outputs, no paths
    python -m course_lib build-lessons                     # write lessons/NN_topic.ipynb
    python -m pytest tests/authoring/test_notebooks.py     # solution passes, lesson fails, fresh

An instructor's run on a GPU node reached through SLURM:
    python -m course_lib run-solutions --slurm --partition P --gpus-per-node N   # the same, through SLURM
"""
from .build import build_lessons_main
from .check import check_main
from .run_solutions import run_solutions_main

__all__ = ["build_lessons_main", "check_main", "run_solutions_main"]
