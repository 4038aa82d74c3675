"""Graders for lesson 07, checkpointing and resume: an atomic save that survives a crash, an exact
resume on 2 ranks (compared with an uninterrupted run), and keeping the last N checkpoints.

- atomic save: the state reaches `path` whole, through a temporary file next to it (same folder,
  so the rename is atomic), flushed and fsynced, then renamed over `path`; a crash at any step
  (half way through torch.save, at the fsync, at the rename) leaves the previous checkpoint whole.
- resume exactly: a run on 2 ranks saved with your save_training_state after 2 steps and again
  after 3 (rank 0 writes, the others wait until the new file is there; had rank 0 died at any point
  of the second save, path would still hold the first checkpoint whole), rebuilt from scratch and
  loaded with your load_training_state, then trained on, gives the uninterrupted run's losses and
  weights.
- keep the last N: only the N `step_<number>.pt` files with the largest step numbers stay (by
  number, not by name or modification time); other files are left alone.

The resume grader runs your save and load functions on 2 gloo ranks; the others run in this process.
"""
import contextlib
import hashlib
import io
import os
import re
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from .ranks import run_on_ranks
from . import expect, expect_close, expect_equal, grader, wrong_answer
from ..topics.crash_safety import SimulatedCrash, crash_half_way_through_torch_save
from ..training.checkpoint import write_atomically
from ..training.data import make_dataset
from ..training.models import make_model

WORLD_SIZE = 2
LAUNCH_TIMEOUT_S = 90


# -- exercise 1: an atomic save ------------------------------------------------------------------

def reference_atomic_save(state, path):
    """The exercise's answer: the library's write_atomically (temporary file, fsync, os.replace)."""
    write_atomically(state, path)


@contextlib.contextmanager
def record_file_calls():
    """Record os.fsync, os.replace and os.rename calls, in order: ("fsync", bytes on disk) and
    ("replace", destination, source)."""
    calls, real = [], {name: getattr(os, name) for name in ("fsync", "replace", "rename")}

    def fsync(fd):
        calls.append(("fsync", os.fstat(fd).st_size))
        return real["fsync"](fd)

    def renamer(name):
        def rename(source, destination, *args, **kwargs):
            calls.append((name, os.fspath(destination), os.fspath(source)))
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
    ("at the rename", ("replace", "rename")),
]


def _state(version):
    model = make_model(seed=version)
    return {"model": model.state_dict(), "step": version, "note": f"version {version}"}


def _same_state(loaded, expected) -> bool:
    return (isinstance(loaded, dict) and loaded.get("step") == expected["step"]
            and all(torch.equal(loaded["model"][name], tensor)
                    for name, tensor in expected["model"].items()))


def _load(path):
    try:
        return torch.load(path, weights_only=True)
    except Exception as error:  # truncated: torch raises RuntimeError, EOFError... by case
        return error


