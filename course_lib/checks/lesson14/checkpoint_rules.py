"""The capstone's rules on the checkpoint: rank 0 alone writes it, every epoch, atomically (another
name, fsync, rename), and it loads with weights_only=True holding the plain model's keys. What
they read of the checkpoint was observed on the learner's side after the run (observed_runs.py).
"""
from pathlib import Path

from ..engine import expect
from .run_verdicts import in_order, reject, who
from .script_probe import Run


def expect_no_other_writer(run: Run) -> None:
    for rank, saved in in_order(run.saves.items()):  # a rank torchrun killed included
        if rank not in (0, None) and saved:
            reject(run, "exactly one checkpoint writer: rank 0",
                   f"rank {rank} also wrote the checkpoint (torch.save {len(saved)} "
                   f"times, to {Path(saved[-1]).name})",
                   "every rank holds the same weights, and ranks writing one file at once can "
                   "leave it corrupt: one rank writes")


def expect_one_writer(run: Run, epochs: list) -> None:
    expect_no_other_writer(run)
    writer = 0 if run.distributed else None
    count = len(run.saves.get(writer, []))
    if count < len(epochs):
        reject(run, f"{who(writer)} to save the checkpoint at the end of each of epochs {epochs}",
               f"{who(writer)} called torch.save {count} times",
               "train.py saves at the end of every epoch: keep that")
    if not run.checkpoint["exists"]:
        reject(run, "the checkpoint at --checkpoint's path (checkpoint.pt)",
               "no file there", "the run must save where --checkpoint says, as train.py does")


def expect_atomic_save(run: Run) -> None:
    """Each save of the checkpoint goes to another name, is fsynced, then renamed onto it."""
    writer = 0 if run.distributed else None
    final = run.checkpoint["path"]
    saved, synced, expected = {}, set(), "a save to another name, fsync, then a rename onto it"
    events = run.processes[writer].events
    for event in events:
        if event[0] == "save" and event[1] == final:
            reject(run, f"each checkpoint written atomically (lesson 07): {expected}",
                   f"{who(writer)} wrote checkpoint.pt in place, with torch.save straight to "
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
                   f"{who(writer)} renamed {Path(saved[event[2]]).name} onto checkpoint.pt "
                   f"before its bytes were on disk (no fsync of it after the save)",
                   "the rename can reach the disk before the file's bytes: after a power cut "
                   "checkpoint.pt would name an empty or partial file")
    if not any(event[0] == "rename" and event[1] == final for event in events):
        names = ", ".join(sorted({Path(path).name for path in saved.values()}))
        reject(run, f"each checkpoint written atomically (lesson 07): {expected}",
               f"{who(writer)} saved to {names} and never renamed a saved file onto "
               f"checkpoint.pt",
               "the checkpoint must appear under its name whole, in one step")


def expect_plain_checkpoint(run: Run) -> None:
    if run.checkpoint["error"] is not None:  # a torn or foreign file, or objects weights_only refuses
        reject(run, "a checkpoint torch.load(..., weights_only=True) can read",
               run.checkpoint["error"],
               "a checkpoint holds state_dicts and plain numbers, which load safely (lesson 07)")
    wrapped = sorted(key for key in run.checkpoint["keys"] or () if key.startswith("module."))
    if wrapped:
        reject(run, "a checkpoint of the model without its DDP wrapper",
               f"the checkpoint's model keys start with 'module.' ({wrapped[0]}, ...): it holds "
               f"DDP's state_dict", "train.py, and a run with plain python, load the plain "
               "model's keys")

