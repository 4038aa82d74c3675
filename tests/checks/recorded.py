"""Recording a check as class grading's sandbox does, for the tests that replay it in the judge.

record_check calls a grader once in record mode and reads its record back through the record
file (engine/record_file.py: torch.load with weights_only), as class grading does.
"""
from course_lib.checks.engine import GradingError
from course_lib.checks.engine.record import recording
from course_lib.checks.engine.record_file import read_record

SEED_OFFSET = 7919  # any offset but 0: the data the answer's code sees is not the notebook's


def record_check(check, args, kwargs, seed_offset, folder):
    """(in-notebook outcome: "passed" or the verdict, the check's record read back): `check`
    called once."""
    path = folder / f"record-{seed_offset}.pt"
    with recording(seed_offset, path):
        try:
            check(*args, **kwargs)
            in_notebook = "passed"
        except GradingError as error:
            in_notebook = str(error)
    record = read_record(path)
    assert record["seed_offset"] == seed_offset
    assert len(record["checks"]) == 1, f"one check call made {len(record['checks'])} records"
    return in_notebook, record["checks"][0]


def replayed_wrong_answers(graders: dict, wrong_answers: dict, slow: set) -> dict:
    """{lesson: (check, wrong answer)}: the one wrong answer per lesson that test_checks.py also
    replays in the judge, the first fast one of the lesson's first grader that has one."""
    chosen = {}
    for lesson, checks in sorted(graders.items()):
        found = next(((check, wrong) for check in checks if check not in slow
                      for wrong in wrong_answers.get(check, []) if not wrong.slow), None)
        if found:
            chosen[lesson] = found
    return chosen
