"""Lesson 04's exercise 4, the share of the all-reduce hidden behind backward: each mistake gets a
hint of its own, and the grader's hand-made timeline holds what it says."""
import pytest

from answers.lesson04 import WRONG_ANSWERS
from course_lib.checks.engine import GradingError
from course_lib.checks.lesson04 import overlap as lesson04  # exercise 4's own module
from course_lib.topics.timeline import overlap_fraction


def test_the_hidden_share_grader_names_each_mistake():
    """Lesson 04's exercise 4: every wrong answer is rejected with a hint of its own."""
    hints = {}
    for wrong in WRONG_ANSWERS[lesson04.check_hidden_share]:
        with pytest.raises(GradingError) as caught:
            lesson04.check_hidden_share(*wrong.args, **wrong.kwargs)
        hints[wrong.description] = caught.value.hint
    assert len(set(hints.values())) == len(hints), hints
    # The hand-made timeline agrees with what it says it holds.
    timeline = lesson04._hand_made_timeline()
    shares = [overlap_fraction(timeline, 0, step) for step in (3, 4, 5)]
    assert shares[:2] == pytest.approx([0.6, 2.5 / 3.5]) and shares[2] is None
    assert overlap_fraction(timeline, 1, 3) == pytest.approx(0.2)
