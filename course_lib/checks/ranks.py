"""Launching a learner's function for a grader: quietly, with a timeout, with failures explained.

A stub's NotImplementedError on any rank comes back as NotImplementedError (which @grader turns
into the usual advice); a hang or a crash becomes a GradingError saying where and what.
"""
import warnings

from . import GradingError

LAUNCH_TIMEOUT_S = 60


def run_on_ranks(fn, *args, nprocs: int = 2, what: str, hang_hint: str,
                 crash_hint: str = "the error is raised in your function: fix it, run its cell again, "
                                   "then the check",
                 timeout: float = LAUNCH_TIMEOUT_S, **kwargs):
    """fn(*args, **kwargs) on `nprocs` gloo ranks, with nothing printed; [result of each rank].

    `crash_hint` may be a function of the root cause (a RankFailure) that returns the hint.
    """
    from ..runtime.shared.errors import DistributedRunError
    from ..runtime.launcher.launch import launch

    try:
        with warnings.catch_warnings():  # e.g. "2 ranks on 1 CPU core" must not reach the check cell
            warnings.simplefilter("ignore")
            return launch(fn, *args, nprocs=nprocs, backend="gloo", timeout=timeout, output="none",
                          **kwargs)
    except DistributedRunError as error:
        if error.timed_out:
            waits = "; ".join(f"rank {f.rank} waits in {f.waiting_in or 'your code'}"
                              for f in sorted(error.failures.values(), key=lambda f: f.rank))
            raise GradingError(what, f"every rank to finish within {timeout:g} s",
                               f"the ranks hung: {waits}", hang_hint) from None
        cause = error.root_cause
        if cause.summary.startswith("NotImplementedError"):
            raise NotImplementedError(cause.summary.partition(": ")[2]) from None
        # chained: the learner sees the rank's own traceback above the grader's message
        hint = crash_hint(cause) if callable(crash_hint) else crash_hint
        raise GradingError(what, f"your function to run on {nprocs} ranks", cause.headline()[:300],
                           hint) from error
