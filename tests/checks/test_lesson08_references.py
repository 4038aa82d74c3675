"""Lesson 08's reference fixes (course_lib.topics.pitfalls, which the notebook runs after each
exercise) pass their graders as functions of their own (the fixes themselves are wrong answers:
the exercise is to write them); each broken snippet, declared a wrong answer, does not."""
import types

import pytest

from answers.lesson08 import WRONG_ANSWERS
from course_lib.checks import lesson08
from course_lib.checks.engine import passed_line
from course_lib.topics import pitfalls

pytestmark = pytest.mark.timeout(300)

REFERENCES = [(lesson08.check_log_mean_loss, pitfalls.log_mean_loss),
              (lesson08.check_wrap_model, pitfalls.wrap_model),
              (lesson08.check_indices_per_epoch, pitfalls.indices_per_epoch),
              (lesson08.check_save_checkpoint, pitfalls.save_checkpoint)]


@pytest.mark.parametrize("check, reference", REFERENCES, ids=lambda value: value.__name__)
def test_reference_fix_passes(check, reference, capsys):
    # as a function of its own (another code object): the course's fix itself is refused
    copy = types.FunctionType(reference.__code__.replace(co_name=f"my_{reference.__name__}"),
                              reference.__globals__, argdefs=reference.__defaults__)
    check(copy)
    assert capsys.readouterr().out == passed_line(check.exercise) + "\n"


@pytest.mark.parametrize("check, reference", REFERENCES, ids=lambda value: value.__name__)
def test_the_broken_snippet_is_a_wrong_answer(check, reference):
    broken = getattr(pitfalls, reference.__name__ + "_broken")
    assert any(broken in wrong.args for wrong in WRONG_ANSWERS[check])
