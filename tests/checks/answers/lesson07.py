"""Lesson 07's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import io
import os
import pickle
import re
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from course_lib.checks import lesson07
from course_lib.training.checkpoint import write_atomically

from . import answer, wrong_answer


# The exercise's answers, as the solution writes them: a wrong save below is paired with the
# right load, or a wrong load with the right save

def reference_atomic_save(state, path):
    """The library's write_atomically (temporary file, fsync, os.replace)."""
    write_atomically(state, path)


def gathered_rng():
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, torch.get_rng_state())
    return states


def save_on_rank0(path, state):
    if dist.get_rank() == 0:
        write_atomically(state, path)
    dist.barrier()


def full_state(ddp_model, optimizer, step, rng):
    return {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
            "step": step, "rng": rng}


def reference_save_training_state(path, ddp_model, optimizer, step):
    save_on_rank0(path, full_state(ddp_model, optimizer, step, gathered_rng()))


def reference_load_training_state(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def atomic_save_with_named_temporary_file(state, path):
    path = Path(path)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".saving-", delete=False) as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    Path(file.name).replace(path)


def atomic_save_by_name_then_fsync(state, path):
    temporary = f"{path}.partial"
    torch.save(state, temporary)
    descriptor = os.open(temporary, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.rename(temporary, path)


def save_with_all_gather_of_rng_tensors(path, ddp_model, optimizer, step):
    mine = torch.get_rng_state()
    states = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(states, mine)
    if dist.get_rank() == 0:
        state = {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
                 "step": step, "rng": torch.stack(states)}
        reference_atomic_save(state, path)
    dist.barrier()


def load_rng_from_a_stacked_tensor(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.random.set_rng_state(state["rng"][dist.get_rank()].clone())
    return state["step"]


def save_with_gather_object_to_rank0(path, ddp_model, optimizer, step):
    rank = dist.get_rank()
    states = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(torch.get_rng_state(), states, dst=0)
    if rank == 0:
        write_atomically({"weights": ddp_model.module.state_dict(), "optim": optimizer.state_dict(),
                          "step": step, "rng_per_rank": {str(r): s for r, s in enumerate(states)}},
                         path)
    dist.all_reduce(torch.zeros(1))  # a barrier of our own: every rank waits for rank 0's save


def load_rng_from_a_dict(path, model, optimizer):
    state = torch.load(path, map_location=torch.device("cpu"), weights_only=True)
    model.load_state_dict(state["weights"], strict=True)
    optimizer.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng_per_rank"][str(dist.get_rank())])
    return int(state["step"])


def prune_with_glob_and_regex(directory, keep_last):
    numbered = []
    for path in Path(directory).glob("step_*.pt"):
        match = re.fullmatch(r"step_(\d+)\.pt", path.name)
        if match:
            numbered.append((int(match.group(1)), path))
    numbered.sort()
    for _, path in numbered[:-keep_last] if keep_last else numbered:
        path.unlink()


def prune_with_listdir_and_remove(directory, keep_last):
    def step_of(name):
        if name.startswith("step_") and name.endswith(".pt") and name[5:-3].isdigit():
            return int(name[5:-3])
        return None

    names = [name for name in os.listdir(directory) if step_of(name) is not None]
    newest_first = sorted(names, key=step_of, reverse=True)
    for name in newest_first[keep_last:]:
        os.remove(os.path.join(directory, name))


def atomic_save_from_bytes_with_os_write(state, path):
    buffer = io.BytesIO()
    torch.save(state, buffer)  # serialise in memory, then write the bytes by hand
    temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(descriptor, buffer.getvalue())
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)


def save_with_serialization_save_and_mkstemp(path, ddp_model, optimizer, step):
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, torch.random.get_rng_state())
    if dist.get_rank() == 0:
        descriptor, temporary = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".partial")
        with os.fdopen(descriptor, "wb") as file:
            torch.serialization.save({"model": ddp_model.module.state_dict(), "step": step,
                                      "optimizer": optimizer.state_dict(), "rng": states}, file)
            file.flush()
            os.fsync(file.fileno())
        os.rename(temporary, path)
    dist.monitored_barrier() if dist.get_backend() == "gloo" else dist.barrier()


