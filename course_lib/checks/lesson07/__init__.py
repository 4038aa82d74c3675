"""Graders for lesson 07, checkpointing and resume: an atomic save that survives a crash, an exact
resume on 2 ranks (compared with an uninterrupted run), and keeping the last N checkpoints.

- atomic save (your own: a call of the course's write_atomically does not count): the state
  reaches `path` whole, through a temporary file next to it (same folder,
  so the rename is atomic), whose bytes were all fsynced before that same file is renamed over
  `path`; a crash at any step (half way through torch.save, at the fsync, at the rename) leaves
  the previous checkpoint whole.
- resume exactly: a run on 2 ranks, and again on 3, saved with your save_training_state after 2 steps and again
  after 3 (rank 0 writes, slowed by 0.5 s on purpose; no rank returns before the new file is on
  disk; had rank 0 died at any point of the second save, path would still hold the first
  checkpoint whole), rebuilt from scratch and loaded with your load_training_state, then trained
  on, gives the uninterrupted run's losses and weights; `path` is a pathlib.Path. Your load reads
  the same checkpoint saved on GPUs (its tensors on a GPU this machine lacks) onto the CPU
  (map_location). Your load, given the same checkpoint with an object hidden in it that runs code when unpickled, must not run it (weights only); this
  last check runs in this process, in a process group of one rank.
- keep the last N (your own: a call of the course's list_checkpoints does not count): only the N
  `step_<number>.pt` files with the largest step numbers stay (by
  number, not by name or modification time); other files are left alone.

The resume grader runs your save and load functions on 2 gloo ranks (resume_run.py in this
package); the others run in this process. save_watch.py watches the saves, observe.py runs
the saves and prunes in this process and returns what they did as plain data.
"""
import os
import tempfile
from pathlib import Path

import torch

from ..engine import expect, expect_close, expect_equal, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import call_learner, library_call_hint
from ..engine.ranks import run_on_ranks
from ...training.models import make_model
from .observe import crashed_save, observed_save, pruned, saved
from .resume_run import (FIRST_SAVE_AT, SEED, SLOW_SAVE_S, STEPS, STOP_AT, WORLD_SIZES, DATA_SEED,
                         loads_a_gpu_checkpoint, loads_hidden_code, on_disk_when_returned,
                         resume_on_rank, what_was_seen)
from .save_watch import CRASH_POINTS, RENAMES

LAUNCH_TIMEOUT_S = 90
SAVE_CALL = "atomic_save(state, path)"


# -- exercise 1: an atomic save ------------------------------------------------------------------

def _state(version):
    model = make_model(seed=grading_seed(version))
    return {"model": model.state_dict(), "step": version, "note": f"version {version}"}


def _same_state(loaded, expected) -> bool:
    """Whether a checkpoint observed on the learner's side (observe.checkpoint_at) is `expected`."""
    state = loaded["state"]
    return (state is not None and state["step"] == expected["step"]
            and isinstance(state["model"], dict)
            and all(isinstance(state["model"].get(name), torch.Tensor)
                    and torch.equal(state["model"][name], tensor)
                    for name, tensor in expected["model"].items()))


@grader("atomic save")
def check_atomic_save(atomic_save):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "checkpoint.pt"
        first, second = _state(1), _state(2)
        save = call_learner(observed_save, atomic_save, first, path, what=SAVE_CALL)
        expect(not save["library_calls"], SAVE_CALL, "your own atomic save",
               "a call of course_lib.training.checkpoint.write_atomically",
               library_call_hint("write_atomically", "exercise 1"))
        expect(save["exists"], "the file after atomic_save(state, path)", "a checkpoint at path",
               "no file at path", "atomic_save returned, and nothing has the name path")
        loaded = save["checkpoint"]
        expect(_same_state(loaded, first), "torch.load(path) after atomic_save", "the saved state",
               loaded["shown"], "the file at path does not load back as the state you were given")
        expect_equal(save["left"], [], "other files left in the folder",
                     "after a save that did not crash, only path may stay: the temporary file "
                     "becomes path")
        _expect_synced_then_renamed(save["calls"], path)
        loaded = call_learner(crashed_save, atomic_save, second, path, "half way", what=SAVE_CALL)
        expect(_same_state(loaded, first), "path after a crash half way through saving the next "
               "checkpoint", "the previous checkpoint, whole and loadable", loaded["shown"],
               "path itself was being written when the process died: the previous checkpoint "
               "was gone before the new one was complete")
        for where, _ in CRASH_POINTS:
            loaded = call_learner(crashed_save, atomic_save, second, path, where, what=SAVE_CALL)
            expect(_same_state(loaded, first), f"path after a crash {where} of the next save",
                   "the previous checkpoint, whole and loadable", loaded["shown"],
                   f"the process died {where}, and path had already changed: it was removed or "
                   f"written before the final rename")

        # a save after the crash must succeed, over any leftover
        loaded = call_learner(saved, atomic_save, second, path, what=SAVE_CALL)
        expect(_same_state(loaded, second), "path after the next, successful save",
               "the new state", "something else",
               "after a crashed save, the next one must still put its state at path, whatever "
               "the crash left behind")


