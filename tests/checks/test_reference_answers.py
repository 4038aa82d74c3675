"""The library's own versions of lesson 05's, 07's and 13's exercises pass their graders, as
functions of their own (the library's functions themselves are refused as answers): the notebooks
use them after the exercise (course_lib.topics.accumulation, course_lib.training.checkpoint,
course_lib.topics.debugging)."""
from course_lib.checks import lesson05, lesson07
from course_lib.checks.engine import passed_line
from course_lib.topics.accumulation import accumulate_with_no_sync
from course_lib.training.checkpoint import write_atomically


def test_write_atomically_is_right_but_is_not_an_answer(capsys):
    # the library's save, as a function of its own (another code object): right, so it passes
    import types

    import pytest

    from answers.lesson07 import reference_atomic_save  # the right save ex. 2's wrong loads use
    from course_lib.checks.engine import GradingError

    copy = types.FunctionType(write_atomically.__code__.replace(co_name="my_save"),
                              write_atomically.__globals__)
    lesson07.check_atomic_save(copy)
    assert capsys.readouterr().out.splitlines() == [passed_line("atomic save")]
    # exercise 1 handed to the library's own function, under any name, is refused
    for answer in (write_atomically, reference_atomic_save):
        with pytest.raises(GradingError, match="write_atomically"):
            lesson07.check_atomic_save(answer)


def test_accumulate_with_no_sync_trains_right_but_is_not_an_answer(capsys):
    # the library's loop, as a function of its own (another code object): right, so it passes
    import types

    import pytest

    from course_lib.checks.engine import GradingError

    from course_lib.topics.accumulation import _accumulate

    loop = types.FunctionType(_accumulate.__code__.replace(co_name="my_loop"), _accumulate.__globals__)

    def copy(ddp_model, optimizer, micro_batches, grad_accum_steps):
        return loop(ddp_model, optimizer, micro_batches, grad_accum_steps,
                    is_last=lambda micro_step: (micro_step + 1) % grad_accum_steps == 0)

    lesson05.check_train_with_accumulation(copy)
    assert capsys.readouterr().out.splitlines() == [passed_line("accumulation with no_sync")]
    # a learner who hands the exercise to the library's own function, under any name, does not
    with pytest.raises(GradingError, match="accumulate_with_no_sync"):
        lesson05.check_train_with_accumulation(lambda *args: accumulate_with_no_sync(*args))


def test_lesson13s_reference_fixes_pass_their_graders(capsys):
    # course_lib.topics.debugging holds each broken run (*_broken, a wrong answer of its grader)
    # next to its fix; the fix itself is refused (the notebook imports debugging: the exercise
    # is to fix the bug), so each runs as a function of its own (another code object)
    import types

    from answers.lesson13 import WRONG_ANSWERS
    from course_lib.checks import lesson13
    from course_lib.topics import debugging

    checks = [lesson13.check_end_of_epoch, lesson13.check_load_data, lesson13.check_step_and_loss,
              lesson13.check_hand_ddp_step, lesson13.check_add_noise, lesson13.check_make_loader,
              lesson13.check_wrap_for_ddp]
    for check in checks:
        fix = getattr(debugging, check.__name__.removeprefix("check_"))
        broken = getattr(debugging, fix.__name__ + "_broken")
        assert broken in [wrong.args[0] for wrong in WRONG_ANSWERS[check]]
        check(types.FunctionType(fix.__code__.replace(co_name=f"my_{fix.__name__}"),
                                 fix.__globals__, argdefs=fix.__defaults__))
    assert capsys.readouterr().out.splitlines() == [passed_line(check.exercise) for check in checks]