@grader("atomic save")
def check_atomic_save(atomic_save):
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "checkpoint.pt"
        first, second = _state(1), _state(2)
        with record_file_calls() as calls:
            atomic_save(first, path)
        expect(path.exists(), "the file after atomic_save(state, path)", "a checkpoint at path",
               "no file at path",
               "write a temporary file next to it, then os.replace(temporary, path)")
        loaded = _load(path)
        expect(_same_state(loaded, first), "torch.load(path) after atomic_save", "the saved state",
               repr(loaded)[:100], "torch.save the whole state into the temporary file")
        left = sorted(p.name for p in Path(directory).iterdir() if p.name != path.name)
        expect_equal(left, [], "other files left in the folder",
                     "rename the temporary file over path: nothing else may stay behind")
        with crash_half_way_through_torch_save():
            with contextlib.suppress(SimulatedCrash):
                atomic_save(second, path)
        loaded = _load(path)
        expect(_same_state(loaded, first), "path after a crash half way through saving the next "
               "checkpoint", "the previous checkpoint, whole and loadable",
               f"{type(loaded).__name__}: {str(loaded)[:80]}" if isinstance(loaded, Exception)
               else repr(loaded)[:100],
               "never write to path itself: write a temporary file, then rename it over path")

        renames = [index for index, (name, *_) in enumerate(calls) if name in ("replace", "rename")]
        expect(bool(renames) and calls[renames[-1]][1] == os.fspath(path),
               "how the file reached path", "a rename of the temporary file onto path "
               "(os.replace)", "no rename onto path" if not renames else f"calls {calls}",
               "torch.save straight to path is what leaves a half-written file after a crash")
        source_folder = Path(calls[renames[-1]][2]).resolve().parent
        expect(source_folder == path.resolve().parent, "the folder of the temporary file",
               "path's own folder", str(source_folder),
               "a rename is atomic only within one file system, and another folder may be on "
               "another one (then os.replace fails): write the temporary file next to path")
        synced = [call[1] for call in calls[: renames[-1]] if call[0] == "fsync"]
        final_size = path.stat().st_size
        expect(bool(synced), "os.fsync before the rename", "at least one fsync of the temporary "
               "file before it is renamed", "no fsync",
               "without os.fsync(file.fileno()) the rename can reach the disk before the data: "
               "after a power cut, path names an empty or partial file")
        expect(max(synced) == final_size, "the bytes on disk when you called os.fsync",
               f"all {final_size} bytes", f"{max(synced)} bytes",
               "call file.flush() before os.fsync: fsync only syncs what Python has handed to "
               "the operating system")

        for where, names in CRASH_POINTS:
            with crash_at(*names):
                with contextlib.suppress(SimulatedCrash):
                    atomic_save(second, path)
            loaded = _load(path)
            expect(_same_state(loaded, first), f"path after a crash {where} of the next save",
                   "the previous checkpoint, whole and loadable",
                   f"{type(loaded).__name__}: {str(loaded)[:80]}"
                   if isinstance(loaded, Exception) else repr(loaded)[:100],
                   "touch path only with the final os.replace(temporary, path): never remove or "
                   "write it before, since the process can die at any line")

        atomic_save(second, path)  # a save after the crash must succeed, over any leftover
        expect(_same_state(_load(path), second), "path after the next, successful save",
               "the new state", "something else", "open the temporary file with mode 'wb'")


def _saves_directly(state, path):
    torch.save(state, path)


def _saves_without_fsync(state, path):
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def _save_synced(state, file):
    """The part the wrong answers below get right: the state written, flushed and fsynced."""
    torch.save(state, file)
    file.flush()
    os.fsync(file.fileno())


def _never_renames(state, path):
    temporary = Path(path).with_name(Path(path).name + ".tmp")
    with open(temporary, "wb") as file:
        _save_synced(state, file)
    return temporary


def _temporary_file_in_another_folder(state, path):
    # in the system's temporary folder, not next to path
    with tempfile.NamedTemporaryFile(delete=False, suffix=".pt") as file:
        _save_synced(state, file)
    os.replace(file.name, path)


def _removes_the_old_checkpoint_first(state, path):
    temporary = _never_renames(state, path)  # the temporary file, written right
    if os.path.exists(path):
        os.remove(path)  # "make room": a crash before the rename leaves no checkpoint at all
    os.rename(temporary, path)


def _atomic_save_stub(state, path):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- exercise 2: resume exactly, on 2 ranks ------------------------------------------------------

STEPS, FIRST_SAVE_AT, STOP_AT = 8, 2, 3
BATCH_SIZE, LR, DROPOUT, SEED = 16, 0.01, 0.3, 100
SLOW_SAVE_S = 0.5  # rank 0's torch.save takes this long: a rank that does not wait will notice


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


