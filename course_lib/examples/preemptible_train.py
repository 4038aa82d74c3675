"""Lesson 12's SLURM job: DDP training that says where each rank runs, stops cleanly when SLURM
pre-empts it, and resumes from its checkpoint when the job runs again. A batch script runs

    srun torchrun --nnodes=$SLURM_NNODES --nproc_per_node=N ... -m course_lib.examples.preemptible_train \
        --steps 40 --checkpoint-dir checkpoints

Pre-emption (or `--signal=TERM@S` before the time limit) sends SIGTERM to every process of the
job: torchrun's agent passes it to its workers, and SLURM kills what is left KillWait seconds
later. Each rank only notes the signal; after every step the ranks add up their notes in the
all-reduce that averages the loss, so all of them stop after the same step. Rank 0 then saves
the checkpoint atomically (lesson 07) and every rank exits with 143, the status of a process
ended by SIGTERM, so that nothing takes the stop for the end of training. Started again (a
requeued job), the script loads the newest checkpoint and goes on from its step.
"""
import argparse
import gc
import json
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
# torch.distributed.nn keeps the default group as a default argument; DDP's constructor imports it.
# Imported before the group exists it holds none, so destroy_process_group() ends gloo's threads
# and none is left to abort the exit (course_lib/runtime/rank/script_end.py says why).
import torch.distributed.nn  # noqa: F401
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from course_lib.runtime.shared.env import choose_backend, cpu_cores, device_for_rank
from course_lib.training.checkpoint import load_latest_checkpoint, save_checkpoint
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model

PREEMPTED_EXIT = 128 + signal.SIGTERM
SLURM_VARIABLES = ["SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_RESTART_COUNT"]
TORCHRUN_VARIABLES = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"]
stop_requested = []  # the signals this rank received


def say(line):
    """One line in one write: torchrun runs Python unbuffered, and two ranks print at once."""
    print(line + "\n", end="", flush=True)


def note_signal(signum, frame):
    stop_requested.append(signal.Signals(signum).name)  # act between steps, never inside one


def train(steps=40, checkpoint_dir=None, step_seconds=0.0, global_batch_size=32, lr=0.2):
    """DDP training of the course model for `steps` steps; returns the losses averaged over the
    ranks, or None when a signal stopped it (after saving, with a checkpoint_dir)."""
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), device_for_rank()
    dataset, model = make_dataset(512), DDP(make_model(seed=0).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    batch_size = global_batch_size // world_size
    steps_per_epoch = len(sampler) // batch_size
    step, losses = 0, []
    found = load_latest_checkpoint(checkpoint_dir, map_location=device) if checkpoint_dir else None
    if found:  # SGD and no dropout: the model, the optimizer and the step are the whole state
        state, path = found
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, losses = state["step"], state["losses"]
    if rank == 0:
        say(f"[rank 0] resumed from {path.name} at step {step}" if found else "[rank 0] starting at step 0")
    while step < steps:
        epoch, batch = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)  # the same order on every run: shuffled by seed and epoch
        indices = list(sampler)[batch * batch_size:(batch + 1) * batch_size]
        X, y = (tensor[indices].to(device) for tensor in dataset.tensors)
        loss = F.cross_entropy(model(X), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(step_seconds)  # a stand-in for a real model's longer step
        # one all-reduce: the loss summed over ranks, and how many ranks were told to stop
        summed = torch.tensor([loss.item(), float(bool(stop_requested))], device=device)
        dist.all_reduce(summed)
        losses.append(summed[0].item() / world_size)
        step += 1
        if rank == 0:
            say(f"[rank 0] step {step} loss {losses[-1]:.4f}")
        if summed[1].item() > 0 and step < steps:
            if checkpoint_dir:
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                         "step": step, "losses": losses}
                path = save_checkpoint(state, checkpoint_dir, step)  # rank 0 writes; all wait
                if rank == 0:
                    say(f"[rank 0] stopping on {(stop_requested or ['a peer signal'])[0]} after step "
                        f"{step}: saved {path.name}")
            return None
    return losses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="srun torchrun ... -m course_lib.examples.preemptible_train",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-dir", default=None, help="save here on a signal; resume from here")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep in each step")
    parser.add_argument("--losses-json", default=None, help="rank 0 writes the losses here at the end")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print("run this script under torchrun (e.g. srun torchrun --nproc_per_node=2 ... -m "
              "course_lib.examples.preemptible_train)", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, note_signal)
    backend, why = choose_backend(int(os.environ["LOCAL_WORLD_SIZE"]))
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    try:
        say(f"[rank {dist.get_rank()}] on {socket.gethostname()}, {cpu_cores()} CPUs, "
            f"{backend} ({why}), {device_for_rank()}: "
            + " ".join(f"{name}={os.environ.get(name, '-')}"
                       for name in SLURM_VARIABLES + TORCHRUN_VARIABLES))
        losses = train(args.steps, args.checkpoint_dir, args.step_seconds)
        if losses is not None and dist.get_rank() == 0:
            say(f"[rank 0] finished {len(losses)} steps on {dist.get_world_size()} ranks: "
                f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
            if args.losses_json:
                with open(args.losses_json, "w") as file:
                    json.dump(losses, file)
    finally:
        gc.collect()  # free the DDP model (a reference cycle) before its process group (lesson 04)
        dist.destroy_process_group()
    return 0 if losses is not None else PREEMPTED_EXIT


if __name__ == "__main__":
    sys.exit(main())
