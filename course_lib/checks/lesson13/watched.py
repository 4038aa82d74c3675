"""Lesson 13's ranks run the learner's fix with the course's own fixes watched: each exercise is
to find the bug and fix it, and course_lib.topics.debugging holds the fixed functions (the
notebook imports the module), so a call of one of them is seen (call_watch.py) and refused."""
from ...topics import debugging
from ..engine.call_watch import calls_of

COURSE_FIXES = (debugging.end_of_epoch, debugging.load_data, debugging.step_and_loss,
                debugging.hand_ddp_step, debugging.add_noise, debugging.make_loader,
                debugging.wrap_for_ddp)


def watched_on_rank(fn, *args):
    """Inside a rank: fn(*args) and the names of the course's fixes it called, as plain data."""
    with calls_of(*COURSE_FIXES) as called:
        result = fn(*args)
    return {"result": result, "course_fixes": sorted(set(called))}
