"""Class grading's verdict, decided where no learner code runs (engine/record.py): a wrong answer,
recorded beside its code and replayed in the judge, fails there with the grader's verdict.

The correct answers' side runs in tests/checks/test_checks_alternatives.py: the first alternative
of each grader is recorded on grading-time data and replayed there, so that no grader runs twice.
Run one lesson:  pytest tests/checks/test_replay.py tests/checks/test_checks_alternatives.py -k lesson07
"""
import pytest

from answers import all_graders, answer_modules
from course_lib.checks.engine.record import replay_check
from recorded import SEED_OFFSET, record_check
from test_checks_alternatives import SLOW
from test_checks import WRONG_ANSWERS

pytestmark = pytest.mark.timeout(300)


def wrong_cases():
    """One wrong answer per lesson: the first fast one of its first grader that has one."""
    cases = []
    for lesson, graders in sorted(all_graders().items()):
        found = next(((check, wrong) for check in graders if check not in SLOW
                      for wrong in WRONG_ANSWERS.get(check, []) if not wrong.slow), None)
        if found:
            check, wrong = found
            cases.append(pytest.param(check, wrong, id=f"{lesson}.{check.__name__}:{wrong.description}"))
    return cases


@pytest.mark.parametrize("check, wrong", wrong_cases())
def test_a_wrong_answer_fails_in_replay(check, wrong, tmp_path):
    in_notebook, entry = record_check(check, wrong.args, wrong.kwargs, SEED_OFFSET, tmp_path)
    assert in_notebook != "passed", "the wrong answer passed in the notebook"
    verdict = replay_check(check, entry, SEED_OFFSET)
    assert not verdict.passed and not verdict.grader_fault, verdict.message
    assert verdict.message.startswith("✗"), f"not the grader's verdict: {verdict.message}"


def test_every_lesson_has_a_replayed_wrong_answer():
    lessons = {module.__name__.rsplit(".", 1)[-1] for module in answer_modules()}
    covered = {case.id.split(".")[0] for case in wrong_cases()}
    assert lessons <= covered | {"lesson14"}, sorted(lessons - covered)  # 14 runs torchrun: slow
