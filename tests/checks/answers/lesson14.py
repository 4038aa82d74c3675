"""Lesson 14's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""


from course_lib.checks import lesson14
from test_capstone import ALTERNATIVE_CONVERSIONS  # scripts that convert lesson 14's file correctly


from . import answer, wrong_answer  # noqa: F401




ALTERNATIVES = {
    lesson14.check_capstone: [answer(name, path) for name, path in ALTERNATIVE_CONVERSIONS.items()],
}