def _expect_synced_then_renamed(calls, path):
    """The file renamed onto `path` was fsynced, all its bytes, before the rename, in its folder.
    `calls` are observe.observed_save's: paths relative to path's folder."""
    renames = [index for index, (name, *_) in enumerate(calls) if name in RENAMES]
    expect(bool(renames) and calls[renames[-1]][1] == path.name,
           "how the file reached path", "a rename of the temporary file onto path",
           "no rename onto path" if not renames else f"renames {[c[1:3] for c in calls]}",
           "path was written in place: a crash during the write leaves half a file there")
    _, _, _, size, identity, source_folder, source_folder_shown = calls[renames[-1]]
    expect(source_folder == ".", "the folder of the temporary file",
           "path's own folder", source_folder_shown,
           "a rename is atomic only within one file system, and another folder may be on another "
           "one (then the rename fails): the file renamed onto path came from elsewhere")
    synced = [call for call in calls[: renames[-1]] if call[0] == "fsync"]
    expect(bool(synced), "os.fsync before the rename", "an fsync of the temporary file before "
           "it is renamed", "no fsync before the rename",
           "the operating system may put the rename on disk before the data: after a power cut, "
           "path names an empty or partial file")
    own = [bytes_on_disk for _, bytes_on_disk, synced_identity in synced
           if synced_identity == identity]
    expect(bool(own), "the file you fsynced before the rename",
           "the temporary file that is renamed onto path", "another file (or the folder)",
           "the bytes that must be on disk before the rename are the renamed file's own")
    expect(max(own) == size, "the bytes on disk when you called os.fsync",
           f"all {size} bytes of the file", f"{max(own)} bytes",
           "the fsync came before the file was complete: what was written after it is not "
           "guaranteed on disk when the rename lands")


# -- exercise 2: resume exactly, on 2 ranks ------------------------------------------------------

def _run_on_ranks(fn, *args, world_size: int, what: str):
    """fn(*args) on `world_size` quiet gloo ranks; a crash, a hang or a stub is explained."""
    return run_on_ranks(fn, *args, nprocs=world_size, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint="the ranks waited for each other forever: one rank called a "
                                  "collective (all_gather_object, barrier) that another never "
                                  "reached, e.g. only inside `if rank == 0`",
                        crash_hint=_crash_hint)


def _crash_hint(cause) -> str:
    if "module." in cause.traceback:
        return ("the checkpoint's model keys start with 'module.': they are the DDP wrapper's "
                "names, which the bare model does not have")
    return "the error was raised in your function (its traceback is below)"


@grader("resume exactly")
def check_resume(save_training_state, load_training_state):
    with tempfile.TemporaryDirectory() as directory:
        for world_size in WORLD_SIZES:
            path = Path(directory) / f"{world_size}_ranks" / "checkpoint.pt"  # a pathlib.Path
            path.parent.mkdir()
            what = f"a run resumed with your functions on {world_size} ranks"
            results = _run_on_ranks(resume_on_rank, save_training_state, load_training_state,
                                    path, grading_seed(DATA_SEED), grading_seed(SEED),
                                    world_size=world_size, what=what)
            _judge_resume(results, f"on {world_size} ranks")
        [gpu] = run_on_ranks(loads_a_gpu_checkpoint, load_training_state, path, nprocs=1,
                             what="load_training_state on 1 rank", timeout=LAUNCH_TIMEOUT_S,
                             hang_hint="on one rank alone, no collective can wait for another",
                             crash_hint=_crash_hint)
        expect(gpu["error"] is None,
               f"load_training_state on the same checkpoint saved on GPUs (its tensors on "
               f"{gpu['device']}, a device this machine does not have)",
               "the state loaded onto the CPU", str(gpu["error"]),
               "torch.load puts each tensor back on the device it was saved from unless "
               "map_location says where: a checkpoint from rank 1 of an NCCL run asks for "
               "cuda:1, which a machine with one GPU (or none) does not have")
        code_ran = call_learner(loads_hidden_code, load_training_state, path,
                                what="load_training_state(path, model, optimizer)")
        expect(not code_ran,
               "load_training_state on a checkpoint with an object hidden in it (like section "
               "4's Payload, harmless here)",
               "the load refuses the object (it is not a tensor or a plain container)",
               "the object was unpickled: the code it carries ran",
               "whoever writes a checkpoint your load accepts this way can run any code on your "
               "machine: the load must rebuild tensors and plain containers only")


