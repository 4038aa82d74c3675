"""The library's own versions of lesson 05's and 07's exercises pass their graders: the notebooks
use them after the exercise (course_lib.topics.accumulation, course_lib.training.checkpoint)."""
from course_lib.checks import lesson05, lesson07, passed_line
from course_lib.topics.accumulation import accumulate_with_no_sync
from course_lib.training.checkpoint import write_atomically


def test_write_atomically_passes_the_atomic_save_grader(capsys):
    lesson07.check_atomic_save(write_atomically)
    lesson07.check_atomic_save(lesson07.reference_atomic_save)
    assert capsys.readouterr().out.splitlines() == [passed_line("atomic save")] * 2


def test_accumulate_with_no_sync_passes_the_accumulation_grader(capsys):
    lesson05.check_train_with_accumulation(accumulate_with_no_sync)
    assert capsys.readouterr().out.splitlines() == [passed_line("accumulation with no_sync")]
