"""Lesson 02's exercise 3 sees DataParallel's four steps, not only equal gradients: each wrong
answer is rejected at the step it skips, with a hint that names the replica (or the gradient)."""
import pytest

from answers.lesson02 import WRONG_ANSWERS
from course_lib.checks.engine import GradingError
from course_lib.checks.lesson02 import check_data_parallel_gradients

WHERE_EACH_MISTAKE_SHOWS = {
    "one device's backward, no DataParallel at all": "the samples one forward ran on",
    "runs every chunk on the model itself, no replicas": "the module replica 0 ran",
    "runs the replicas one after another in the calling thread": "the thread replica 0 ran in",
    "gathers the outputs in reverse replica order": "the gradient that reached replica 0's output",
    "averages one mean loss per replica": "the gradient that reached replica 0's output",
    "backpropagates replica 0's loss only": "replica 1's output",
    "sums the replicas' gradients a second time": "gradient 0",
}


@pytest.mark.parametrize("description, where", WHERE_EACH_MISTAKE_SHOWS.items())
def test_each_mistake_is_caught_at_the_step_it_skips(description, where):
    [wrong] = [w for w in WRONG_ANSWERS[check_data_parallel_gradients]
               if w.description == description]
    with pytest.raises(GradingError) as caught:
        check_data_parallel_gradients(*wrong.args)
    assert where in caught.value.what


def test_hints_name_the_mistake_not_the_code():
    hints = []
    for wrong in WRONG_ANSWERS[check_data_parallel_gradients]:
        with pytest.raises(GradingError) as caught:
            check_data_parallel_gradients(*wrong.args)
        hints.append(caught.value.hint)
    assert len(set(hints)) == len(hints)
    assert not any("backward()" in hint and "loss" in hint and "gather(" in hint for hint in hints)
    assert any("0.867 times" in hint for hint in hints)  # 5 of 13 samples weighed as 1/3 of 3
