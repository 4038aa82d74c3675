"""A training run stopped and resumed with the learner's save and load functions, for lesson 07's
resume grader: on each rank, the uninterrupted run to compare with, the watched save (rank 0's
made slow) and the fresh start; on a rank of its own, the load of the same checkpoint as a GPU
run writes it (its tensors on a GPU this machine lacks: only a load that maps them to the CPU
reads it); then, in the grader's process, the learner's load given a checkpoint with code hidden in it (the safe load
refuses it); and what a checkpoint lacks for an exact resume.
"""
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from ..engine.observations import as_plain
from ...training.data import make_dataset
from ...training.models import make_model
from .save_watch import digest, watched_save

WORLD_SIZES = (2, 3)  # a save written for 2 ranks only fails on 3
STEPS, FIRST_SAVE_AT, STOP_AT = 8, 2, 3
BATCH_SIZE, LR, DROPOUT = 16, 0.01, 0.3
SEED, DATA_SEED = 100, 7  # the bases of the grading seeds (engine/boundary.grading_seed)
SLOW_SAVE_S = 0.5  # rank 0's save takes this much longer: a rank that does not wait will notice


def build_training():
    """The run the grader resumes: the course model with dropout, and AdamW."""
    model = make_model(dropout=DROPOUT)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def train_steps(ddp_model, optimizer, X, y, steps):
    """`steps` optimizer steps, each on a batch drawn at random from this rank's global RNG."""
    losses = []
    for _ in range(steps):
        batch = torch.randint(len(X), (BATCH_SIZE,))
        loss = F.cross_entropy(ddp_model(X[batch]), y[batch])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


_CODE_RAN = []


def _code_ran_at_load():
    """What the hidden object of a suspicious checkpoint calls when it is unpickled."""
    _CODE_RAN.append(True)


class CodeAtLoad:
    """An object whose unpickling calls a function: only torch.load(weights_only=False) (or plain
    pickle) rebuilds it; the weights-only unpickler refuses it."""

    def __reduce__(self):
        return _code_ran_at_load, ()


def loads_hidden_code(load_training_state, path) -> bool:
    """Whether load_training_state, given the checkpoint at `path` with a hidden object added,
    runs the object's code. Runs in this process, in a process group of one rank (a store in
    memory, no port) unless one exists: no rank can hang waiting for another."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a checkpoint only an unsafe load reads: the object alone will tell
        state = {}
    suspicious = f"{path}.suspicious"
    torch.save({**state, "extra": CodeAtLoad()} if isinstance(state, dict)
               else [state, CodeAtLoad()], suspicious)
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    _CODE_RAN.clear()
    try:
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, optimizer = build_training()
            load_training_state(suspicious, model, optimizer)
    except Exception:  # refused (UnpicklingError), or a crash after the load: either way, look
        pass
    finally:
        if own_group:
            dist.destroy_process_group()
    return bool(_CODE_RAN)


def gpu_saved_copy(path):
    """A copy of the checkpoint at `path` as a run on GPUs writes it: every tensor recorded on
    cuda:N, N this machine's GPU count, so a GPU it does not have. (copy's path, that device), or
    None when the checkpoint does not load weights only (the other checks say why)."""
    from unittest import mock

    from ...runtime.shared.env import gpu_count

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return None
    device, copy = f"cuda:{gpu_count()}", f"{path}.gpu"
    with mock.patch.object(torch.serialization, "location_tag", lambda storage: device):
        torch.save(state, copy)  # torch.save records location_tag(storage) for each tensor
    return copy, device


def loads_a_gpu_checkpoint(load_training_state, path) -> dict:
    """load_training_state, on a rank of its own (world size 1: no collective can wait for a rank
    that failed; CUDA, if a load touches it, only ever in that process), given a copy of the
    checkpoint saved on a GPU this machine lacks: {"device": where its tensors say they live,
    "error": what the load raised, or None}."""
    made = gpu_saved_copy(path)
    if made is None:
        return {"device": None, "error": None}
    copy, device = made
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, optimizer = build_training()
        try:
            load_training_state(copy, model, optimizer)
        except Exception as crash:
            return {"device": device, "error": f"{type(crash).__name__}: {str(crash).splitlines()[0][:160]}"}
    return {"device": device, "error": None}


def resume_on_rank(save_training_state, load_training_state, path, data_seed, seed):
    """An uninterrupted run, then the same run saved after FIRST_SAVE_AT and STOP_AT steps, rebuilt
    from scratch (reseeded as a new process would be), loaded and trained to the end. Both runs'
    raw numbers come back (the grader compares them), and on rank 0 what the checkpoint lacks."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    X, y = make_dataset(n_samples=256, seed=data_seed).tensors
    torch.manual_seed(seed + rank)  # each rank its own batches and dropout masks
    model, optimizer = build_training()
    expected = train_steps(DDP(model), optimizer, X, y, STEPS)
    expected_weights = parameters_to_vector(model.parameters()).detach().clone()

    torch.manual_seed(seed + rank)
    model, optimizer = build_training()
    ddp_model = DDP(model)
    losses = train_steps(ddp_model, optimizer, X, y, FIRST_SAVE_AT)
    save_training_state(path, ddp_model, optimizer, FIRST_SAVE_AT)  # the previous checkpoint
    dist.barrier()  # the grader's own, so the rest runs whatever the save did
    previous = digest(path)
    losses += train_steps(ddp_model, optimizer, X, y, STOP_AT - FIRST_SAVE_AT)
    started = time.time()
    with watched_save(path, slow_s=SLOW_SAVE_S if rank == 0 else 0.0) as watch:
        save_training_state(path, ddp_model, optimizer, STOP_AT)
    returned = time.time()
    when_save_returned = digest(path)
    dist.barrier()
    final = digest(path)

    torch.manual_seed(seed + rank)  # a new process runs the script from the top
    model, optimizer = build_training()
    step = load_training_state(path, model, optimizer)
    losses += train_steps(DDP(model), optimizer, X, y, STEPS - STOP_AT)
    return {"expected": expected, "expected_weights": expected_weights, "losses": losses,
            "weights": parameters_to_vector(model.parameters()).detach().clone(),
            "saves": watch["saves"], "seen": watch["seen"], "step": as_plain(step),
            "save_seconds": returned - started, "returned_at": returned,
            "written_at": watch["written_at"],
            "digests": {"previous": previous, "final": final, "when_returned": when_save_returned},
            "diagnosis": diagnose(path, dist.get_world_size()) if rank == 0 else ""}


