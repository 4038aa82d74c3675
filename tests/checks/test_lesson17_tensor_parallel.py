"""Lesson 17's reference implementation (topics/from_scratch/tensor_parallel.py, sequence_parallel.py),
which the lesson runs while a learner's classes are unfinished: judged by the graders' own rank
functions and comparisons, in one launch. The wrong and correct answers that test the graders are
in tests/checks/answers/lesson17.py (run by test_checks.py and test_checks_alternatives.py).
"""
import pytest

from course_lib.checks import lesson17
from course_lib.checks.lesson17 import ranks
from course_lib.topics.from_scratch import sequence_parallel, tensor_parallel

pytestmark = pytest.mark.timeout(300)


def test_the_course_layers_pass_the_graders(monkeypatch, capsys):
    monkeypatch.setattr(ranks, "COURSE_TP", ())  # the course's own classes are no library call here
    monkeypatch.setattr(ranks, "COURSE_SP", ())
    monkeypatch.setattr(ranks, "COURSE_CLASSES", ())  # nor are they subclasses of themselves
    lesson17.check_tensor_parallel(tensor_parallel.ColumnParallelLinear, tensor_parallel.RowParallelLinear)
    lesson17.check_sequence_parallel(sequence_parallel.SequenceParallelMLP)
    assert capsys.readouterr().out.count("passed") == 2
