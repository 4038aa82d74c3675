"""Lesson 12's elastic job: DDP training that resumes from its last checkpoint, and whose rank 1
dies once, in step 7 of the first run, as a failing node would. Every node runs

    torchrun --nnodes=2 --nproc_per_node=1 --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT \
        --rdzv_id=JOB --max_restarts=1 -m course_lib.examples.elastic_train

in a folder every node sees: checkpoints/ holds the checkpoints, crashed_once marks that the
crash happened (so the restarted run does not crash again), and rank 0 writes its losses to
losses.json at the end.
"""
import gc
import json
import os
from pathlib import Path

import torch.distributed as dist
import torch.nn.functional as F

from course_lib import TrainConfig, Trainer, make_dataset, make_model

CRASH_RANK, CRASH_STEP = 1, 7


def say(line):
    """Print one line in one write: torchrun runs Python unbuffered, where print's text and its
    newline are two writes, and the lines of two ranks printing at once could merge."""
    print(line + "\n", end="", flush=True)


def crash_once(rank):
    """The usual loss, except that rank CRASH_RANK dies in step CRASH_STEP of the first run."""
    crashed_before, steps_started = Path("crashed_once"), 0

    def loss_fn(output, target):
        nonlocal steps_started
        steps_started += 1
        if rank == CRASH_RANK and steps_started == CRASH_STEP and not crashed_before.exists():
            crashed_before.touch()
            say(f"[rank {rank}] crashing in step {CRASH_STEP}")
            os._exit(1)  # no exception, no cleanup: the process is gone, as with a lost node
        return F.cross_entropy(output, target)

    return loss_fn


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = TrainConfig(strategy="ddp", batch_size=16, max_steps=10, checkpoint_dir="checkpoints",
                         checkpoint_every=4, resume=True, progress=False, seed=0)
    trainer = Trainer(make_model(seed=0), make_dataset(512), config, loss_fn=crash_once(rank))
    say(f"[rank {rank}] starting at step {trainer.global_step}")
    history = trainer.fit()
    say(f"[rank {rank}] finished at step {trainer.global_step}")
    if rank == 0:
        Path("losses.json").write_text(json.dumps(history.losses))
    del trainer   # it holds the DDP wrapper, which holds the group: free both first, or gloo's
    gc.collect()  # threads outlive destroy_process_group() and can abort the exit (lesson 04)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
