"""Lesson 07's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import io
import os
import re
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from course_lib.checks import lesson07
from course_lib.training.checkpoint import write_atomically


from . import answer, wrong_answer  # noqa: F401


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
        lesson07.reference_atomic_save(state, path)
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
        answer("rank 0 loads and broadcasts the state", lesson07.reference_save_training_state,
               load_on_rank0_and_broadcast),
    ],
    lesson07.check_prune_checkpoints: [
        answer("glob and a regex", prune_with_glob_and_regex),
        answer("listdir, newest first, os.remove", prune_with_listdir_and_remove),
    ],
}
