"""course_lib: the small library behind the multi-GPU training course.

The notebooks call it to launch ranks, train with single/DP/DDP strategies and grade exercises.
"""
from .launch import DistributedRunError, launch

__all__ = ["launch", "DistributedRunError", "DistributedSession", "load_ipython_extension"]
__version__ = "0.1.0"


def __getattr__(name):
    # The session pulls in IPython-facing code; import it only when asked for.
    if name == "DistributedSession":
        from .session import DistributedSession

        return DistributedSession
    raise AttributeError(f"module 'course_lib' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """`%load_ext course_lib` registers the `%%distributed` cell magic."""
    from .magic import register

    register(ipython)
