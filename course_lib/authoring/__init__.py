"""Authoring the course's notebooks: build lessons from solutions, grade them, execute them.

The CLI's build-lessons, check and run-solutions commands call the three `*_main` functions.
"""
from .build import build_lessons_main
from .grade import check_main
from .run import run_solutions_main

__all__ = ["build_lessons_main", "check_main", "run_solutions_main"]
