"""Which of the library's functions a learner's code called: a grader runs the learner's function
inside `calls_of(...)` to see that it did the job itself rather than call the library's answer.

Calls are recognised by their code object, so an alias, a re-export or an import inside the
learner's function is seen as well as the name the lesson imported.
"""
import contextlib
import sys


@contextlib.contextmanager
def calls_of(*functions):
    """Yield a list that fills with the __qualname__ of each of `functions` called in the block."""
    names = {function.__code__: function.__qualname__ for function in functions}
    called = []
    previous = sys.getprofile()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in names:
            called.append(names[frame.f_code])
        if previous is not None:
            previous(frame, event, arg)

    sys.setprofile(profile)
    try:
        yield called
    finally:
        sys.setprofile(previous)
