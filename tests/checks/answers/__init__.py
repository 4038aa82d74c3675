"""Answers that test the graders: one module per lesson, beside the tests that run them.

tests/checks/answers/lessonNN.py declares, for lesson NN's graders:

    WRONG_ANSWERS  grader -> plausible wrong answers; each must be rejected with a verdict (3 or more)
    ALTERNATIVES   grader -> correct answers written differently from the solution; each must pass
                   (2 or more)
    SLOW_CHECKS    graders whose answers belong to the slow tier (they run torchrun, time loaders)

They are fixtures of tests/checks/test_checks.py and test_checks_alternatives.py, not part of
course_lib: a learner who imports the course cannot import them.
"""
import importlib
import pkgutil
import re
from dataclasses import dataclass, field

import pytest

import course_lib.checks


@dataclass
class WrongAnswer:
    """A plausible mistake, as the arguments a grader is called with; the grader must reject it."""

    description: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    slow: bool = False  # it hangs until the grader's timeout: its test belongs to the slow tier


def wrong_answer(description: str, *args, **kwargs) -> WrongAnswer:
    """A wrong answer for WRONG_ANSWERS: `description` says what mistake it makes."""
    return WrongAnswer(description, args, kwargs)


def hanging_wrong_answer(description: str, *args, **kwargs) -> WrongAnswer:
    """A wrong answer that hangs until the grader's timeout (seconds): tested in the slow tier."""
    return WrongAnswer(description, args, kwargs, slow=True)


def answer(description, *args, **kwargs):
    """A correct answer for ALTERNATIVES, as the arguments its grader is called with."""
    return pytest.param(args, kwargs, id=description)


def lesson_of(module_name: str) -> str:
    """'lesson04' for course_lib.checks.lesson04 and for course_lib.checks.lesson04.buckets."""
    match = re.search(r"\.(lesson\d\d)(\.|_|$)", module_name)
    if not match:
        raise ValueError(f"{module_name} is not a lesson's module")
    return match.group(1)


def grader_modules() -> list:
    """Every module of course_lib.checks that belongs to a lesson: lessonNN and lessonNN.*."""
    return [importlib.import_module(info.name)
            for info in pkgutil.walk_packages(course_lib.checks.__path__, course_lib.checks.__name__ + ".")
            if re.search(r"\.lesson\d\d(\.|_|$)", info.name)]


def graders_of(module) -> list:
    """The graders a module defines: functions made by @grader in that very module."""
    return [value for value in vars(module).values()
            if callable(value) and hasattr(value, "exercise")
            and getattr(value, "__module__", None) == module.__name__]


def all_graders() -> dict:
    """lesson name -> its graders, from course_lib.checks."""
    found = {}
    for module in grader_modules():
        found.setdefault(lesson_of(module.__name__), []).extend(graders_of(module))
    return found


def answer_modules() -> list:
    """Every tests/checks/answers/lessonNN.py, imported."""
    return [importlib.import_module(f"{__name__}.{info.name}")
            for info in pkgutil.iter_modules(__path__) if re.fullmatch(r"lesson\d\d", info.name)]


def case_id(check, description: str) -> str:
    return f"{lesson_of(check.__module__)}.{check.__name__}:{description}"
