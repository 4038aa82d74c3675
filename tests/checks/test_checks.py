"""The grading helpers, and every lesson grader's duty: reject three plausible wrong answers.

Lesson graders are found in course_lib/checks/lessonNN (a module or a package); the wrong answers
that drive these tests are in tests/checks/answers/lessonNN.py, beside the correct alternatives
that tests/checks/test_checks_alternatives.py runs.

One wrong answer per lesson is also recorded as class grading's sandbox records it and replayed in
the judge (engine/record.py), where no learner code runs: it must fail there with the grader's
verdict too (the correct answers' replay is in test_checks_alternatives.py).
"""
import pytest
import torch

from answers import WrongAnswer, all_graders, answer_modules, case_id, wrong_answer
from course_lib.checks.engine import GradingError, describe, expect, expect_close, expect_equal, grader
from course_lib.checks.engine.record import replay_check
from recorded import SEED_OFFSET, record_check, replayed_wrong_answers

MIN_WRONG_ANSWERS = 3


def declared_wrong_answers() -> dict:
    """grader -> its wrong answers, from every tests/checks/answers/lessonNN.py."""
    declared = {}
    for module in answer_modules():
        for check, wrongs in getattr(module, "WRONG_ANSWERS", {}).items():
            declared.setdefault(check, []).extend(wrongs)
    return declared


def slow_checks() -> set:
    return {check for module in answer_modules() for check in getattr(module, "SLOW_CHECKS", ())}


def missing_wrong_answers(graders, declared) -> list:
    """'check_x has 1 wrong answers' for each grader short of MIN_WRONG_ANSWERS."""
    return [f"{check.__module__}.{check.__name__} has {len(declared.get(check, []))} wrong answers"
            for check in graders if len(declared.get(check, [])) < MIN_WRONG_ANSWERS]


def accepted_wrong_answer(check, wrong: WrongAnswer, capsys) -> str:
    """'' when `check` rejects `wrong` with a GradingError and prints nothing; else what went wrong."""
    try:
        check(*wrong.args, **wrong.kwargs)
    except GradingError:
        printed = capsys.readouterr().out
        return f"printed {printed!r} while rejecting it" if printed else ""
    except Exception as error:  # the learner would see a crash, not a helpful message
        return f"raised {type(error).__name__}: {error} instead of a GradingError"
    return "accepted it"


GRADERS = all_graders()
WRONG_ANSWERS = declared_wrong_answers()
SLOW = slow_checks()
WRONG_ANSWER_CASES = [
    pytest.param(check, wrong, id=case_id(check, wrong.description),
                 marks=[pytest.mark.slow] if wrong.slow or check in SLOW else [])
    for check, wrongs in WRONG_ANSWERS.items() for wrong in wrongs
]


@pytest.mark.parametrize("lesson", sorted(GRADERS))
def test_every_grader_has_three_wrong_answers(lesson):
    missing = missing_wrong_answers(GRADERS[lesson], WRONG_ANSWERS)
    assert not missing, (f"declare at least three plausible wrong answers per grader in "
                         f"tests/checks/answers/{lesson}.py's WRONG_ANSWERS: " + "; ".join(missing))


REPLAYED = replayed_wrong_answers(GRADERS, WRONG_ANSWERS, SLOW)


@pytest.mark.parametrize("check, wrong", WRONG_ANSWER_CASES)
def test_grader_rejects_wrong_answer(check, wrong, capsys, tmp_path):
    if (check, wrong) not in REPLAYED.values():
        problem = accepted_wrong_answer(check, wrong, capsys)
        assert not problem, f"{check.__name__} {problem} (wrong answer: {wrong.description})"
        return
    in_notebook, entry = record_check(check, wrong.args, wrong.kwargs, SEED_OFFSET, tmp_path)
    assert in_notebook != "passed", f"{check.__name__} accepted it (wrong answer: {wrong.description})"
    assert capsys.readouterr().out == "", "the grader printed while rejecting it"
    verdict = replay_check(check, entry, SEED_OFFSET)
    assert not verdict.passed and not verdict.grader_fault, f"replayed in the judge: {verdict.message}"
    assert verdict.message.startswith("\u2717"), f"not the grader's verdict: {verdict.message}"


def test_every_lesson_has_a_replayed_wrong_answer():
    lessons = {module.__name__.rsplit(".", 1)[-1] for module in answer_modules()}
    assert lessons <= set(REPLAYED) | {"lesson14"}, sorted(lessons - set(REPLAYED))  # 14 runs torchrun: slow


def test_every_wrong_answer_is_for_a_real_grader():
    graders = {check for checks in GRADERS.values() for check in checks}
    strays = [case_id(check, "") for check in WRONG_ANSWERS if check not in graders]
    assert not strays, f"wrong answers for functions that are no lesson's grader: {strays}"


