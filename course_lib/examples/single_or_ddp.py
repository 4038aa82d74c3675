"""One training script for one device and for torchrun: DDP when torchrun set RANK, plain otherwise.

    python -m course_lib.examples.single_or_ddp                     # one process, one device
    torchrun --standalone --nproc_per_node=2 -m course_lib.examples.single_or_ddp

The lines that differ all test `distributed` (lesson 04, section 6). With a global batch of 64,
both runs train the same model, step for step, as lesson 04's notebook shows.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.runtime.rank.script_end import end_process_group  # before init_process_group()
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model


def setup():
    """(distributed, rank, world_size, device): from torchrun's environment, else one process."""
    if "RANK" not in os.environ:  # plain `python script.py`: no process group at all
        return False, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = device_for_this_process(int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"]))
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)  # binds this process to its GPU
    else:
        dist.init_process_group("gloo")
    return True, dist.get_rank(), dist.get_world_size(), device


def device_for_this_process(local_rank: int, local_world_size: int) -> torch.device:
    """One GPU per process: local rank r takes GPU r when the node's GPUs are all visible, GPU 0
    when a scheduler gave each process its own (CUDA_VISIBLE_DEVICES); the CPU without GPUs."""
    gpus = torch.cuda.device_count()
    if gpus == 0:
        return torch.device("cpu")
    if gpus >= local_world_size:
        return torch.device("cuda", local_rank)
    if gpus == 1:  # its own GPU; if the processes share one, NCCL refuses with 'Duplicate GPU'
        return torch.device("cuda", 0)
    raise RuntimeError(f"{local_world_size} processes on this node but this one sees {gpus} GPUs: "
                       f"NCCL needs one GPU per process; start --nproc_per_node={gpus}, or give "
                       f"each process its own GPU with CUDA_VISIBLE_DEVICES")


def train(distributed, world_size, device, epochs=2, global_batch_size=64, lr=0.5):
    """Lesson 04's loop; returns each step's loss over the whole global batch."""
    dataset = make_dataset(512)
    model = make_model(seed=0).to(device)
    if distributed:
        model = DDP(model)
    sampler = DistributedSampler(dataset, shuffle=False) if distributed else None
    loader = DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for epoch in range(epochs):
        if distributed:
            sampler.set_epoch(epoch)
        for X, y in loader:
            loss = F.cross_entropy(model(X.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.detach())
    losses = torch.stack(losses)
    if distributed:  # each rank's loss is on its shard: the mean over ranks is the global batch's
        dist.all_reduce(losses, op=dist.ReduceOp.SUM)
        losses /= world_size
    return losses.tolist()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--losses-json", default=None, help="rank 0 writes the losses here")
    args = parser.parse_args(argv)
    distributed, rank, world_size, device = setup()
    try:
        losses = train(distributed, world_size, device, epochs=args.epochs)
        if rank == 0:
            print(f"{world_size} process(es) on {device}: {len(losses)} steps, loss "
                  f"{losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
            if args.losses_json:
                with open(args.losses_json, "w") as file:
                    json.dump(losses, file)
    finally:
        if distributed:
            end_process_group()  # gloo's threads end before Python exits (see its module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
