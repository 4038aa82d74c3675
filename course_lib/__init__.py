"""course_lib: the small library behind the multi-GPU training course.

The notebooks call it to launch ranks, train with single/DP/DDP strategies and grade exercises.
Its layers, each importing only the ones listed before it:

    runtime/    start ranks and talk to them: launch, spawn, sessions and %%distributed, doctor
    training/   one training loop (single, DP, DDP), its strategies, AMP, checkpoints, the CLI
    topics/     what the lessons demonstrate: collectives, timing, scaling, pipeline, memory, ...
    checks/     the graders behind the lessons' check cells
    authoring/  build lessons from solutions, grade them, run the solutions
    examples/   scripts the lessons run under torchrun

The names learners type every day are importable from here (lazily, so `import course_lib`
stays fast): `launch`, `spawn`, `DistributedSession`, `DistributedRunError`, `Trainer`, `TrainConfig`,
`make_dataset`, `make_model`, `device_for_rank`, `gpu_count`, `current_session`. Nothing else: the
rest lives in the layer that owns it.
"""
import importlib

__version__ = "0.1.0"

# name -> the module that defines it
_EXPORTS = {
    "launch": "course_lib.runtime.launcher.launch",
    "spawn": "course_lib.runtime.launcher.spawn",
    "DistributedRunError": "course_lib.runtime.shared.errors",
    "DistributedSession": "course_lib.runtime.launcher.session",
    "current_session": "course_lib.runtime.launcher.magic",
    "device_for_rank": "course_lib.runtime.shared.env",
    "gpu_count": "course_lib.runtime.shared.env",
    "Trainer": "course_lib.training.trainers",
    "TrainConfig": "course_lib.training.trainers",
    "make_dataset": "course_lib.training.data",
    "make_model": "course_lib.training.models",
}
__all__ = [*_EXPORTS, "load_ipython_extension"]


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # the next lookup is a plain attribute
        return value
    raise AttributeError(f"module 'course_lib' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_EXPORTS])


def load_ipython_extension(ipython):
    """`%load_ext course_lib` registers the `%%distributed` cell magic."""
    from .runtime.launcher.magic import register

    register(ipython)
