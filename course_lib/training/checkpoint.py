"""Checkpoints that survive crashes: atomic writes by rank 0, safe loading, RNG capture, pruning.

A save writes a temporary file, fsyncs it and renames it, so a crash never leaves a half-written
checkpoint under a real name; loading uses weights_only=True, so only tensors and plain data load.
"""
import os
import random
import re
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

_NAME = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be loaded (truncated, corrupt, or not a checkpoint)."""


def checkpoint_path(directory, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def list_checkpoints(directory) -> list:
    """Checkpoint files in `directory`, oldest first (temporary files are ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name))]
    return [path for _, path in sorted(found)]


def write_atomically(state: dict, path) -> None:
    """torch.save to a temporary file, flush and fsync it, then rename it over `path`."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)  # atomic on POSIX: readers see the old file or the new one
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)


def save_checkpoint(state: dict, directory, step: int, keep_last: int = 2) -> Path:
    """Rank 0 writes step_<step>.pt atomically and keeps the newest `keep_last`; other ranks wait."""
    if keep_last < 1:
        raise ValueError(f"keep_last={keep_last} must be at least 1")
    path = checkpoint_path(directory, step)
    distributed = dist.is_available() and dist.is_initialized()
    if not distributed or dist.get_rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(state, path)
        for old in list_checkpoints(directory)[:-keep_last]:
            old.unlink(missing_ok=True)
    if distributed:
        dist.barrier()  # no rank reads or trains past a checkpoint that is not yet on disk
    return path


def load_checkpoint(path, map_location="cpu") -> dict:
    """Load one checkpoint with weights_only=True onto `map_location`; CheckpointError if unreadable."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as error:  # torch raises RuntimeError, EOFError or UnpicklingError by case
        raise CheckpointError(
            f"checkpoint {Path(path).name} cannot be loaded: it is truncated or corrupt (a crash or a full "
            f"disk during the save), or holds objects weights_only=True refuses (only tensors and "
            f"plain containers load). Delete it from the checkpoint folder to resume from the previous one. "
            f"({type(error).__name__}: {str(error)[:300]})") from error


def load_latest_checkpoint(directory, map_location="cpu"):
    """(state, path) of the newest loadable checkpoint, skipping unreadable ones with a warning; None if none."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return load_checkpoint(path, map_location), path
        except CheckpointError as error:
            warnings.warn(f"{error}; using the previous checkpoint instead", stacklevel=2)
    return None


def capture_rng_state(device: torch.device) -> dict:
    """This process's RNG states (torch, CUDA, Python, NumPy) in forms weights_only loading accepts."""
    version, mt_state, gauss = random.getstate()
    _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": [version, list(mt_state), gauss],
        "numpy": [torch.from_numpy(np_keys.astype(np.int64)), np_pos, np_has_gauss, np_gauss],
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state(("MT19937", np_keys.cpu().numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