def _judge_resume(results, ranks):
    """The run on `ranks` (e.g. "on 2 ranks"): one writer, slow and waited for, a whole previous
    checkpoint wherever rank 0 could die, the step returned, the uninterrupted run's numbers."""
    for rank, result in enumerate(results[1:], start=1):
        expect(result["saves"] == 0, f"torch.save calls on rank {rank} ({ranks})", "0",
               str(result["saves"]), f"rank {rank} wrote a file too: the state is the same "
               f"on every rank, so one copy, rank 0's, is the checkpoint")
    seconds = results[0]["save_seconds"]
    expect(seconds >= SLOW_SAVE_S - 0.01, f"how long rank 0's save took ({ranks})",
           f"at least {SLOW_SAVE_S} s (the grader slows rank 0's torch.save, or its rename "
           f"onto path, by {SLOW_SAVE_S} s)", f"{seconds:.3f} s",
           "rank 0's checkpoint reached path through neither torch.save nor a rename, so the "
           "grader could not watch it being written")
    written_at = results[0]["written_at"]
    for rank, result in enumerate(results):
        early = (f"returned {written_at - result['returned_at']:.2f} s before rank 0's file "
                 f"was on disk" if written_at and result["returned_at"] < written_at
                 else "the file at path was not the new checkpoint yet")
        expect(on_disk_when_returned(result) and written_at is not None
               and result["returned_at"] >= written_at,
               f"the checkpoint when save_training_state returned on rank {rank} ({ranks})",
               "the new checkpoint, on disk", early,
               f"rank {rank} went on while rank 0 was still writing: it could load, delete or "
               f"train past a checkpoint that is not there")
        expect_equal(result["step"], STOP_AT, f"the step load_training_state returned on rank "
                     f"{rank} ({ranks})", "the step saved with the checkpoint is the one to return")
    _expect_previous_checkpoint_survives(what_was_seen(results[0]))
    diagnosis = results[0]["diagnosis"]  # what the checkpoint lacks, read on rank 0 at the end
    for rank, result in enumerate(results):
        expect_close(result["losses"], result["expected"],
                     f"rank {rank}'s losses ({ranks}), {STOP_AT} steps + resume + "
                     f"{STEPS - STOP_AT} steps", diagnosis, rtol=1e-6, atol=1e-7)
        expect_close(result["weights"], result["expected_weights"],
                     f"rank {rank}'s final weights ({ranks})", diagnosis, rtol=1e-6, atol=1e-7)


def _expect_previous_checkpoint_survives(seen):
    """Had rank 0 died anywhere in the save at STOP_AT, path must hold the step-FIRST_SAVE_AT
    checkpoint, or the new one once renamed over it: never half a file, never no file."""
    for where, found in seen:
        expect(found in ("the previous checkpoint", "the new checkpoint"),
               f"the file at path, had rank 0 crashed {where} while saving step {STOP_AT}",
               f"the previous checkpoint (step {FIRST_SAVE_AT}), whole", found,
               "path was written in place (or removed) during the save: a crash there leaves no "
               "whole checkpoint at all")


# -- exercise 3: keep the last N -----------------------------------------------------------------

SAVED_STEPS = [2, 9, 10, 11, 100, 101]
OTHER_FILES = [".step_102.pt.tmp", "config.json", "step_7.pt.old"]


def _make_folder(directory, saved_steps):
    # mtimes in a shuffled order: files copied between machines do not keep them
    for index, step in enumerate(saved_steps):
        path = Path(directory) / f"step_{step}.pt"
        path.write_bytes(b"checkpoint")
        os.utime(path, (1_000_000 + 37 * index % 11, 1_000_000 + 37 * index % 11))
    for name in OTHER_FILES:
        (Path(directory) / name).write_bytes(b"other")


@grader("keep the last N")
def check_prune_checkpoints(prune_checkpoints):
    saved_steps = [step * (1 + grading_seed(0) % 3) for step in SAVED_STEPS]  # drawn at grading
    for keep_last in (3, 1, 6, 10):
        with tempfile.TemporaryDirectory() as directory:
            _make_folder(directory, saved_steps)
            call = f"prune_checkpoints(directory, keep_last={keep_last})"
            seen = call_learner(pruned, prune_checkpoints, directory, keep_last, what=call)
            expect(not seen["library_calls"], call, "your own choice of the files to delete",
                   "a call of course_lib.training.checkpoint.list_checkpoints",
                   library_call_hint("list_checkpoints", "exercise 3"))
            left = seen["left"]
        kept_steps = saved_steps[-keep_last:]
        expected = sorted([f"step_{step}.pt" for step in kept_steps] + OTHER_FILES)
        removed_others = sorted(set(OTHER_FILES) - set(left))
        deleted = [name for name in expected if name not in left and name not in OTHER_FILES]
        kept = [name for name in left if name not in expected]
        if removed_others:
            hint = f"you deleted {removed_others}: they are not step_<N>.pt checkpoints"
        elif deleted:
            hint = (f"you deleted {deleted}, among the {keep_last} largest steps"
                    + (f", and kept {kept}" if kept else ""))
        else:
            hint = f"you kept {kept}, older than the {keep_last} largest steps"
        expect_equal(left, expected, f"the folder after prune_checkpoints(directory, "
                     f"keep_last={keep_last}) (saved steps {saved_steps})", hint)
