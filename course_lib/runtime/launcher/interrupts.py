"""The stop button, held back while the launcher starts, watches or stops ranks, then honoured.

Python raises KeyboardInterrupt at whatever line runs when SIGINT comes: inside `os.fork`'s
after-fork hooks it is discarded ("Exception ignored in: <function _releaseLock>"), and between a
fork and the line that records the child it leaves a rank that nobody stops. Inside
`interrupts_held()` SIGINT only sets a flag, which the launcher polls where stopping is safe; one
it did not act on is delivered again when the block ends, so it is never lost.
"""
import signal
import threading


class interrupts_held:
    """``with interrupts_held() as interrupted:``: SIGINT sets a flag that ``interrupted()`` reads.

    Code inside raises KeyboardInterrupt itself where it can stop cleanly. At the end, a SIGINT
    that came and raised nothing is sent again, to the handler that was there before (Python's:
    a KeyboardInterrupt at that point). Blocks nest: an inner block hands its SIGINT to the outer
    one. Outside the main thread, where Python never runs signal handlers, the flag stays unset.
    """

    def __init__(self):
        self._flag = threading.Event()
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not None:  # None: a handler set outside Python, which we leave alone
                self._previous = previous
                # a handler that only sets a flag never raises: safe inside at-fork hooks too
                signal.signal(signal.SIGINT, lambda signum, frame: self._flag.set())
        return self._flag.is_set

    def __exit__(self, exc_type, exc, traceback):
        if self._previous is None:
            return False
        signal.signal(signal.SIGINT, self._previous)
        self._previous = None
        honoured = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        if self._flag.is_set() and not honoured:
            signal.raise_signal(signal.SIGINT)  # the previous handler runs before this returns
        return False
