"""Lesson 07's learner-side observers: each runs the learner's save or prune in a folder the grader
made, and returns what it saw as plain data (boundary.py), with every path relative to that folder,
so that the grader can judge it where the folder, and the learner's code, are not.

- a save: the file calls it made (fsyncs and renames, in order), whether it called the course's
  own write_atomically, what the folder and the checkpoint hold afterwards;
- a save that crashes (half way through torch.save, at the fsync, at the rename): what the
  checkpoint holds after the crash;
- a prune: whether it called the course's list_checkpoints, the files left.
"""
import contextlib
import os
from pathlib import Path

import torch

from ..engine.call_watch import calls_of
from ..engine.observations import as_plain
from ...topics.crash_safety import SimulatedCrash, crash_half_way_through_torch_save
from ...training.checkpoint import list_checkpoints, write_atomically
from .save_watch import CRASH_POINTS, crash_at, record_file_calls


def _load(path):
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:  # truncated: torch raises RuntimeError, EOFError... by case
        return error


def _shown(loaded) -> str:
    if isinstance(loaded, Exception):
        return f"{type(loaded).__name__}: {str(loaded)[:80]}"
    return repr(loaded)[:100]


def checkpoint_at(path) -> dict:
    """What the file at `path` loads back as: {"state": {"step", "model": {name: tensor}} or None,
    "shown": how to quote it}."""
    loaded = _load(path)
    state = None
    if isinstance(loaded, dict):
        model = loaded.get("model")
        state = {"step": as_plain(loaded.get("step")),
                 "model": {str(name): as_plain(tensor) for name, tensor in model.items()}
                 if isinstance(model, dict) else None}
    return {"state": state, "shown": _shown(loaded)}


def _relative(path, folder) -> str:
    return os.path.relpath(os.path.abspath(os.fspath(path)), folder)


def observed_save(atomic_save, state, path) -> dict:
    """atomic_save(state, path), watched: its fsyncs and renames (paths relative to path's folder;
    the renamed file's folder, resolved, relative to the folder's, and as text), its call of the
    course's write_atomically, the other files left, what path holds."""
    folder = os.path.dirname(os.path.abspath(path))
    with record_file_calls() as calls, calls_of(write_atomically) as library_calls:
        atomic_save(state, path)
    plain_calls = []
    for name, *rest in calls:
        if name == "fsync":
            plain_calls.append((name, *rest))
            continue
        destination, source, size, identity = rest
        source_folder = Path(source).resolve().parent
        plain_calls.append((name, _relative(destination, folder), _relative(source, folder), size,
                            identity, os.path.relpath(source_folder, Path(folder).resolve()),
                            str(source_folder)))
    left = sorted(p.name for p in Path(folder).iterdir() if p.name != Path(path).name)
    return {"library_calls": list(library_calls), "exists": Path(path).exists(), "left": left,
            "calls": plain_calls, "checkpoint": checkpoint_at(path)}


def crashed_save(atomic_save, state, path, where) -> dict:
    """atomic_save(state, path) with the process made to die `where` (half way through torch.save,
    or one of save_watch.CRASH_POINTS): what path holds after the crash."""
    crashing = (crash_half_way_through_torch_save() if where == "half way" else
                crash_at(*dict(CRASH_POINTS)[where]))
    with crashing:
        with contextlib.suppress(SimulatedCrash):
            atomic_save(state, path)
    return checkpoint_at(path)


def saved(atomic_save, state, path) -> dict:
    """atomic_save(state, path), unwatched: what path holds after it."""
    atomic_save(state, path)
    return checkpoint_at(path)


def pruned(prune_checkpoints, directory, keep_last) -> dict:
    """prune_checkpoints(directory, keep_last): its call of list_checkpoints, the files left."""
    with calls_of(list_checkpoints) as library_calls:
        prune_checkpoints(Path(directory), keep_last)
    return {"library_calls": list(library_calls),
            "left": sorted(path.name for path in Path(directory).iterdir())}
