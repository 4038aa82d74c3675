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


def memorized_shares(timeline, rank, step):
    """The notebook's hand-made shares, typed in: right only on the timeline the notebook shows."""
    return {(0, 3): 0.6, (1, 3): 0.2, (0, 4): 2.5 / 3.5, (1, 4): 1.4 / 2.9}.get((rank, step))


def test_the_hand_made_steps_are_drawn_at_grading_time():
    """At a grading offset the hand-made times are warped (same shape, other shares): typed-in
    shares fail there, and every wrong answer still gets its own hint."""
    from course_lib.checks.engine import boundary

    notebook = lesson04._hand_made_timeline()
    assert [overlap_fraction(notebook, r, s) for r in (0, 1) for s in (3, 4)] == pytest.approx(
        [memorized_shares(notebook, r, s) for r in (0, 1) for s in (3, 4)])
    offset = boundary._seed_offset.set(7919)
    try:
        with pytest.raises(GradingError, match="on a hand-made timeline"):
            lesson04.check_hidden_share(memorized_shares)
        test_the_hidden_share_grader_names_each_mistake()
    finally:
        boundary._seed_offset.reset(offset)
