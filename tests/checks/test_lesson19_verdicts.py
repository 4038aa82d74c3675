"""Lesson 19's checkpoint grader names whose checkpoint ran in place of the learner's own: torch's
CheckpointFunction and the course's Checkpoint have similar names, and the verdict must not mix
them up (tests/checks/answers/lesson19.py has the answers; test_checks.py checks they are rejected).
"""
import pytest

from answers.lesson19 import CoursesCheckpoint, TorchsCheckpointFunctionInside
from course_lib.checks.engine import GradingError
from course_lib.checks.lesson19 import check_checkpoint

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("answer, named", [(TorchsCheckpointFunctionInside, "torch.utils.checkpoint"),
                                           (CoursesCheckpoint, "the course's Checkpoint")])
def test_the_verdict_names_the_checkpoint_that_ran(answer, named):
    with pytest.raises(GradingError) as verdict:
        check_checkpoint(answer)
    assert f"got:      {named}\n" in str(verdict.value)