def reference_load_training_state(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def _digest(path):
    """A fingerprint of the file at `path` (None when there is none)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest(), os.path.getsize(path)
    except FileNotFoundError:
        return None


@contextlib.contextmanager
def _watched_save(path, on_rank0: bool):
    """Count this rank's torch.save calls to files. On rank 0 each takes SLOW_SAVE_S longer, and the
    file at `path` is fingerprinted wherever a crash could strike: half way through each torch.save
    to a file, and before each os.fsync, os.replace and os.rename. Yields {"saves", "seen"}."""
    real = {"save": torch.save, **{name: getattr(os, name) for name in ("fsync", "replace", "rename")}}
    record = {"saves": 0, "seen": []}

    def look(where):
        if on_rank0:
            record["seen"].append((where, _digest(path)))

    def watched_save(obj, f, *args, **kwargs):
        if isinstance(f, io.BytesIO):  # pickling a tensor (all_gather_object) saves to memory
            return real["save"](obj, f, *args, **kwargs)
        record["saves"] += 1
        buffer = io.BytesIO()
        real["save"](obj, buffer, *args, **kwargs)
        data = buffer.getvalue()
        with open(f, "wb") if isinstance(f, (str, os.PathLike)) else contextlib.nullcontext(f) as file:
            file.write(data[: len(data) // 2])
            file.flush()
            look("half way through torch.save")
            if on_rank0:
                time.sleep(SLOW_SAVE_S)
            file.write(data[len(data) // 2:])

    def watched(name):
        def call(*args, **kwargs):
            look(f"at os.{name}")
            return real[name](*args, **kwargs)
        return call

    torch.save = watched_save
    os.fsync, os.replace, os.rename = watched("fsync"), watched("replace"), watched("rename")
    try:
        yield record
    finally:
        torch.save = real["save"]
        os.fsync, os.replace, os.rename = real["fsync"], real["replace"], real["rename"]


def _resume_on_rank(save_training_state, load_training_state, path):
    """An uninterrupted run, then the same run saved after FIRST_SAVE_AT and STOP_AT steps, rebuilt
    from scratch (reseeded as a new process would be), loaded and trained to the end."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    X, y = make_dataset(n_samples=256, seed=7).tensors
    torch.manual_seed(SEED + rank)  # each rank its own batches and dropout masks
    model, optimizer = build_training()
    expected = train_steps(DDP(model), optimizer, X, y, STEPS)
    expected_weights = parameters_to_vector(model.parameters()).detach().clone()

    torch.manual_seed(SEED + rank)
    model, optimizer = build_training()
    ddp_model = DDP(model)
    losses = train_steps(ddp_model, optimizer, X, y, FIRST_SAVE_AT)
    save_training_state(path, ddp_model, optimizer, FIRST_SAVE_AT)  # the previous checkpoint
    dist.barrier()  # the grader's own, so the rest runs whatever the save did
    previous = _digest(path)
    losses += train_steps(ddp_model, optimizer, X, y, STOP_AT - FIRST_SAVE_AT)
    with _watched_save(path, on_rank0=rank == 0) as watch:
        save_training_state(path, ddp_model, optimizer, STOP_AT)
    when_save_returned = _digest(path)
    dist.barrier()
    final = _digest(path)

    torch.manual_seed(SEED + rank)  # a new process runs the script from the top
    model, optimizer = build_training()
    step = load_training_state(path, model, optimizer)
    losses += train_steps(DDP(model), optimizer, X, y, STEPS - STOP_AT)
    seen = [(where, "the previous checkpoint" if digest == previous else "the new checkpoint"
             if digest == final else "no file" if digest is None else f"{digest[1]} bytes that are "
             f"neither checkpoint (half written: the new one has {final[1] if final else 0})")
            for where, digest in watch["seen"]]
    return {"expected": expected, "expected_weights": expected_weights, "losses": losses,
            "weights": parameters_to_vector(model.parameters()).detach().clone(),
            "saves": watch["saves"], "seen": seen, "step": step,
            "on_disk": when_save_returned is not None and when_save_returned == final != previous}


def _run_on_ranks(fn, *args, what: str):
    """fn(*args) on WORLD_SIZE quiet gloo ranks; a crash, a hang or a stub is explained."""
    return run_on_ranks(fn, *args, nprocs=WORLD_SIZE, what=what, timeout=LAUNCH_TIMEOUT_S,
                        hang_hint="every rank must call the same collectives (all_gather_object, "
                                  "barrier) in the same order: call them outside `if rank == 0`",
                        crash_hint=_crash_hint)


def _crash_hint(cause) -> str:
    if "module." in cause.traceback:
        return ("the checkpoint's keys start with 'module.': you saved the DDP wrapper's "
                "state_dict; save the model inside it, ddp_model.module.state_dict()")
    return "run the cell that defines them, and read the error"


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


def _diagnose(path) -> str:
    """What a checkpoint lacks for an exact resume, judged from its contents."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        return "save with torch.save, load with torch.load(path, weights_only=True)"
    found = list(_tensors_and_dicts(state))
    dicts = [item for item in found if isinstance(item, dict)]
    if any(item and all(isinstance(key, str) and key.startswith("module.") for key in item)
           for item in dicts):
        return ("the model's keys start with 'module.' (the DDP wrapper's state_dict), so the "
                "bare model loaded none of them; save ddp_model.module.state_dict()")
    if not any({"state", "param_groups"} <= set(item) and item["state"] for item in dicts):
        return ("the checkpoint has no optimizer state: AdamW keeps two running averages per "
                "parameter and a step count; save optimizer.state_dict() and restore it with "
                "optimizer.load_state_dict(...)")
    rng_size = torch.get_rng_state().numel()
    rng_states = [item for item in found if isinstance(item, torch.Tensor)
                  and item.dtype == torch.uint8 and item.numel() == rng_size]
    if not rng_states:
        return ("the checkpoint has no RNG state, so the resumed run draws other batches and "
                "dropout masks; save torch.get_rng_state() and restore it with torch.set_rng_state")
    if len(rng_states) < WORLD_SIZE or all(torch.equal(s, rng_states[0]) for s in rng_states):
        return ("the checkpoint holds one rank's RNG state, but each rank has its own: gather "
                "them all (dist.all_gather_object) and let each rank restore its own")
    return ("after loading, each rank must restore its own RNG state (torch.set_rng_state("
            "states[rank])), the model's and the optimizer's state")


@grader("resume exactly")
def check_resume(save_training_state, load_training_state):
    what = "a run resumed with your functions on 2 ranks"
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "checkpoint.pt")
        results = _run_on_ranks(_resume_on_rank, save_training_state, load_training_state, path,
                                what=what)
        for rank, result in enumerate(results):
            expected_saves = "at least 1" if rank == 0 else "0"
            expect(result["saves"] >= 1 if rank == 0 else result["saves"] == 0,
                   f"torch.save calls on rank {rank}", expected_saves, str(result["saves"]),
                   "rank 0 writes the checkpoint (the state is the same on every rank); the "
                   "others only take part in the collectives")
            expect(result["on_disk"], f"the checkpoint when save_training_state returned on rank "
                   f"{rank}", "the new checkpoint, on disk", "not there yet",
                   "after rank 0's save, call dist.barrier() on every rank, so no rank goes on "
                   "(or loads) before the file is written")
            expect_equal(result["step"], STOP_AT, f"the step load_training_state returned on rank "
                         f"{rank}", "return the step you saved")
        _expect_previous_checkpoint_survives(results[0]["seen"])
        for rank, result in enumerate(results):
            expect_close(result["losses"], result["expected"],
                         f"rank {rank}'s losses, {STOP_AT} steps + resume + {STEPS - STOP_AT} steps",
                         _diagnose(path), rtol=1e-6, atol=1e-7)
            expect_close(result["weights"], result["expected_weights"],
                         f"rank {rank}'s final weights", _diagnose(path), rtol=1e-6, atol=1e-7)


def _expect_previous_checkpoint_survives(seen):
    """Had rank 0 died anywhere in the save at STOP_AT, path must hold the step-FIRST_SAVE_AT
    checkpoint, or the new one once renamed over it: never half a file, never no file."""
    for where, found in seen:
        expect(found in ("the previous checkpoint", "the new checkpoint"),
               f"the file at path, had rank 0 crashed {where} while saving step {STOP_AT}",
               f"the previous checkpoint (step {FIRST_SAVE_AT}), whole", found,
               "write the checkpoint with write_atomically(state, path): torch.save into a "
               "temporary file next to path, then os.replace it over path. Writing path itself "
               "destroys the previous checkpoint the moment the save starts")


def _gathered_rng():
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, torch.get_rng_state())
    return states


def _save_on_rank0(path, state):
    if dist.get_rank() == 0:
        reference_atomic_save(state, path)
    dist.barrier()


def _save_without_optimizer(path, ddp_model, optimizer, step):
    rng = _gathered_rng()
    _save_on_rank0(path, {"model": ddp_model.module.state_dict(), "step": step, "rng": rng})


def _load_without_optimizer(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    torch.set_rng_state(state["rng"][dist.get_rank()])
    return state["step"]


def _save_without_rng(path, ddp_model, optimizer, step):
    _save_on_rank0(path, {"model": ddp_model.module.state_dict(),
                          "optimizer": optimizer.state_dict(), "step": step})


def _load_without_rng(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]


def _save_rank0_rng_only(path, ddp_model, optimizer, step):
    _save_on_rank0(path, {"model": ddp_model.module.state_dict(), "step": step,
                          "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state()})


def _load_rank0_rng_only(path, model, optimizer):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    return state["step"]


def _save_wrapped_state_dict(path, ddp_model, optimizer, step):
    rng = _gathered_rng()
    _save_on_rank0(path, {"model": ddp_model.state_dict(), "optimizer": optimizer.state_dict(),
                          "step": step, "rng": rng})


def _save_on_every_rank(path, ddp_model, optimizer, step):
    rng = _gathered_rng()
    state = {"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
             "step": step, "rng": rng}
    if dist.get_rank() == 0:
        reference_atomic_save(state, path)
    else:
        torch.save(state, os.fspath(path) + f".rank{dist.get_rank()}")
    dist.barrier()


def _save_without_barrier(path, ddp_model, optimizer, step):
    rng = _gathered_rng()
    if dist.get_rank() == 0:
        reference_atomic_save({"model": ddp_model.module.state_dict(), "step": step, "rng": rng,
                               "optimizer": optimizer.state_dict()}, path)


def _save_straight_to_path(path, ddp_model, optimizer, step):
    rng = _gathered_rng()
    if dist.get_rank() == 0:  # right state, but torch.save truncates path first: not write_atomically
        torch.save({"model": ddp_model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "step": step, "rng": rng}, path)
    dist.barrier()


def _load_after_waiting(path, model, optimizer):
    while not os.path.exists(path):  # the grader's barrier already waited; this never spins
        time.sleep(0.01)
    return reference_load_training_state(path, model, optimizer)


def _resume_stub(*args):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


# -- exercise 3: keep the last N -----------------------------------------------------------------

CHECKPOINT_NAME = re.compile(r"^step_(\d+)\.pt$")
SAVED_STEPS = [2, 9, 10, 11, 100, 101]
OTHER_FILES = [".step_102.pt.tmp", "config.json", "step_7.pt.old"]


def _make_folder(directory):
    # mtimes in a shuffled order: files copied between machines do not keep them
    for index, step in enumerate(SAVED_STEPS):
        path = Path(directory) / f"step_{step}.pt"
        path.write_bytes(b"checkpoint")
        os.utime(path, (1_000_000 + 37 * index % 11, 1_000_000 + 37 * index % 11))
    for name in OTHER_FILES:
        (Path(directory) / name).write_bytes(b"other")


@grader("keep the last N")
def check_prune_checkpoints(prune_checkpoints):
    for keep_last in (3, 1, 6, 10):
        with tempfile.TemporaryDirectory() as directory:
            _make_folder(directory)
            prune_checkpoints(Path(directory), keep_last)
            left = sorted(path.name for path in Path(directory).iterdir())
        kept_steps = SAVED_STEPS[-keep_last:]
        expected = sorted([f"step_{step}.pt" for step in kept_steps] + OTHER_FILES)
        hint = ("keep the checkpoints with the largest step numbers, compared as numbers "
                "('step_100.pt' < 'step_11.pt' as text), and delete only files named "
                "step_<N>.pt (not a save in progress, not other files)")
        removed_others = sorted(set(OTHER_FILES) - set(left))
        if removed_others:
            hint = f"{removed_others} are not checkpoints: leave them alone"
        expect_equal(left, expected, f"the folder after prune_checkpoints(directory, "
                     f"keep_last={keep_last}) (saved steps {SAVED_STEPS})", hint)


def _prune_by_name(directory, keep_last):
    found = sorted(Path(directory).glob("step_*.pt"))
    for path in found[: max(len(found) - keep_last, 0)]:
        path.unlink()


def _prune_by_mtime(directory, keep_last):
    found = sorted(Path(directory).glob("step_*.pt"), key=lambda path: path.stat().st_mtime)
    for path in found[: max(len(found) - keep_last, 0)]:
        path.unlink()


def _prune_every_pt_file(directory, keep_last):
    found = sorted(Path(directory).glob("*step_*.pt*"),
                   key=lambda path: int(re.search(r"\d+", path.name).group()))
    for path in found[: max(len(found) - keep_last, 0)]:
        path.unlink()


def _prune_off_by_one(directory, keep_last):
    found = sorted((int(m.group(1)), path) for path in Path(directory).iterdir()
                   if (m := CHECKPOINT_NAME.match(path.name)))
    for _, path in found[: len(found) - keep_last - 1]:
        path.unlink()


def _prune_stub(directory, keep_last):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    check_atomic_save: [
        wrong_answer("torch.save straight to the path", _saves_directly),
        wrong_answer("temporary file and rename, but no fsync", _saves_without_fsync),
        wrong_answer("writes the temporary file but never renames it", _never_renames),
        wrong_answer("temporary file in another folder (/tmp): the rename may cross file systems",
                     _temporary_file_in_another_folder),
        wrong_answer("removes the old checkpoint before renaming the new one over it",
                     _removes_the_old_checkpoint_first),
        wrong_answer("the lesson's stub", _atomic_save_stub),
    ],
    check_resume: [
        wrong_answer("does not save the optimizer state", _save_without_optimizer,
                     _load_without_optimizer),
        wrong_answer("does not save or restore the RNG state", _save_without_rng,
                     _load_without_rng),
        wrong_answer("saves rank 0's RNG state for every rank", _save_rank0_rng_only,
                     _load_rank0_rng_only),
        wrong_answer("saves the DDP wrapper's state_dict ('module.' keys)",
                     _save_wrapped_state_dict, reference_load_training_state),
        wrong_answer("every rank writes a file", _save_on_every_rank,
                     reference_load_training_state),
        wrong_answer("no barrier after rank 0's save", _save_without_barrier, _load_after_waiting),
        wrong_answer("rank 0 torch.saves straight to the path instead of write_atomically: a "
                     "crash mid-save destroys the previous checkpoint", _save_straight_to_path,
                     reference_load_training_state),
        wrong_answer("the lesson's stubs", _resume_stub, _resume_stub),
    ],
    check_prune_checkpoints: [
        wrong_answer("sorts by file name", _prune_by_name),
        wrong_answer("sorts by modification time", _prune_by_mtime),
        wrong_answer("also deletes temporary and other files", _prune_every_pt_file),
        wrong_answer("keeps one checkpoint too many", _prune_off_by_one),
        wrong_answer("the lesson's stub", _prune_stub),
    ],
}
