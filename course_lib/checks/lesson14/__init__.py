"""Grader for lesson 14, the capstone: train.py, a one-device training script, converted to DDP.

check_capstone(path) runs your file as a job would, in a scratch folder, on the CPU (gloo; the
GPUs are hidden, so it grades the same on a laptop and on a GPU node):

1. `torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 2`: 2 ranks train 2 epochs;
2. the same with `--epochs 3`: it resumes from run 1's checkpoint and trains epoch 2 only;
3. beside it, `python train_ddp.py --epochs 3 --amp` on a copy of run 1's checkpoint: one
   process (no RANK), mixed precision, resuming from what the DDP run saved.

A probe (script_probe.py runs the script with probe_program.py) records what every process does.
The rules, in the order a message reports them: every run finishes (crashes.py says why one did
not); every forward goes through DDP; each rank loads the samples DistributedSampler(seed=0) deals
it for the epoch; one optimizer step per global batch of 32, with one gradient all-reduce, in its
last micro-batch; rank 0 alone prints the oracle's losses (oracle.py), step by step
(training_rules.py); rank 0 alone saves, every epoch, atomically as lesson 07 taught (another
name, fsync, rename); the checkpoint loads with weights_only=True and holds the plain model's keys
(checkpoint_rules.py); bf16 autocast with --amp on the CPU, none without; no group alive at exit.

Reading the file and running it are crossings (engine/boundary.py, observed_runs.py): what comes
back is plain data (the text, the probe's records, outputs, the checkpoint's keys), rebuilt here
into Runs that the rules above judge in the grader's process.
"""
import tempfile
from pathlib import Path

from ..engine import GradingError, expect, grader
from .checkpoint_rules import (expect_atomic_save, expect_no_other_writer, expect_one_writer,
                               expect_plain_checkpoint)
from .crashes import crash_message, trained_without_ddp, where_it_waits
from .oracle import EPOCHS, WORLD_SIZE
from .oracle import oracle as one_process_losses
from .run_verdicts import reject, who
from .observed_runs import runs_crossing, script_crossing
from .script_probe import Run, Script
from .training_rules import (expect_autocast, expect_ddp, expect_group_destroyed, expect_log,
                             expect_one_all_reduce_per_step, expect_samples, expect_steps)

FIRST_EPOCHS = 2                          # run 1 trains epochs 0-1; runs 2 and 3 resume for epoch 2
RUN_TIMEOUT_S = 240                       # per run; a run takes 10-30 s on a busy 2-core machine
LOSS_ATOL = 1e-4                          # float32 in another order; printed with 6 decimals
AMP_LOSS_ATOL = 0.03                      # bf16 autocast against the float32 oracle
STUB = 'raise NotImplementedError("Exercise: write this part'
STUB_HINT = ("replace the `raise NotImplementedError(...)` line at the top of train_ddp.py with "
             "your conversion of the script below it: edit the file beside the notebook, save it, "
             "then run this check again")


def _expect_finished(run: Run, script: Script) -> None:
    if run.timed_out:
        waits = "; ".join(where_it_waits(run, script)) or "no stack could be read"
        reject(run, f"the run to finish within {RUN_TIMEOUT_S} s",
               f"it was still running, and was stopped: {waits}",
               "a rank waits in a collective (an all-reduce, DDP's gradient all-reduce, a barrier) "
               "that another rank never calls: the ranks did not run the same steps and the same "
               "collectives")
    if run.returncode != 0:
        if run.distributed and trained_without_ddp(run):
            expect_ddp(run)  # ranks training on their own share files; that is why it crashed
        expect_no_other_writer(run)  # ranks racing for one file can crash: say the cause
        got, hint = crash_message(run, script)
        if "NotImplementedError" in got:
            raise GradingError("train_ddp.py", "your conversion of train.py",
                               "a script that raises the exercise's NotImplementedError", STUB_HINT)
        if run.distributed and len(run.processes) == run.ranks:
            expect_group_destroyed(run)  # a group left alive can abort the exit: say that first
        reject(run, "the run to exit with code 0", got, hint)
    expected = list(range(run.ranks)) if run.distributed else [None]
    for rank in (rank for rank in expected if rank not in run.processes):
        reject(run, "every process to end normally, through Python's exit",
               f"{who(rank)} ended without running Python's exit handlers",
               "os._exit() and signals skip Python's shutdown, and the grader's record of the "
               "run with it: the script must end by returning")


def _judge(run: Run, script: Script, epochs: list, losses: dict, shares: dict, amp: bool) -> None:
    _expect_finished(run, script)
    if run.distributed:
        expect_ddp(run)
    expect_samples(run, epochs)
    expect_steps(run, epochs)
    if run.distributed:
        expect_one_all_reduce_per_step(run)
    expect_log(run, epochs, losses, shares, AMP_LOSS_ATOL if amp else LOSS_ATOL)
    expect_one_writer(run, epochs)
    expect_atomic_save(run)
    expect_autocast(run, amp)
    if run.distributed:
        expect_group_destroyed(run)


@grader("train.py converted to DDP")
def check_capstone(path):
    script = script_crossing(path)
    expect(script is not None, "train_ddp.py", f"a file at {path}", "no such file",
           "run the cell that writes train_ddp.py beside the notebook (it keeps the file you "
           "edited), then this check")
    expect(STUB not in script.text, "train_ddp.py",
           "your conversion of train.py", "the exercise's starting file, which raises "
           "NotImplementedError at its top", STUB_HINT)
    losses, shares = one_process_losses()
    with tempfile.TemporaryDirectory(prefix="capstone_") as scratch:
        scratch = Path(scratch)
        first = Run(f"under torchrun ({WORLD_SIZE} ranks, --epochs {FIRST_EPOCHS})",
                    ["--epochs", str(FIRST_EPOCHS)], scratch / "first", WORLD_SIZE)
        [first] = runs_crossing("check_capstone: run 1", script, [first], scratch, RUN_TIMEOUT_S)
        _judge(first, script, list(range(FIRST_EPOCHS)), losses, shares, amp=False)
        expect_plain_checkpoint(first)
        resumed = Run(f"under torchrun, resumed ({WORLD_SIZE} ranks, --epochs {EPOCHS})",
                      ["--epochs", str(EPOCHS)], scratch / "resumed", WORLD_SIZE)
        plain = Run(f"with plain python (no torchrun; --epochs {EPOCHS} --amp, resuming from the "
                    f"DDP run's checkpoint)", ["--epochs", str(EPOCHS), "--amp"],
                    scratch / "plain", 0)
        resumed, plain = runs_crossing("check_capstone: runs 2 and 3", script, [resumed, plain],
                                       scratch, RUN_TIMEOUT_S, checkpoint_from=first)
        _judge(resumed, script, list(range(FIRST_EPOCHS, EPOCHS)), losses, shares, amp=False)
        _judge(plain, script, list(range(FIRST_EPOCHS, EPOCHS)), losses, shares, amp=True)
