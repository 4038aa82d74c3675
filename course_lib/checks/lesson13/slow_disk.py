"""A shared file system as a grader sees it: rank 0's writes are slow and visible while they last,
and every read of a file not yet complete is recorded, even when the learner's code catches it.

Inside a rank, ``with slow_disk(folder) as disk:`` patches torch.save and torch.load: rank 0's
torch.save writes its bytes in WRITE_CHUNKS flushed pieces over WRITE_SECONDS (lesson 08's
topics.pitfalls.slow_disk), so that a rank that looks for the file (os.path.exists) finds it half
written; a torch.load that fails on such a file is recorded in ``disk.early_reads`` before its
error reaches the caller. load_on_rank runs a learner's load_data on it, one rank starting late,
and returns what it observed; what_was_loaded, in the grader, compares it with the dataset.
"""
import contextlib
import pickle
import time
from dataclasses import dataclass, field
from unittest import mock

import torch
import torch.distributed as dist

from ...topics import debugging, pitfalls
from ...training.data import make_dataset

WRITE_SECONDS = 0.8  # rank 0's torch.save of a small file takes this long, as on a busy disk
WRITE_CHUNKS = 8     # in this many pieces, each flushed: a reader sees every partial length


class ReadTooEarly(Exception):
    """torch.load of a file rank 0 had not finished writing."""


@dataclass
class Disk:
    folder: str
    saves: int = 0                                    # torch.save calls on this rank
    early_reads: list = field(default_factory=list)   # what each failed torch.load said


@contextlib.contextmanager
def slow_disk(folder: str):
    disk = Disk(folder)
    with pitfalls.slow_disk(WRITE_SECONDS, rank=0, pieces=WRITE_CHUNKS):
        slow_save, real_load = torch.save, torch.load

        def save(obj, f, *args, **kwargs):
            disk.saves += 1
            return slow_save(obj, f, *args, **kwargs)

        def load(f, *args, **kwargs):
            try:
                return real_load(f, *args, **kwargs)
            except (OSError, EOFError, RuntimeError, ValueError, pickle.UnpicklingError) as error:
                said = f"{type(error).__name__}: {error}".replace(folder, "FOLDER")[:160]
                disk.early_reads.append(said)
                raise ReadTooEarly(said) from None

        with mock.patch.object(torch, "save", save), mock.patch.object(torch, "load", load):
            yield disk


LATE_START_S = 1.5  # one rank calls load_data this late: rank 1 after rank 0's file is
                    # complete, or rank 0 after rank 1 looked for the file


def load_on_rank(load_data, folder, late_rank) -> dict:
    """In a rank: what the grader observes of load_data on the slow disk, as plain data: its
    torch.save calls, what each failed torch.load said, and what it returned (its type's name, and
    its tensors when it is a tuple or list of them). The grader compares (what_was_loaded)."""
    if dist.get_rank() == late_rank:
        time.sleep(LATE_START_S)
    with slow_disk(folder) as disk:
        try:
            data = load_data(folder)
        except ReadTooEarly:
            data = None
    tensors = None
    if isinstance(data, (tuple, list)) and all(torch.is_tensor(item) for item in data):
        tensors = [item.detach().clone().as_subclass(torch.Tensor) for item in data]
    return {"saves": disk.saves, "early_reads": list(disk.early_reads),
            "type": type(data).__name__, "tensors": tensors}


def what_was_loaded(observed: dict) -> str:
    """In the grader: "the dataset", or what went wrong, from what load_on_rank observed. The
    learner's load_data builds the course's dataset itself (DATA_SAMPLES samples, make_dataset's
    seed), so the dataset is fixed: no grading-time seed reaches it."""
    if observed["early_reads"]:  # recorded even when load_data caught the error and read again
        return f"read the file before it was complete ({observed['early_reads'][0]})"
    expected, got = make_dataset(n_samples=debugging.DATA_SAMPLES).tensors, observed["tensors"]
    same = (got is not None and len(got) == len(expected)
            and all(torch.equal(one, want) for one, want in zip(got, expected)))
    return "the dataset" if same else f"something else: {observed['type']}"
