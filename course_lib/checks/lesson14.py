"""Grader for lesson 14, the capstone: train.py, a one-device training script, converted to DDP.

check_capstone(path) runs your file as a job would, in a scratch folder, on the CPU (gloo; the
GPUs are hidden, so it grades the same on a laptop and on a GPU node):

1. `torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 2`: 2 ranks train 2 epochs;
2. the same with `--epochs 3`: it resumes from run 1's checkpoint and trains epoch 2 only;
3. beside it, `python train_ddp.py --epochs 3 --amp` on a copy of run 1's checkpoint: one
   process (no RANK), mixed precision, resuming from what the DDP run saved.

A probe (script_probe.py) records what every process does. The rules, in the order a message
reports them: every run finishes; every forward goes through DDP; each rank loads the samples
DistributedSampler(seed=0) deals it for the epoch; one optimizer step per global batch of 32, with
one gradient all-reduce, in its last micro-batch; rank 0 alone prints the oracle's losses
(capstone_oracle.py), step by step; rank 0 alone saves, every epoch, atomically as lesson 07 taught
(another name, fsync, rename); the checkpoint loads with weights_only=True and holds the plain
model's keys; bf16 autocast with --amp on the CPU, none without; no group alive at exit.
"""
import os
import shutil
import tempfile
from pathlib import Path

from .engine import GradingError, expect, grader, wrong_answer
from .capstone_crashes import crash_message, trained_without_ddp
from .capstone_oracle import (EPOCHS, GLOBAL_BATCH_SIZE, MICRO_BATCH_SIZE, SAMPLES, SEED,
                              STEPS_PER_EPOCH, WORLD_SIZE, loss_lines, oracle, rank_share)
from .edited_scripts import (EVERY_RANK_SAVES, NCCL_ON_THE_CPU, NO_PROCESS_GROUP,
                             RENAMES_UNSYNCED, SAVES_IN_PLACE, edited_reference)
from .script_probe import Run, install_probe, run_together, where_it_waits

FIRST_EPOCHS = 2                          # run 1 trains epochs 0-1; runs 2 and 3 resume for epoch 2
RUN_TIMEOUT_S = 240                       # per run; a run takes 10-30 s on a busy 2-core machine
LOSS_ATOL = 1e-4                          # float32 in another order; printed with 6 decimals
AMP_LOSS_ATOL = 0.03                      # bf16 autocast against the float32 oracle
STUB = 'raise NotImplementedError("Exercise: write this part'
STUB_HINT = ("replace the `raise NotImplementedError(...)` line at the top of train_ddp.py with "
             "your conversion of the script below it: edit the file beside the notebook, save it, "
             "then run this check again")


def _reject(run: Run, expected: str, got: str, hint: str):
    expect(False, f"train_ddp.py {run.what}", expected, got, hint)


def _who(rank) -> str:
    return "the process" if rank is None else f"rank {rank}"


def _in_order(items):  # by rank, None (plain python) included
    return sorted(items, key=lambda item: str(item[0]))


def _expect_finished(run: Run, script: Path) -> None:
    if run.timed_out:
        waits = "; ".join(where_it_waits(run, script)) or "no stack could be read"
        _reject(run, f"the run to finish within {RUN_TIMEOUT_S} s",
                f"it was still running, and was stopped: {waits}",
                "a rank waits in a collective (an all-reduce, DDP's gradient all-reduce, a barrier) "
                "that another rank never calls: the ranks did not run the same steps and the same "
                "collectives")
    if run.returncode != 0:
        if run.distributed and trained_without_ddp(run):
            _expect_ddp(run)  # ranks training on their own share files; that is why it crashed
        _expect_no_other_writer(run)  # ranks racing for one file can crash: say the cause
        got, hint = crash_message(run, script)
        if "NotImplementedError" in got:
            raise GradingError("train_ddp.py", "your conversion of train.py",
                               "a script that raises the exercise's NotImplementedError", STUB_HINT)
        if run.distributed and len(run.processes) == run.ranks:
            _expect_group_destroyed(run)  # a group left alive can abort the exit: say that first
        _reject(run, "the run to exit with code 0", got, hint)
    expected = list(range(run.ranks)) if run.distributed else [None]
    for rank in (rank for rank in expected if rank not in run.processes):
        _reject(run, "every process to end normally, through Python's exit",
                f"{_who(rank)} ended without running Python's exit handlers",
                "os._exit() and signals skip Python's shutdown, and the grader's record of the "
                "run with it: the script must end by returning")


