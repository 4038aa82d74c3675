"""A crash during a save, on purpose: `crash_half_way_through_torch_save()` makes torch.save write
half of its bytes and then "die" with `SimulatedCrash`, so lesson 07 can show what survives.

    with crash_half_way_through_torch_save():
        try:
            torch.save(state, path)        # path now holds half a file
        except SimulatedCrash:
            pass
"""
import contextlib
import io
import os

import torch

__all__ = ["SimulatedCrash", "crash_half_way_through_torch_save"]


class SimulatedCrash(BaseException):
    """The process 'dies' here: a BaseException, so `except Exception` cleanup does not catch it."""


@contextlib.contextmanager
def crash_half_way_through_torch_save():
    """While active, torch.save writes half of the real bytes to its file, then the process 'dies'."""
    real_save = torch.save

    def crashing_save(obj, f, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        if isinstance(f, (str, os.PathLike)):
            with open(f, "wb") as file:
                file.write(data[: len(data) // 2])
        else:
            f.write(data[: len(data) // 2])
            f.flush()
        raise SimulatedCrash("the process died half way through torch.save")

    torch.save = crashing_save
    try:
        yield
    finally:
        torch.save = real_save
