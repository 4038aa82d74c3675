"""Lesson 05's grader sees no_sync at work: which micro-batch's backward all-reduced (the count at
every forward), one forward per micro-batch, and the loop written by the learner, not the
course's accumulate_with_no_sync under another name."""
import pytest

from answers.lesson05 import WRONG_ANSWERS
from course_lib.checks import lesson05
from course_lib.checks.engine import GradingError


def wrong(description):
    [answer] = [w for w in WRONG_ANSWERS[lesson05.check_train_with_accumulation]
                if w.description == description]
    return answer.args[0]


@pytest.mark.parametrize("description, what", [
    ("syncs on the first micro-batch of each step too",
     "DDP's all-reduces after micro-batch 1 of 4 in optimizer step 0 on rank 0"),
    ("no_sync on every micro-batch: never syncs",
     "DDP's all-reduces after micro-batch 4 of 4 in optimizer step 0 on rank 0"),
    ("one forward of the whole group per step", "the model's forwards on rank 0"),
    ("calls the course's accumulate_with_no_sync", "train_with_accumulation on 2 ranks"),
])
def test_the_grader_names_the_micro_batch_or_the_call(description, what):
    with pytest.raises(GradingError) as caught:
        lesson05.check_train_with_accumulation(wrong(description))
    assert caught.value.what.startswith(what)
    assert "no_sync()" not in caught.value.hint  # the hint says what happened, not what to type


def test_a_forward_outside_no_sync_is_told_apart_from_the_off_by_one():
    # both all-reduce after micro-batch 1 of 4; only one of them put its backward inside no_sync
    hints = {}
    for description in ("no_sync around the backward only",
                        "syncs and steps on the first micro-batch instead of the last"):
        with pytest.raises(GradingError) as caught:
            lesson05.check_train_with_accumulation(wrong(description))
        assert caught.value.what.startswith("DDP's all-reduces after micro-batch 1 of 4")
        hints[description] = caught.value.hint
    assert "its forward ran outside it" in hints["no_sync around the backward only"]
    assert "forward" not in hints["syncs and steps on the first micro-batch instead of the last"]


def test_losses_must_be_floats_and_a_kept_graph_is_named():
    with pytest.raises(GradingError) as caught:
        lesson05.check_train_with_accumulation(wrong("returns the summed loss tensors, their graphs kept"))
    assert caught.value.expected == "a float per optimizer step"
    assert "autograd graph" in caught.value.hint
