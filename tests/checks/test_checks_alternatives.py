"""Every grader accepts correct answers written differently from the reference solution.

A grader stricter than its exercise's text teaches the learner that the right idea is wrong. For
each grader, tests/checks/answers/lessonNN.py's ALTERNATIVES holds at least two correct answers
that use other APIs, other algorithms or other types than the solution notebook; each must pass.
The wrong answers sit beside them (WRONG_ANSWERS, run by tests/checks/test_checks.py).

The first alternative of each grader runs as class grading runs it: recorded beside the answer's
code on data drawn at grading time (a seed offset), then replayed in the judge, where its functions
are placeholders that cannot run: it must pass on the recorded outcomes of its crossings alone
(engine/record.py; one wrong answer per lesson is replayed in tests/checks/test_checks.py). So a grader that runs learner code outside a
crossing, lets something that is not plain data cross, or compares on the learner's side fails here.
"""
import pytest

from answers import all_graders, answer_modules, case_id
from course_lib.checks.engine import passed_line
from course_lib.checks.engine.record import replay_check
from recorded import SEED_OFFSET, record_check
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
    pytest.param(check, *case.values, index == 0, id=case_id(check, case.id),
                 marks=[pytest.mark.slow] if check in SLOW else [])
    for check, cases in ALTERNATIVES.items() for index, case in enumerate(cases)
]
GRADERS = all_graders()


@pytest.mark.parametrize("check, args, kwargs, replayed", ALTERNATIVE_CASES)
def test_grader_accepts_an_alternative_correct_answer(check, args, kwargs, replayed, capsys, tmp_path):
    if not replayed:
        check(*arguments_of(args), **kwargs)
        assert capsys.readouterr().out == passed_line(check.exercise) + "\n"
        return
    in_notebook, entry = record_check(check, arguments_of(args), kwargs, SEED_OFFSET, tmp_path)
    assert in_notebook == "passed", f"the correct answer failed on grading-time data:\n{in_notebook}"
    assert capsys.readouterr().out == passed_line(check.exercise) + "\n"
    verdict = replay_check(check, entry, SEED_OFFSET)
    assert verdict.passed, f"replayed in the judge, {check.__name__} said:\n{verdict.message}"
    assert capsys.readouterr().out == "", "the judge printed: it must only return its verdict"


@pytest.mark.parametrize("lesson", sorted(GRADERS))
def test_every_grader_has_two_alternative_correct_answers(lesson):
    short = [f"{check.__module__}.{check.__name__} has {len(ALTERNATIVES.get(check, []))}"
             for check in GRADERS[lesson] if len(ALTERNATIVES.get(check, [])) < MIN_ALTERNATIVES]
    assert not short, (f"add correct answers written differently from the solution to "
                       f"tests/checks/answers/{lesson}.py's ALTERNATIVES: " + "; ".join(short))
