"""The grading engine: what every lesson's graders share, and nothing of any one lesson.

verdicts      GradingError, @grader, the expect_* helpers, the one passed line
ranks         run a learner's function on gloo ranks and read back what each returned
learner_call  call the learner's code, refusing a library call that does the exercise for them
call_watch    record which torch functions an answer called
oracle        what one process computes on the whole batch, to compare ranks against
measured      judge figures the learner measured against a band, a recording, a unit slip
remeasure     measure again on this machine and compare with what the learner recorded
replicas      DataParallel's replicas and their gradients, counted
gradient_sync models with tied and frozen weights, shards, and torch's DDP as a second oracle
boundary      where a grader runs learner code (crossing) and the seeds of the data it feeds it
record        class grading's two modes: record beside the learner's code, replay in the judge
crossing_data what crosses, as plain tagged data; record_file: the record's file, read safely

A lesson imports the engine and the layers below checks/; the engine imports no lesson
(tests/test_layout.py says so).
"""
from .verdicts import *  # noqa: F401,F403 (the verdict API: GradingError, grader, expect, ...)
from .verdicts import STUB_HINT, expect_value_error, expect_whole_number  # noqa: F401
