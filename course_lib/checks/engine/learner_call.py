"""Calling a learner's function for a grader: a crash becomes a verdict that quotes it, and a call
of the course's own answer to the exercise (seen by checks/call_watch.py, whatever name it was
imported under) is refused: the exercise asks the learner to write that part.
"""
import traceback

from . import GradingError, expect
from .boundary import crossing
from .call_watch import calls_of
from .ranks import without_grader_frames


def library_call_hint(name: str, exercise: str) -> str:
    """The hint for an answer that hands the work to the course's own `name`."""
    return (f"your function called the course's own {name}: {exercise} asks you to write that "
            f"part yourself (the check sees which functions run, whatever name they go by)")


def call_learner(function, *args, what: str, hint: str = "", written_by_you=()):
    """The learner's function's result; a crash becomes a GradingError that quotes it, with the
    learner's own frames of its traceback (never the grader's), and a call of the course's
    `written_by_you` (a tuple: the exercise's own answer, or its pieces) a GradingError too."""

    def run():
        try:
            with calls_of(*written_by_you) as called:
                result = function(*args)
        except NotImplementedError:
            raise  # the @grader decorator turns the stub into advice
        except Exception as error:
            frames = without_grader_frames("".join(traceback.format_exception(error)))
            raise GradingError(what, "a result", f"{type(error).__name__}: {error}"[:300], hint,
                               f"your function's traceback (the grader's frames left out):\n{frames}") from None
        return result, list(called)

    result, called = crossing(f"call_learner: {what}", run)
    if called:
        name = next(f"{watch.__module__}.{watch.__qualname__}" for watch in written_by_you
                    if watch.__qualname__ == called[0])
        expect(False, what, f"your own {called[0]}", f"a call of {name}",
               library_call_hint(name, "this exercise"))
    return result
