"""Verdicts: what a grader says when an answer is not right yet, and the one line when it is.

A grader asserts through the expect_* helpers (each raises GradingError) and prints one fixed line.
"""
import contextlib
import functools
import numbers

__all__ = ["GradingError", "FAILED_MARK", "grader", "passed", "passed_line", "expect", "expect_equal",
           "expect_close", "describe"]

FAILED_MARK = "\u2717"  # ✗, the failed twin of the passed line's ✓
STUB_HINT = "replace the `raise NotImplementedError(...)` line in the exercise cell with your code"


class GradingError(AssertionError):
    """An exercise's answer is not right yet: says what was expected, what came back, and a hint.

    `details` is what the learner needs below the verdict, e.g. a rank's own traceback. In a
    notebook the error shows as this verdict alone: the grader's frames say nothing to a learner.
    """

    def __init__(self, what: str, expected: str, got: str, hint: str = "", details: str = ""):
        self.what, self.expected, self.got, self.hint = what, expected, got, hint
        self.details = details.rstrip()
        lines = [f"{what} is not right yet.", f"  expected: {expected}", f"  got:      {got}"]
        if hint:
            lines.append(f"  hint:     {hint}")
        if self.details:
            lines += [""] + self.details.splitlines()
        super().__init__("\n".join(lines))

    def _render_traceback_(self):
        """IPython's rendering of this error (JupyterLab, nbclient, nbval): the verdict, no frames."""
        first, *rest = str(self).splitlines()
        exercise = getattr(self, "exercise", self.what)
        head = first if exercise == self.what else f"{exercise}: {first}"
        return [f"{FAILED_MARK} {head}", *rest]


def passed_line(exercise: str) -> str:
    """The one fixed line a check cell stores as its expected output."""
    return f"✓ {exercise}: passed"


def passed(exercise: str) -> None:
    print(passed_line(exercise))


def grader(exercise: str):
    """Make a function the grader of `exercise`: it prints `passed` when no expectation fails."""

    def decorate(check):
        @functools.wraps(check)
        def run_check(*args, **kwargs):
            from .boundary import current_mode  # class grading records or replays (record.py)

            mode = current_mode()
            with mode.check(run_check, args, kwargs) if mode else contextlib.nullcontext():
                try:
                    check(*args, **kwargs)
                except NotImplementedError as error:
                    raise GradingError(exercise, "your code to run",
                                       f"NotImplementedError({error})", STUB_HINT) from None
                except GradingError as error:
                    error.exercise = exercise  # the verdict's first line names the exercise
                    raise
            if not getattr(mode, "replays", False):  # the judge prints nothing: it returns
                passed(exercise)

        run_check.exercise = exercise
        return run_check

    return decorate


def expect(condition: bool, what: str, expected: str, got: str, hint: str = "") -> None:
    """Raise GradingError unless `condition`; for expectations the other helpers cannot say."""
    if not condition:
        raise GradingError(what, expected, got, hint)


def expect_whole_number(got, what: str, hint: str) -> None:
    """Expect a whole number of any integer type (int, NumPy's integers), not a bool or a float."""
    expect(isinstance(got, numbers.Integral) and not isinstance(got, bool), what,
           "a whole number (an int)", f"{got!r} ({type(got).__name__})", hint)


def expect_value_error(call, what: str, expected: str, hint: str) -> None:
    """Expect `call()` to raise ValueError: the exercise's input has no valid answer."""
    try:
        got = call()
    except ValueError:
        return
    raise GradingError(what, f"a ValueError: {expected}", repr(got)[:120], hint)


def describe(value, limit: int = 120) -> str:
    """A short description of a value for a grading message: tensors show shape and dtype."""
    if _is_tensor(value):
        first = value.detach().flatten()[:8].tolist()
        more = ", ..." if value.numel() > len(first) else ""
        text = f"tensor of shape {tuple(value.shape)}, dtype {value.dtype}: {first}{more}"
    else:
        text = f"{value!r} ({type(value).__name__})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect_equal(actual, expected, what: str, hint: str = "") -> None:
    """Expect `actual == expected`; tensors must match in shape, dtype and every element."""
    if _is_tensor(expected):
        same = (_is_tensor(actual) and actual.shape == expected.shape
                and actual.dtype == expected.dtype and bool((actual == expected).all()))
    else:
        try:
            same = bool(actual == expected)
        except Exception:  # e.g. comparing a tensor with a list: not equal, whatever the reason
            same = False
    expect(same, what, describe(expected), describe(actual), hint)


def expect_close(actual, expected, what: str, hint: str = "", rtol: float = 1e-5,
                 atol: float = 1e-8) -> None:
    """Expect numbers, sequences or tensors to match `expected` within `rtol` and `atol`."""
    import torch  # only graders that compare numbers pay for importing torch

    expected_tensor = torch.as_tensor(expected, dtype=torch.float64).cpu()
    try:
        actual_tensor = torch.as_tensor(actual, dtype=torch.float64).cpu()
    except (TypeError, ValueError, RuntimeError):
        raise GradingError(what, describe(expected), describe(actual),
                           hint or "return numbers (or a tensor), not this type") from None
    if actual_tensor.shape != expected_tensor.shape:
        raise GradingError(what, f"shape {tuple(expected_tensor.shape)}",
                           f"shape {tuple(actual_tensor.shape)}: {describe(actual)}", hint)
    close = torch.allclose(actual_tensor, expected_tensor, rtol=rtol, atol=atol)
    expect(close, what, describe(expected), describe(actual), hint)


def _is_tensor(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "shape")