# The machinery above, on a made-up grader.

def double_grader():
    @grader("double")
    def check_double(double):
        expect_equal(double(3), 6, "double(3)", hint="multiply by two")

    check_double.__module__ = "course_lib.checks.lesson99"
    return check_double


def test_machinery_finds_a_grader_short_of_wrong_answers():
    check = double_grader()
    assert missing_wrong_answers([check], {check: [wrong_answer("adds one", lambda x: x + 1)]}) == [
        "course_lib.checks.lesson99.check_double has 1 wrong answers"]
    full = [wrong_answer("adds one", lambda x: x + 1), wrong_answer("squares", lambda x: x * x),
            wrong_answer("adds two", lambda x: x + 2)]
    assert missing_wrong_answers([check], {check: full}) == []


def test_machinery_flags_accepted_and_crashing_wrong_answers(capsys):
    check = double_grader()
    assert accepted_wrong_answer(check, wrong_answer("adds one", lambda x: x + 1), capsys) == ""
    assert accepted_wrong_answer(check, wrong_answer("right", lambda x: 2 * x), capsys) == \
        "accepted it"
    crashing = accepted_wrong_answer(check, wrong_answer("crashes", lambda x: x / "a"), capsys)
    assert crashing.startswith("raised TypeError")


def test_graders_are_found_in_lesson_packages_too():
    found = {check.__name__ for check in GRADERS["lesson04"]}
    assert {"check_indices_for_rank", "check_best_bucket_cap"} <= found, found


# The grading helpers.

def test_grading_error_says_expected_got_and_hint():
    error = GradingError("the mean", "2.0", "4.0", "divide by world_size")
    assert isinstance(error, AssertionError)
    assert str(error) == ("the mean is not right yet.\n  expected: 2.0\n  got:      4.0\n"
                          "  hint:     divide by world_size")
    assert "hint" not in str(GradingError("the mean", "2.0", "4.0"))


def test_grader_prints_one_fixed_line_on_success(capsys):
    @grader("double")
    def check_double(double):
        expect_equal(double(3), 6, "double(3)")

    assert check_double(lambda x: 2 * x) is None
    assert capsys.readouterr().out == "✓ double: passed\n"
    assert check_double.exercise == "double" and check_double.__name__ == "check_double"


def test_grader_turns_the_stub_into_advice_and_prints_nothing(capsys):
    @grader("double")
    def check_double(double):
        expect_equal(double(3), 6, "double(3)")

    def stub(x):
        raise NotImplementedError("Exercise: write this part")

    with pytest.raises(GradingError, match="replace the `raise NotImplementedError"):
        check_double(stub)
    with pytest.raises(GradingError, match="expected: 6 \\(int\\)\n  got:      7 \\(int\\)"):
        check_double(lambda x: 7)
    assert capsys.readouterr().out == ""


def test_expect_close_accepts_numbers_lists_and_tensors_within_tolerance():
    expect_close(0.1 + 0.2, 0.3, "sum")
    expect_close([1.0, 2.0], torch.tensor([1.0, 2.0 + 1e-7]), "list")
    expect_close(torch.tensor([[1.0]]), [[1.0]], "tensor")
    expect_close(1.05, 1.0, "loose", rtol=0.1)


@pytest.mark.parametrize("actual, expected_in_message", [
    (None, "got:      None (NoneType)"),
    (torch.ones(3), "got:      shape (3,)"),
    ([1.0, 2.5], "got:      [1.0, 2.5] (list)"),
    ("1.0, 2.0", "got:      '1.0, 2.0' (str)"),
])
def test_expect_close_rejects_with_a_helpful_message(actual, expected_in_message):
    with pytest.raises(GradingError) as caught:
        expect_close(actual, [1.0, 2.0], "the gradients", hint="average over ranks")
    assert expected_in_message in str(caught.value)
    assert "hint:     average over ranks" in str(caught.value)


def test_expect_equal_compares_tensor_shape_dtype_and_values():
    expect_equal(torch.arange(3), torch.arange(3), "ranks")
    for wrong in (torch.arange(3).float(), torch.arange(4), torch.tensor([0, 1, 3]), [0, 1, 2]):
        with pytest.raises(GradingError, match="ranks is not right yet"):
            expect_equal(wrong, torch.arange(3), "ranks")


def test_expect_raises_only_when_the_condition_fails():
    expect(True, "world_size", "2", "2")
    with pytest.raises(GradingError, match="expected: 2"):
        expect(False, "world_size", "2", "1", "launch with nprocs=2")


def test_describe_keeps_large_values_short():
    assert describe(torch.zeros(1000)).endswith(", ...")
    assert "shape (1000,)" in describe(torch.zeros(1000))
    assert len(describe(list(range(1000)))) == 120
