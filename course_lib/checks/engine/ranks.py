"""Launching a learner's function for a grader: quietly, with a timeout, with failures explained.

A stub's NotImplementedError on any rank comes back as NotImplementedError (which @grader turns
into the usual advice); a hang or a crash becomes a GradingError saying where and what.
"""
import os
import warnings

from . import GradingError
from .boundary import crossing

_CHECKS = os.path.join(os.sep + "course_lib", "checks", "")  # a grader's frame, wherever installed

LAUNCH_TIMEOUT_S = 60


def run_on_ranks(fn, *args, nprocs: int = 2, what: str, hang_hint: str,
                 crash_hint: str = "the error is raised in your function: fix it, run its cell again, "
                                   "then the check",
                 timeout: float = LAUNCH_TIMEOUT_S, learner: bool = True, **kwargs):
    """fn(*args, **kwargs) on `nprocs` gloo ranks, with nothing printed; [result of each rank].

    `crash_hint` may be a function of the root cause (a RankFailure) that returns the hint.
    A launch that runs learner code (`learner`, the default) is a crossing (boundary.py): what each
    rank returns must be plain data. One that runs only the course's code (a reference) passes
    learner=False and runs wherever the grader runs.
    """
    if learner:
        return crossing(f"run_on_ranks: {what}", lambda: _run_on_ranks(
            fn, *args, nprocs=nprocs, what=what, hang_hint=hang_hint, crash_hint=crash_hint,
            timeout=timeout, **kwargs))
    return _run_on_ranks(fn, *args, nprocs=nprocs, what=what, hang_hint=hang_hint,
                         crash_hint=crash_hint, timeout=timeout, **kwargs)


def _run_on_ranks(fn, *args, nprocs, what, hang_hint, crash_hint, timeout, **kwargs):
    from ...runtime.shared.errors import DistributedRunError
    from ...runtime.launcher.launch import launch

    try:
        with warnings.catch_warnings():  # e.g. "2 ranks on 1 CPU core" must not reach the check cell
            warnings.simplefilter("ignore")
            return launch(fn, *args, nprocs=nprocs, backend="gloo", timeout=timeout, output="none",
                          **kwargs)
    except DistributedRunError as error:
        if error.timed_out:
            waits = "; ".join(f"rank {f.rank} waits in {f.waiting_in or 'your code'}"
                              for f in sorted(error.failures.values(), key=lambda f: f.rank))
            diagnosis = error.diagnosis.splitlines()[0] if error.diagnosis else ""
            raise GradingError(what, f"every rank to finish within {timeout:g} s",
                               f"the ranks hung: {diagnosis or waits}", hang_hint,
                               f"where each rank waited: {waits}" if diagnosis else "") from None
        cause = error.root_cause
        if cause.summary.startswith("NotImplementedError"):
            raise NotImplementedError(cause.summary.partition(": ")[2]) from None
        hint = crash_hint(cause) if callable(crash_hint) else crash_hint
        got, details = failure_verdict(error)
        raise GradingError(what, f"your function to run on {nprocs} ranks", got, hint,
                           details) from None


def failure_verdict(error) -> tuple:
    """(got, details) of a failed run, as a learner reads it: the launcher's diagnosis (or the
    failed rank's own line), then that rank's traceback without the grader's frames; gloo's raw
    words for a lost connection come last, since they name no cause."""
    cause = error.root_cause
    own = cause.headline() if not cause.lost_a_peer else f"rank {cause.rank} lost its connection to a peer"
    got = error.diagnosis or own
    details = []
    if cause.traceback:
        details += [f"rank {cause.rank}'s traceback (the grader's frames left out):",
                    without_grader_frames(cause.traceback)]
    said = [f"rank {f.rank}: {f.summary}" for f in sorted(error.failures.values(), key=lambda f: f.rank)
            if f.gloo_said]
    if said:
        details += ["gloo said:"] + ["  " + line[:300] for line in said]
    return got[:600], "\n".join(details)


def without_grader_frames(traceback_text: str) -> str:
    """A formatted traceback with every frame in course_lib/checks dropped (header, the learner's
    frames, torch's and the exception lines stay)."""
    kept, in_grader = [], False
    for line in traceback_text.rstrip().splitlines():
        if line.startswith("  File "):
            in_grader = _CHECKS in line
        elif not line.startswith("    "):
            in_grader = False
        if not in_grader:
            kept.append(line)
    return "\n".join(kept)
