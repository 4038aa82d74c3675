"""The capstone's rules on how the script trains: DDP around the model, each rank's samples, one
optimizer step per global batch with one all-reduce, rank 0's loss lines, autocast, the group at exit.
"""
from .oracle import (EPOCHS, GLOBAL_BATCH_SIZE, MICRO_BATCH_SIZE, SAMPLES, SEED, STEPS_PER_EPOCH,
                     loss_lines, rank_share)
from .run_verdicts import in_order, reject, who
from .script_probe import Run


def expect_ddp(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        if not any(event[0] == "forward" for event in process.events):
            reject(run, "every rank's forward to go through DistributedDataParallel",
                   f"rank {rank}'s model is not wrapped in DDP (no forward went through it)",
                   "without DDP's backward nothing averages the gradients: each rank steps on "
                   "its own, and the ranks' models drift apart")


def expect_samples(run: Run, epochs: list) -> None:
    world_size = max(run.ranks, 1)
    fetched = {rank: process.fetched() for rank, process in run.processes.items()}
    if not all(fetched.values()):
        return  # samples not read through the Dataset's __getitem__: the losses will tell
    per_epoch = SAMPLES // world_size
    if run.distributed and fetched[0] == fetched[1]:
        reject(run, "each rank its own half of every epoch",
               f"the sampler gives both ranks the same indices: rank 0 and rank 1 loaded the "
               f"same {len(fetched[0])} samples, in the same order",
               "a RandomSampler or shuffle=True gives every rank all of the dataset: each rank "
               "must get 1/world_size of it, the shares together the whole")
    for rank, got in in_order(fetched.items()):
        share = 0 if rank is None else rank
        if len(got) != per_epoch * len(epochs):
            reject(run, f"{who(rank)} to load {per_epoch} samples in each of epochs {epochs}",
                   f"{who(rank)} loaded {len(got)} samples in {len(epochs)} epoch(s)",
                   "each rank loads 1/world_size of the dataset per epoch; with plain python, "
                   "all of it")
        for index, epoch in enumerate(epochs):
            this_epoch = got[index * per_epoch:(index + 1) * per_epoch]
            if this_epoch != rank_share(epoch, share, world_size):
                _reject_order(run, who(rank), epoch, this_epoch, share, world_size)


def _reject_order(run, name, epoch, got, share, world_size):
    repeated = [other for other in range(EPOCHS) if other != epoch
                and got == rank_share(other, share, world_size)]
    if repeated:
        reject(run, f"{name} to get epoch {epoch}'s own samples, in epoch {epoch}'s order",
               f"the sampler gives {name} in epoch {epoch} the same indices, in the same order, "
               f"as in epoch {repeated[0]}",
               "DistributedSampler shuffles with seed + its epoch, and its epoch stays what it "
               "was until the loop tells it (the epoch a run resumes at too)")
    reject(run, f"{name}'s samples in epoch {epoch} as DistributedSampler(dataset, seed={SEED}) "
                f"deals them for epoch {epoch}",
           f"other samples or another order (first ones: {got[:6]}, expected "
           f"{rank_share(epoch, share, world_size)[:6]})",
           "the dataset, SEED and the sampler's seed decide the order: keep train.py's; with "
           "plain python train.py's RandomSampler, re-seeded each epoch, deals the same order")


def expect_steps(run: Run, epochs: list) -> None:
    expected = STEPS_PER_EPOCH * len(epochs)
    world_size = max(run.ranks, 1)
    for rank, process in in_order(run.processes.items()):
        steps = sum(event[0] == "step" for event in process.events)
        if steps != expected:
            reject(run, f"{expected} optimizer steps in epochs {epochs}: one per global batch of "
                        f"{GLOBAL_BATCH_SIZE} samples",
                   f"{who(rank)} took {steps} optimizer steps",
                   f"a step is {GLOBAL_BATCH_SIZE} samples over all ranks: each of {world_size} "
                   f"rank(s) contributes {GLOBAL_BATCH_SIZE // world_size} of them, in micro-"
                   f"batches of {MICRO_BATCH_SIZE}; the number of micro-batches a step "
                   f"accumulates must count the ranks")


def expect_one_all_reduce_per_step(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        syncs = []
        for event in process.events:
            if event[0] == "forward":
                syncs.append(event[1])
            elif event[0] == "step":
                if syncs.count(True) > 1:
                    reject(run, "one gradient all-reduce per optimizer step, with its last "
                                "micro-batch", f"DDP all-reduced rank {rank}'s gradients "
                                f"{syncs.count(True)} times in one step, once per micro-batch",
                           "the micro-batches before a step's last need no all-reduce: DDP "
                           "decides in each forward whether its backward all-reduces "
                           "(no_sync, lesson 05)")
                if syncs[-1:] != [True]:
                    when = (f"with micro-batch {syncs.index(True) + 1} of {len(syncs)}"
                            if True in syncs else "never (every forward ran inside no_sync)")
                    reject(run, "the gradient all-reduce with a step's last micro-batch",
                           f"DDP all-reduced rank {rank}'s gradients {when}",
                           "the last micro-batch's backward all-reduces the gradients summed so "
                           "far; gradients added after it stay on their rank")
                syncs = []


def expect_log(run: Run, epochs: list, losses: dict, shares: dict, atol: float) -> None:
    lines = loss_lines(run.processes[0 if run.distributed else None])
    who = "rank 0" if run.distributed else "the process"
    if not lines:
        reject(run, f"{who} to print train.py's `epoch E step S loss L` lines",
               f"{who} printed none", "the grader reads train.py's loss lines: keep them")
    printed_epochs = sorted({epoch for epoch, _, _ in lines})
    if printed_epochs != epochs:
        resumed = epochs[0] > 0 and printed_epochs and printed_epochs[0] < epochs[0]
        reject(run, f"{who} to print the losses of epochs {epochs}",
               f"it printed the losses of epochs {printed_epochs}"
               + (": it started again instead of resuming from the checkpoint" if resumed else ""),
               "a checkpoint was there at the start, and the run did not continue after its "
               "epoch" if resumed else "one line per optimizer step, as train.py prints")
    per_epoch = {epoch: sum(line[0] == epoch for line in lines) for epoch in epochs}
    if set(per_epoch.values()) != {STEPS_PER_EPOCH}:
        reject(run, f"{STEPS_PER_EPOCH} loss lines per epoch, one per optimizer step",
               f"{who} printed " + ", ".join(f"{count} in epoch {epoch}"
                                              for epoch, count in per_epoch.items()),
               "one line per optimizer step, on rank 0")
    for rank, process in sorted(run.processes.items()) if run.distributed else ():
        if rank != 0 and loss_lines(process):
            reject(run, "the losses printed by rank 0 only",
                   f"rank {rank} also printed the losses ({len(loss_lines(process))} lines)",
                   "every rank printing repeats each line world_size times, and on a cluster "
                   "floods the log")
    for epoch, step, loss in _numbered(lines):
        expected = losses[epoch][step]
        if abs(loss - expected) <= atol:
            continue
        if run.distributed and all(abs(printed - shares[e][0][s]) <= atol
                                   for e, s, printed in _numbered(lines)):
            reject(run, "the loss of the whole global batch (the mean over the ranks)",
                   "rank 0 printed the loss of its own share of each global batch, not the "
                   "global batch's", "rank 0's loss is half of the batch: the number to print "
                   "takes every rank's (lesson 08)")
        first = (epoch, step) == (epochs[0], 0)
        reject(run, f"the oracle's losses: one process on the whole global batch "
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


def expect_autocast(run: Run, amp: bool) -> None:
    for rank, process in run.processes.items():
        kinds = set(process.autocast)
        if not amp and kinds - {"cpu:off"}:
            reject(run, "float32 without --amp", f"the Linear layers ran under autocast "
                   f"({', '.join(sorted(kinds))})", "mixed precision only when --amp asks")
        if amp and kinds != {"cpu:bfloat16"}:
            got = ("no autocast on the CPU: the Linear layers ran in float32" if kinds == {"cpu:off"}
                   else f"the Linear layers ran as {', '.join(sorted(kinds))}")
            reject(run, "with --amp on the CPU, bf16 autocast", got,
                   "autocast works on the device type it is given, in the format that device "
                   "runs natively (lesson 06, section 9): train.py's autocast('cuda', ...) does "
                   "nothing on a CPU")


def expect_group_destroyed(run: Run) -> None:
    for rank, process in sorted(run.processes.items()):
        if process.group_alive_at_exit:
            reject(run, "every rank to destroy its process group before it exits",
                   f"rank {rank} exited with its process group still alive",
                   "a group left to Python's shutdown can abort the process after training "
                   "(lesson 04, section 6)")