def what_was_seen(result) -> list:
    """[(where, what the file at path was)] wherever rank 0 could have died in its save, from the
    fingerprints a rank's result holds (save_watch.digest's), named on the grader's side."""
    previous, final = result["digests"]["previous"], result["digests"]["final"]
    return [(where, "the previous checkpoint" if found == previous else "the new checkpoint"
             if found == final else "no file" if found is None else f"{found[1]} bytes that are "
             f"neither checkpoint (half written: the new one has {final[1] if final else 0})")
            for where, found in result["seen"]]


def on_disk_when_returned(result) -> bool:
    """Whether the file at path was the new checkpoint when save_training_state returned."""
    digests = result["digests"]
    return (digests["when_returned"] is not None
            and digests["when_returned"] == digests["final"] != digests["previous"])


def _tensors_and_dicts(value):
    """Every tensor and dict inside a loaded checkpoint."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        yield value
        for item in value.values():
            yield from _tensors_and_dicts(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors_and_dicts(item)


def diagnose(path, world_size: int) -> str:
    """What a checkpoint written by `world_size` ranks lacks for an exact resume, judged from its
    contents."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return ("the checkpoint does not load with weights_only=True: it holds something other "
                "than tensors and plain containers")
    found = list(_tensors_and_dicts(state))
    dicts = [item for item in found if isinstance(item, dict)]
    if any(item and all(isinstance(key, str) and key.startswith("module.") for key in item)
           for item in dicts):
        return ("the model's keys start with 'module.' (the DDP wrapper's names), so the bare "
                "model loaded none of them")
    if not any({"state", "param_groups"} <= set(item) and item["state"] for item in dicts):
        return ("the checkpoint has no optimizer state: AdamW keeps two running averages per "
                "parameter and a step count, and the resumed run restarts them")
    rng_size = torch.get_rng_state().numel()
    rng_states = [item for item in found if isinstance(item, torch.Tensor)
                  and item.dtype == torch.uint8 and item.numel() == rng_size]
    if not rng_states:
        return ("the checkpoint has no RNG state, so the resumed run draws other batches and "
                "dropout masks")
    if len(rng_states) < world_size or all(torch.equal(s, rng_states[0]) for s in rng_states):
        return ("the checkpoint holds one rank's RNG state, but each rank has its own, and each "
                "draws its own batches and dropout masks")
    return ("the checkpoint holds every piece; after loading, some rank did not get back its own "
            "RNG state, the model's or the optimizer's")