def _expect_ddp(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        if not any(event[0] == "forward" for event in process.events):
            _reject(run, "every rank's forward to go through DistributedDataParallel",
                    f"rank {rank}'s model is not wrapped in DDP (no forward went through it)",
                    "without DDP's backward nothing averages the gradients: each rank steps on "
                    "its own, and the ranks' models drift apart")


def _expect_samples(run: Run, epochs: list) -> None:
    world_size = max(run.ranks, 1)
    fetched = {rank: process.fetched() for rank, process in run.processes.items()}
    if not all(fetched.values()):
        return  # samples not read through the Dataset's __getitem__: the losses will tell
    per_epoch = SAMPLES // world_size
    if run.distributed and fetched[0] == fetched[1]:
        _reject(run, "each rank its own half of every epoch",
                f"the sampler gives both ranks the same indices: rank 0 and rank 1 loaded the "
                f"same {len(fetched[0])} samples, in the same order",
                "a RandomSampler or shuffle=True gives every rank all of the dataset: each rank "
                "must get 1/world_size of it, the shares together the whole")
    for rank, got in _in_order(fetched.items()):
        share = 0 if rank is None else rank
        if len(got) != per_epoch * len(epochs):
            _reject(run, f"{_who(rank)} to load {per_epoch} samples in each of epochs {epochs}",
                    f"{_who(rank)} loaded {len(got)} samples in {len(epochs)} epoch(s)",
                    "each rank loads 1/world_size of the dataset per epoch; with plain python, "
                    "all of it")
        for index, epoch in enumerate(epochs):
            this_epoch = got[index * per_epoch:(index + 1) * per_epoch]
            if this_epoch != rank_share(epoch, share, world_size):
                _reject_order(run, _who(rank), epoch, this_epoch, share, world_size)


def _reject_order(run, who, epoch, got, share, world_size):
    repeated = [other for other in range(EPOCHS) if other != epoch
                and got == rank_share(other, share, world_size)]
    if repeated:
        _reject(run, f"{who} to get epoch {epoch}'s own samples, in epoch {epoch}'s order",
                f"the sampler gives {who} in epoch {epoch} the same indices, in the same order, "
                f"as in epoch {repeated[0]}",
                "DistributedSampler shuffles with seed + its epoch, and its epoch stays what it "
                "was until the loop tells it (the epoch a run resumes at too)")
    _reject(run, f"{who}'s samples in epoch {epoch} as DistributedSampler(dataset, seed={SEED}) "
                 f"deals them for epoch {epoch}",
            f"other samples or another order (first ones: {got[:6]}, expected "
            f"{rank_share(epoch, share, world_size)[:6]})",
            "the dataset, SEED and the sampler's seed decide the order: keep train.py's; with "
            "plain python train.py's RandomSampler, re-seeded each epoch, deals the same order")


def _expect_steps(run: Run, epochs: list) -> None:
    expected = STEPS_PER_EPOCH * len(epochs)
    world_size = max(run.ranks, 1)
    for rank, process in _in_order(run.processes.items()):
        steps = sum(event[0] == "step" for event in process.events)
        if steps != expected:
            _reject(run, f"{expected} optimizer steps in epochs {epochs}: one per global batch of "
                         f"{GLOBAL_BATCH_SIZE} samples",
                    f"{_who(rank)} took {steps} optimizer steps",
                    f"a step is {GLOBAL_BATCH_SIZE} samples over all ranks: each of {world_size} "
                    f"rank(s) contributes {GLOBAL_BATCH_SIZE // world_size} of them, in micro-"
                    f"batches of {MICRO_BATCH_SIZE}; the number of micro-batches a step "
                    f"accumulates must count the ranks")


def _expect_one_all_reduce_per_step(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        syncs = []
        for event in process.events:
            if event[0] == "forward":
                syncs.append(event[1])
            elif event[0] == "step":
                if syncs.count(True) > 1:
                    _reject(run, "one gradient all-reduce per optimizer step, with its last "
                                 "micro-batch", f"DDP all-reduced rank {rank}'s gradients "
                                 f"{syncs.count(True)} times in one step, once per micro-batch",
                            "the micro-batches before a step's last need no all-reduce: DDP "
                            "decides in each forward whether its backward all-reduces "
                            "(no_sync, lesson 05)")
                if syncs[-1:] != [True]:
                    when = (f"with micro-batch {syncs.index(True) + 1} of {len(syncs)}"
                            if True in syncs else "never (every forward ran inside no_sync)")
                    _reject(run, "the gradient all-reduce with a step's last micro-batch",
                            f"DDP all-reduced rank {rank}'s gradients {when}",
                            "the last micro-batch's backward all-reduces the gradients summed so "
                            "far; gradients added after it stay on their rank")
                syncs = []


def _expect_log(run: Run, epochs: list, losses: dict, shares: dict, atol: float) -> None:
    lines = loss_lines(run.processes[0 if run.distributed else None])
    who = "rank 0" if run.distributed else "the process"
    if not lines:
        _reject(run, f"{who} to print train.py's `epoch E step S loss L` lines",
                f"{who} printed none", "the grader reads train.py's loss lines: keep them")
    printed_epochs = sorted({epoch for epoch, _, _ in lines})
    if printed_epochs != epochs:
        resumed = epochs[0] > 0 and printed_epochs and printed_epochs[0] < epochs[0]
        _reject(run, f"{who} to print the losses of epochs {epochs}",
                f"it printed the losses of epochs {printed_epochs}"
                + (": it started again instead of resuming from the checkpoint" if resumed else ""),
                "a checkpoint was there at the start, and the run did not continue after its "
                "epoch" if resumed else "one line per optimizer step, as train.py prints")
    per_epoch = {epoch: sum(line[0] == epoch for line in lines) for epoch in epochs}
    if set(per_epoch.values()) != {STEPS_PER_EPOCH}:
        _reject(run, f"{STEPS_PER_EPOCH} loss lines per epoch, one per optimizer step",
                f"{who} printed " + ", ".join(f"{count} in epoch {epoch}"
                                               for epoch, count in per_epoch.items()),
                "one line per optimizer step, on rank 0")
    for rank, process in sorted(run.processes.items()) if run.distributed else ():
        if rank != 0 and loss_lines(process):
            _reject(run, "the losses printed by rank 0 only",
                    f"rank {rank} also printed the losses ({len(loss_lines(process))} lines)",
                    "every rank printing repeats each line world_size times, and on a cluster "
                    "floods the log")
    for epoch, step, loss in _numbered(lines):
        expected = losses[epoch][step]
        if abs(loss - expected) <= atol:
            continue
        if run.distributed and all(abs(printed - shares[e][0][s]) <= atol
                                   for e, s, printed in _numbered(lines)):
            _reject(run, "the loss of the whole global batch (the mean over the ranks)",
                    "rank 0 printed the loss of its own share of each global batch, not the "
                    "global batch's", "rank 0's loss is half of the batch: the number to print "
                    "takes every rank's (lesson 08)")
        first = (epoch, step) == (epochs[0], 0)
        _reject(run, f"the oracle's losses: one process on the whole global batch "
                     f"(epoch {epoch} step {step}: {expected:.6f})",
                f"epoch {epoch} step {step}: loss {loss:.6f}"
                + ("" if first else f", after {(epoch - epochs[0]) * STEPS_PER_EPOCH + step} "
                   f"step(s) that matched"),
                "each step must be one optimizer step on the mean gradient of the global batch, "
                "from the state the checkpoint holds (its momentum too) when the run resumed"
                if not first else "the first step's loss already differs: the model, the data "
                "or the loss over the global batch is not train.py's")


def _numbered(lines):
    """(epoch, step within the epoch, loss) for printed lines, counting the steps ourselves."""
    counts = {}
    for epoch, _, loss in lines:
        counts[epoch] = counts.get(epoch, 0) + 1
        yield epoch, counts[epoch] - 1, loss


def _expect_no_other_writer(run: Run) -> None:
    for rank, saved in _in_order(run.saves.items()):  # a rank torchrun killed included
        if rank not in (0, None) and saved:
            _reject(run, "exactly one checkpoint writer: rank 0",
                    f"rank {rank} also wrote the checkpoint (torch.save {len(saved)} "
                    f"times, to {Path(saved[-1]).name})",
                    "every rank holds the same weights, and ranks writing one file at once can "
                    "leave it corrupt: one rank writes")


def _expect_one_writer(run: Run, epochs: list) -> None:
    _expect_no_other_writer(run)
    writer = 0 if run.distributed else None
    count = len(run.saves.get(writer, []))
    if count < len(epochs):
        _reject(run, f"{_who(writer)} to save the checkpoint at the end of each of epochs {epochs}",
                f"{_who(writer)} called torch.save {count} times",
                "train.py saves at the end of every epoch: keep that")
    if not (run.folder / "checkpoint.pt").exists():
        _reject(run, "the checkpoint at --checkpoint's path (checkpoint.pt)",
                "no file there", "the run must save where --checkpoint says, as train.py does")


def _expect_atomic_save(run: Run) -> None:
    """Each save of the checkpoint goes to another name, is fsynced, then renamed onto it."""
    writer = 0 if run.distributed else None
    final = str((run.folder / "checkpoint.pt").resolve())
    saved, synced, expected = {}, set(), "a save to another name, fsync, then a rename onto it"
    events = run.processes[writer].events
    for event in events:
        if event[0] == "save" and event[1] == final:
            _reject(run, f"each checkpoint written atomically (lesson 07): {expected}",
                    f"{_who(writer)} wrote checkpoint.pt in place, with torch.save straight to "
                    f"its name", "a crash in the middle of that save leaves no checkpoint at all: "
                    "the previous one is already overwritten, the new one half written")
        elif event[0] == "save":
            saved[event[2]], synced = event[1], synced - {event[2]}
        elif event[0] == "fsync":
            synced.add(event[1])
        elif event[0] == "rename" and event[1] == final:
            if event[2] not in saved:
                continue  # not a file torch.save wrote in this run: the losses will tell
            expect(event[2] in synced, f"train_ddp.py {run.what}",
                   f"each checkpoint written atomically (lesson 07): {expected}",
                   f"{_who(writer)} renamed {Path(saved[event[2]]).name} onto checkpoint.pt "
                   f"before its bytes were on disk (no fsync of it after the save)",
                   "the rename can reach the disk before the file's bytes: after a power cut "
                   "checkpoint.pt would name an empty or partial file")
    if not any(event[0] == "rename" and event[1] == final for event in events):
        names = ", ".join(sorted({Path(path).name for path in saved.values()}))
        _reject(run, f"each checkpoint written atomically (lesson 07): {expected}",
                f"{_who(writer)} saved to {names} and never renamed a saved file onto "
                f"checkpoint.pt",
                "the checkpoint must appear under its name whole, in one step")


def _expect_plain_checkpoint(run: Run) -> None:
    import torch

    try:
        state = torch.load(run.folder / "checkpoint.pt", map_location="cpu", weights_only=True)
    except Exception as error:  # a torn or foreign file, or objects weights_only refuses
        _reject(run, "a checkpoint torch.load(..., weights_only=True) can read",
                f"{type(error).__name__}: {error}"[:300],
                "a checkpoint holds state_dicts and plain numbers, which load safely (lesson 07)")
    wrapped = sorted(key for key in _keys(state) if key.startswith("module."))
    if wrapped:
        _reject(run, "a checkpoint of the model without its DDP wrapper",
                f"the checkpoint's model keys start with 'module.' ({wrapped[0]}, ...): it holds "
                f"DDP's state_dict", "train.py, and a run with plain python, load the plain "
                "model's keys")


def _keys(value):
    for key, inner in value.items() if isinstance(value, dict) else ():
        yield from ([key] if isinstance(key, str) else [])
        yield from _keys(inner)


def _expect_autocast(run: Run, amp: bool) -> None:
    for rank, process in run.processes.items():
        kinds = set(process.autocast)
        if not amp and kinds - {"cpu:off"}:
            _reject(run, "float32 without --amp", f"the Linear layers ran under autocast "
                    f"({', '.join(sorted(kinds))})", "mixed precision only when --amp asks")
        if amp and kinds != {"cpu:bfloat16"}:
            got = ("no autocast on the CPU: the Linear layers ran in float32" if kinds == {"cpu:off"}
                   else f"the Linear layers ran as {', '.join(sorted(kinds))}")
            _reject(run, "with --amp on the CPU, bf16 autocast", got,
                    "autocast works on the device type it is given, in the format that device "
                    "runs natively (lesson 06, section 9): train.py's autocast('cuda', ...) does "
                    "nothing on a CPU")


def _expect_group_destroyed(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        if process.group_alive_at_exit:
            _reject(run, "every rank to destroy its process group before it exits",
                    f"rank {rank} exited with its process group still alive",
                    "a group left to Python's shutdown can abort the process after training "
                    "(lesson 04, section 6)")


def _judge(run: Run, script: Path, epochs: list, losses: dict, shares: dict, amp: bool) -> None:
    _expect_finished(run, script)
    if run.distributed:
        _expect_ddp(run)
    _expect_samples(run, epochs)
    _expect_steps(run, epochs)
    if run.distributed:
        _expect_one_all_reduce_per_step(run)
    _expect_log(run, epochs, losses, shares, AMP_LOSS_ATOL if amp else LOSS_ATOL)
    _expect_one_writer(run, epochs)
    _expect_atomic_save(run)
    _expect_autocast(run, amp)
    if run.distributed:
        _expect_group_destroyed(run)


@grader("train.py converted to DDP")
def check_capstone(path):
    script = Path(os.fspath(path)).resolve()
    expect(script.is_file(), "train_ddp.py", f"a file at {path}", "no such file",
           "run the cell that writes train_ddp.py beside the notebook (it keeps the file you "
           "edited), then this check")
    expect(STUB not in script.read_text(errors="replace"), "train_ddp.py",
           "your conversion of train.py", "the exercise's starting file, which raises "
           "NotImplementedError at its top", STUB_HINT)
    losses, shares = oracle()
    with tempfile.TemporaryDirectory(prefix="capstone_") as scratch:
        scratch = Path(scratch)
        site = install_probe(scratch)
        first = Run(f"under torchrun ({WORLD_SIZE} ranks, --epochs {FIRST_EPOCHS})",
                    ["--epochs", str(FIRST_EPOCHS)], scratch / "first", WORLD_SIZE)
        run_together(script, [first], site, RUN_TIMEOUT_S)
        _judge(first, script, list(range(FIRST_EPOCHS)), losses, shares, amp=False)
        _expect_plain_checkpoint(first)
        resumed = Run(f"under torchrun, resumed ({WORLD_SIZE} ranks, --epochs {EPOCHS})",
                      ["--epochs", str(EPOCHS)], scratch / "resumed", WORLD_SIZE)
        plain = Run(f"with plain python (no torchrun; --epochs {EPOCHS} --amp, resuming from the "
                    f"DDP run's checkpoint)", ["--epochs", str(EPOCHS), "--amp"],
                    scratch / "plain", 0)
        for run in (resumed, plain):
            run.folder.mkdir()
            shutil.copy(first.folder / "checkpoint.pt", run.folder / "checkpoint.pt")
        run_together(script, [resumed, plain], site, RUN_TIMEOUT_S)
        _judge(resumed, script, list(range(FIRST_EPOCHS, EPOCHS)), losses, shares, amp=False)
        _judge(plain, script, list(range(FIRST_EPOCHS, EPOCHS)), losses, shares, amp=True)


# -- wrong answers: the reference conversion with one mistake each -------------------------------

SLOW = True  # it runs the learner's script under torchrun: tests of it belong to the slow tier
WRONG_ANSWERS = {
    check_capstone: [
        wrong_answer("DDP without init_process_group on the CPU", edited_reference(NO_PROCESS_GROUP)),
        wrong_answer("NCCL although the ranks have no GPU", edited_reference(NCCL_ON_THE_CPU)),
        wrong_answer("every rank saves the checkpoint", edited_reference(EVERY_RANK_SAVES)),
        wrong_answer("rank 0 overwrites the checkpoint in place", edited_reference(SAVES_IN_PLACE)),
        wrong_answer("renamed before fsync", edited_reference(*RENAMES_UNSYNCED)),
    ],
}
