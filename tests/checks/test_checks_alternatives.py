"""Every grader accepts correct answers written differently from the reference solution.

A grader stricter than its exercise's text teaches the learner that the right idea is wrong. For
each grader, tests/checks/answers/lessonNN.py's ALTERNATIVES holds at least two correct answers
that use other APIs, other algorithms or other types than the solution notebook; each must pass.
The wrong answers sit beside them (WRONG_ANSWERS, run by tests/checks/test_checks.py).
"""
import pytest

from answers import all_graders, answer_modules, case_id
from course_lib.checks.engine import passed_line
from test_measured_graders import arguments_of

pytestmark = pytest.mark.timeout(300)

MIN_ALTERNATIVES = 2


def declared_alternatives() -> dict:
    """grader -> its correct alternatives, from every tests/checks/answers/lessonNN.py."""
    declared = {}
    for module in answer_modules():
        for check, cases in getattr(module, "ALTERNATIVES", {}).items():
            declared.setdefault(check, []).extend(cases)
    return declared


ALTERNATIVES = declared_alternatives()
SLOW = {check for module in answer_modules() for check in getattr(module, "SLOW_CHECKS", ())}
ALTERNATIVE_CASES = [
    pytest.param(check, *case.values, id=case_id(check, case.id),
                 marks=[pytest.mark.slow] if check in SLOW else [])
    for check, cases in ALTERNATIVES.items() for case in cases
]
GRADERS = all_graders()


@pytest.mark.parametrize("check, args, kwargs", ALTERNATIVE_CASES)
def test_grader_accepts_an_alternative_correct_answer(check, args, kwargs, capsys):
    check(*arguments_of(args), **kwargs)
    assert capsys.readouterr().out == passed_line(check.exercise) + "\n"


@pytest.mark.parametrize("lesson", sorted(GRADERS))
def test_every_grader_has_two_alternative_correct_answers(lesson):
    short = [f"{check.__module__}.{check.__name__} has {len(ALTERNATIVES.get(check, []))}"
             for check in GRADERS[lesson] if len(ALTERNATIVES.get(check, [])) < MIN_ALTERNATIVES]
    assert not short, (f"add correct answers written differently from the solution to "
                       f"tests/checks/answers/{lesson}.py's ALTERNATIVES: " + "; ".join(short))
