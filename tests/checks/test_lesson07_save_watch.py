"""Lesson 07's grading machinery: the fsync seen for the very file renamed onto the path, a slow
writer that is slow whichever way it writes through torch.save or a rename, and a hidden object
that only an unsafe load runs (in a process group of one rank, left as it was found)."""
import os
import pickle
import time

import torch
import torch.distributed as dist

from course_lib.checks.lesson07.resume_run import loads_hidden_code
from course_lib.checks.lesson07.save_watch import record_file_calls, watched_save
from course_lib.training.checkpoint import write_atomically


def test_record_file_calls_names_the_fsynced_file_and_the_renamed_one(tmp_path):
    path = tmp_path / "checkpoint.pt"
    real = os.fsync, os.replace
    with record_file_calls() as calls:
        write_atomically({"step": 1}, path)
    fsyncs = [call for call in calls if call[0] == "fsync"]
    (rename,) = [call for call in calls if call[0] == "replace"]
    assert rename[1] == os.fspath(path) and rename[3] == path.stat().st_size
    # the file's fsync names the renamed file; the folder's (after the rename) does not
    assert [call[2] == rename[4] for call in fsyncs] == [True, False]
    assert (os.fsync, os.replace) == real  # put back


def test_watched_save_slows_torch_save_or_else_the_rename(tmp_path):
    path = tmp_path / "checkpoint.pt"
    for write in (write_atomically, _rename_without_torch_save):
        started = time.time()
        with watched_save(path, slow_s=0.3) as watch:
            write({"step": 2}, path)
        assert time.time() - started >= 0.3
        assert watch["written_at"] is not None and watch["written_at"] >= started + 0.3
    with watched_save(path, slow_s=0.3) as watch:  # neither torch.save nor a rename: not slowed
        with open(path, "wb") as file:
            pickle.dump({"step": 3}, file)
    assert watch["written_at"] is None and watch["saves"] == 0


def _rename_without_torch_save(state, path):
    temporary = f"{path}.partial"
    with open(temporary, "wb") as file:
        pickle.dump(state, file)
    os.replace(temporary, path)


def _safe_load(path, model, optimizer):
    return torch.load(path, weights_only=True)["step"]


def _unsafe_load(path, model, optimizer):
    return torch.load(path, weights_only=False)["step"] + dist.get_rank()


def test_only_an_unsafe_load_runs_the_hidden_object(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"step": 3, "model": {}}, path)
    assert not loads_hidden_code(_safe_load, path)
    assert loads_hidden_code(_unsafe_load, path)
    assert not dist.is_initialized()  # its own process group of one rank is gone again
