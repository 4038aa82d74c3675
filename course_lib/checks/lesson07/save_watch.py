"""Watching a checkpoint save, for lesson 07's graders: the file calls it makes (fsync, rename), a
crash at each of them, what the checkpoint's path holds wherever the process could die, and a
writer made slow on purpose, so that a rank that does not wait for it is seen.

Everything here patches `os` and `torch.save` for the duration of a `with` block only.
"""
import contextlib
import hashlib
import io
import os
import time
from pathlib import Path

import torch

from ...topics.crash_safety import SimulatedCrash

RENAMES = ("replace", "rename")


def _identity(stat_result) -> tuple:
    return stat_result.st_dev, stat_result.st_ino


@contextlib.contextmanager
def record_file_calls():
    """Record os.fsync and the renames, in order: ("fsync", bytes on disk, file identity) and
    (rename, destination, source, bytes of source, identity of source)."""
    calls, real = [], {name: getattr(os, name) for name in ("fsync",) + RENAMES}

    def fsync(fd):
        status = os.fstat(fd)
        calls.append(("fsync", status.st_size, _identity(status)))
        return real["fsync"](fd)

    def renamer(name):
        def rename(source, destination, *args, **kwargs):
            try:
                status = os.stat(source)
                size, identity = status.st_size, _identity(status)
            except OSError:
                size, identity = None, None
            calls.append((name, os.fspath(destination), os.fspath(source), size, identity))
            return real[name](source, destination, *args, **kwargs)
        return rename

    os.fsync, os.replace, os.rename = fsync, renamer("replace"), renamer("rename")
    try:
        yield calls
    finally:
        os.fsync, os.replace, os.rename = real["fsync"], real["replace"], real["rename"]


@contextlib.contextmanager
def crash_at(*names):
    """While active, calling os.<name> for any of `names` kills the process before it acts."""
    real = {name: getattr(os, name) for name in names}

    def dies(*args, **kwargs):
        raise SimulatedCrash(f"the process died at os.{names[0]}")

    for name in names:
        setattr(os, name, dies)
    try:
        yield
    finally:
        for name, function in real.items():
            setattr(os, name, function)


CRASH_POINTS = [  # (where the process dies, the os functions that die there)
    ("at the fsync", ("fsync",)),
    ("at the rename", RENAMES),
]


def digest(path):
    """A fingerprint of the file at `path`: (sha256, size), or None when there is none."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest(), os.path.getsize(path)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def watched_save(path, slow_s: float):
    """Watch this process's saves. Each torch.save to a file is counted; with `slow_s` > 0 (the
    writing rank) each save is slowed by `slow_s` half way through its bytes, or, if it never
    calls torch.save, at its rename; and the file at `path` is fingerprinted wherever a crash
    could strike (half way through each torch.save to a file, before each fsync and rename).

    Yields {"saves": count, "seen": [(where, digest)], "written_at": time.time() of the last
    rename onto `path` or the last torch.save to `path`, or None}."""
    real = {"save": torch.save, **{name: getattr(os, name) for name in ("fsync",) + RENAMES}}
    record = {"saves": 0, "seen": [], "written_at": None, "slowed": False}
    target = os.path.abspath(path)

    def look(where):
        if slow_s:
            record["seen"].append((where, digest(path)))

    def slow_down():
        if slow_s and not record["slowed"]:
            record["slowed"] = True
            time.sleep(slow_s)

    def save(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO):  # pickling a tensor (all_gather_object) saves to memory
            return real["save"](obj, f, *args, **kwargs)
        record["saves"] += 1
        buffer = io.BytesIO()
        real["save"](obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        by_name = isinstance(f, (str, os.PathLike))
        with open(f, "wb") if by_name else contextlib.nullcontext(f) as file:
            file.write(data[: len(data) // 2])
            file.flush()
            look("half way through torch.save")
            slow_down()
            file.write(data[len(data) // 2:])
        if by_name and os.path.abspath(f) == target:
            record["written_at"] = time.time()

    def watched_fsync(fd):
        look("at os.fsync")
        return real["fsync"](fd)

    def watched_rename(name):
        def rename(source, destination, *args, **kwargs):
            look(f"at os.{name}")
            slow_down()
            result = real[name](source, destination, *args, **kwargs)
            if os.path.abspath(destination) == target:
                record["written_at"] = time.time()
            return result
        return rename

    torch.save = torch.serialization.save = save
    os.fsync = watched_fsync
    os.replace, os.rename = watched_rename("replace"), watched_rename("rename")
    try:
        yield record
    finally:
        torch.save = torch.serialization.save = real["save"]
        os.fsync, os.replace, os.rename = real["fsync"], real["replace"], real["rename"]