def load_with_the_default_weights_only(path, model, optimizer):
    state = torch.load(path, map_location="cpu")  # weights_only=True is the default since 2.6
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def load_on_rank0_and_broadcast(path, model, optimizer):
    # only rank 0 reads the file; the others get the state by broadcast
    received = [torch.load(path, map_location="cpu", weights_only=True)
                if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(received, src=0)
    state = received[0]
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


ALTERNATIVES = {
    lesson07.check_atomic_save: [
        answer("NamedTemporaryFile in the folder, Path.replace",
               atomic_save_with_named_temporary_file),
        answer("torch.save by name, fsync a descriptor, os.rename",
               atomic_save_by_name_then_fsync),
        answer("bytes from memory, os.write and fsync", atomic_save_from_bytes_with_os_write),
    ],
    lesson07.check_resume: [
        answer("all_gather of RNG tensors, one stacked tensor", save_with_all_gather_of_rng_tensors,
               load_rng_from_a_stacked_tensor),
        answer("gather_object to rank 0, other keys, all_reduce as barrier",
               save_with_gather_object_to_rank0, load_rng_from_a_dict),
        answer("torch.serialization.save, mkstemp, monitored_barrier; default weights_only",
               save_with_serialization_save_and_mkstemp, load_with_the_default_weights_only),
        answer("rank 0 loads and broadcasts the state", reference_save_training_state,
               load_on_rank0_and_broadcast),
    ],
    lesson07.check_prune_checkpoints: [
        answer("glob and a regex", prune_with_glob_and_regex),
        answer("listdir, newest first, os.remove", prune_with_listdir_and_remove),
    ],
}


# -- Wrong answers: atomic_save(state, path) ----------------------------------------------------

def saves_directly(state, path):
    torch.save(state, path)


def saves_without_fsync(state, path):
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def save_synced(state, file):
    """The part the wrong answers below get right: the state written, flushed and fsynced."""
    torch.save(state, file)
    file.flush()
    os.fsync(file.fileno())


def never_renames(state, path):
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    with open(temporary, "wb") as file:
        save_synced(state, file)
    return temporary


def temporary_file_in_another_folder(state, path):
    # in the system's temporary folder, not next to path
    with tempfile.NamedTemporaryFile(delete=False, suffix=".pt") as file:
        save_synced(state, file)
    os.replace(file.name, path)


def removes_the_old_checkpoint_first(state, path):
    temporary = never_renames(state, path)  # the temporary file, written right
    if os.path.exists(path):
        os.remove(path)  # "make room": a crash before the rename leaves no checkpoint at all
    os.rename(temporary, path)


def fsyncs_the_folder_only(state, path):
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    torch.save(state, temporary)
    folder = os.open(Path(path).parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the folder's entries, not the file's bytes
    finally:
        os.close(folder)
    os.replace(temporary, path)


def fsyncs_before_writing(state, path):
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    with open(temporary, "wb") as file:
        os.fsync(file.fileno())  # an empty file reaches the disk; the bytes come after
        torch.save(state, file)
    os.replace(temporary, path)


def fsyncs_after_the_rename(state, path):
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)  # too late: the rename may reach the disk before the bytes
    finally:
        os.close(descriptor)


# -- Wrong answers: save_training_state / load_training_state ----------------------------------

def save_without_optimizer(path, ddp_model, optimizer, step):
    rng = gathered_rng()
    save_on_rank0(path, {"model": ddp_model.module.state_dict(), "step": step, "rng": rng})


def load_without_optimizer(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def save_without_rng(path, ddp_model, optimizer, step):
    save_on_rank0(path, {"model": ddp_model.module.state_dict(),
                          "optimizer": optimizer.state_dict(), "step": step})


def load_without_rng(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def save_rank0_rng_only(path, ddp_model, optimizer, step):
    save_on_rank0(path, full_state(ddp_model, optimizer, step, torch.get_rng_state()))


def load_rank0_rng_only(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return state["step"]


def save_wrapped_state_dict(path, ddp_model, optimizer, step):
    rng = gathered_rng()
    save_on_rank0(path, {"model": ddp_model.state_dict(), "optimizer": optimizer.state_dict(),
                          "step": step, "rng": rng})


def save_on_every_rank(path, ddp_model, optimizer, step):
    state = full_state(ddp_model, optimizer, step, gathered_rng())
    if dist.get_rank() == 0:
        write_atomically(state, path)
    else:
        torch.save(state, os.fspath(path) + f".rank{dist.get_rank()}")
    dist.barrier()


def save_without_barrier(path, ddp_model, optimizer, step):
    state = full_state(ddp_model, optimizer, step, gathered_rng())
    if dist.get_rank() == 0:
        write_atomically(state, path)


def barrier_before_the_write(path, ddp_model, optimizer, step):
    state = full_state(ddp_model, optimizer, step, gathered_rng())
    dist.barrier()  # waits for the others, not for the file: rank 0 writes after it
    if dist.get_rank() == 0:
        write_atomically(state, path)


def save_straight_to_path(path, ddp_model, optimizer, step):
    state = full_state(ddp_model, optimizer, step, gathered_rng())
    if dist.get_rank() == 0:  # right state, but torch.save truncates path first: not write_atomically
        torch.save(state, path)
    dist.barrier()


def pickle_straight_to_path(path, ddp_model, optimizer, step):
    state = full_state(ddp_model, optimizer, step, gathered_rng())
    if dist.get_rank() == 0:  # neither torch.save nor a rename: path is written in place
        with open(path, "wb") as file:
            pickle.dump(state, file)
    dist.barrier()


def load_with_pickle(path, model, optimizer):
    with open(path, "rb") as file:
        state = pickle.load(file)  # unpickles anything, code included
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def load_after_waiting(path, model, optimizer):
    while not os.path.exists(path):  # the grader's barrier already waited; this never spins
        time.sleep(0.01)
    return reference_load_training_state(path, model, optimizer)


def load_not_weights_only(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=False)  # runs what the file says
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def save_for_two_ranks(path, ddp_model, optimizer, step):
    states = [None, None]  # the world size of the run it was written on, hard-coded
    dist.all_gather_object(states, torch.get_rng_state())
    save_on_rank0(path, full_state(ddp_model, optimizer, step, states))


def load_without_map_location(path, model, optimizer):
    state = torch.load(path, weights_only=True)  # each tensor back on the device it was saved from
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def load_falling_back_to_unsafe(path, model, optimizer):
    try:
        return reference_load_training_state(path, model, optimizer)
    except pickle.UnpicklingError:  # "it refused the file: load it anyway"
        return load_not_weights_only(path, model, optimizer)


# -- Wrong answers: prune_checkpoints(directory, keep_last) --------------------------------------

CHECKPOINT_NAME = re.compile(r"^step_(\d+)\.pt$")


def prune_by_name(directory, keep_last):
    found = sorted(Path(directory).glob("step_*.pt"))
    for path in found[: max(len(found) - keep_last, 0)]:
        path.unlink()


def prune_by_mtime(directory, keep_last):
    found = sorted(Path(directory).glob("step_*.pt"), key=lambda path: path.stat().st_mtime)
    for path in found[: max(len(found) - keep_last, 0)]:
        path.unlink()


def prune_every_pt_file(directory, keep_last):
    found = sorted(Path(directory).glob("*step_*.pt*"),
                   key=lambda path: int(re.search(r"\d+", path.name).group()))
    for path in found[: max(len(found) - keep_last, 0)]:
        path.unlink()


def prune_off_by_one(directory, keep_last):
    found = sorted((int(m.group(1)), path) for path in Path(directory).iterdir()
                   if (m := CHECKPOINT_NAME.match(path.name)))
    for _, path in found[: len(found) - keep_last - 1]:
        path.unlink()


def saves_with_the_course_function(state, path):
    from course_lib.training import checkpoint
    checkpoint.write_atomically(state, path)


def prune_with_the_course_list(directory, keep_last):
    from course_lib.training.checkpoint import list_checkpoints
    for path in list_checkpoints(directory)[:-keep_last]:
        path.unlink()


def stub(*args):
    """The lesson's stub of each exercise."""
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    lesson07.check_atomic_save: [
        wrong_answer("torch.save straight to the path", saves_directly),
        wrong_answer("temporary file and rename, but no fsync", saves_without_fsync),
        wrong_answer("writes the temporary file but never renames it", never_renames),
        wrong_answer("temporary file in another folder (/tmp): the rename may cross file systems",
                     temporary_file_in_another_folder),
        wrong_answer("removes the old checkpoint before renaming the new one over it",
                     removes_the_old_checkpoint_first),
        wrong_answer("fsyncs the folder, never the file", fsyncs_the_folder_only),
        wrong_answer("fsyncs the empty file before torch.save writes it", fsyncs_before_writing),
        wrong_answer("fsyncs after the rename", fsyncs_after_the_rename),
        wrong_answer("the lesson's stub", stub),
        wrong_answer("the course's write_atomically", saves_with_the_course_function),
    ],
    lesson07.check_resume: [
        wrong_answer("does not save the optimizer state", save_without_optimizer,
                     load_without_optimizer),
        wrong_answer("does not save or restore the RNG state", save_without_rng,
                     load_without_rng),
        wrong_answer("saves rank 0's RNG state for every rank", save_rank0_rng_only,
                     load_rank0_rng_only),
        wrong_answer("saves the DDP wrapper's state_dict ('module.' keys)",
                     save_wrapped_state_dict, reference_load_training_state),
        wrong_answer("every rank writes a file", save_on_every_rank,
                     reference_load_training_state),
        wrong_answer("no barrier after rank 0's save", save_without_barrier, load_after_waiting),
        wrong_answer("the barrier before rank 0's write, not after it",
                     barrier_before_the_write, load_after_waiting),
        wrong_answer("rank 0 torch.saves straight to the path instead of write_atomically: a "
                     "crash mid-save destroys the previous checkpoint",
                     save_straight_to_path, reference_load_training_state),
        wrong_answer("loads with weights_only=False", reference_save_training_state,
                     load_not_weights_only),
        wrong_answer("falls back to weights_only=False when the safe load refuses",
                     reference_save_training_state, load_falling_back_to_unsafe),
        wrong_answer("loads without map_location: a GPU run's checkpoint asks for its GPUs",
                     reference_save_training_state, load_without_map_location),
        wrong_answer("gathers the RNG states into a list for two ranks, hard-coded",
                     save_for_two_ranks, reference_load_training_state),
        wrong_answer("rank 0 pickles straight to the path, loads with pickle",
                     pickle_straight_to_path, load_with_pickle),
        wrong_answer("the lesson's stubs", stub, stub),
    ],
    lesson07.check_prune_checkpoints: [
        wrong_answer("sorts by file name", prune_by_name),
        wrong_answer("sorts by modification time", prune_by_mtime),
        wrong_answer("also deletes temporary and other files", prune_every_pt_file),
        wrong_answer("keeps one checkpoint too many", prune_off_by_one),
        wrong_answer("the course's list_checkpoints picks the files", prune_with_the_course_list),
        wrong_answer("the lesson's stub", stub),
    ],
}
