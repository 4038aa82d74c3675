"""Lesson 04's DDP training loop as a script: torchrun starts one process per rank and runs it.

    torchrun --standalone --nproc_per_node=2 -m course_lib.examples.ddp_train --epochs 2

torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in each process; main()
joins the process group (NCCL when every local rank has a GPU, gloo otherwise), calls
train_ddp(), and rank 0 reports the losses averaged over the ranks; end_process_group() ends the
backend's threads before Python exits (course_lib/runtime/rank/script_end.py says why).
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
from course_lib.runtime.shared.env import choose_backend, device_for_rank
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model


def train_ddp(epochs=2, global_batch_size=64, lr=0.5):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = device_for_rank()
    dataset = make_dataset(512)
    model = DDP(make_model(seed=0).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    loader = DataLoader(dataset, batch_size=global_batch_size // world_size, sampler=sampler)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for X, y in loader:
            X, y = X.to(device), y.to(device)
            loss = F.cross_entropy(model(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, model.module.cpu()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun --nproc_per_node=N -m course_lib.examples.ddp_train",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--global-batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--losses-json", default=None, help="rank 0 writes the mean losses here")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print("run this script under torchrun, e.g. torchrun --standalone --nproc_per_node=2 "
              "-m course_lib.examples.ddp_train", file=sys.stderr)
        return 2
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    backend, why = choose_backend(local_world_size)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # before NCCL touches any GPU
    dist.init_process_group(backend)
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        devices = [None] * world_size  # rank 0 prints for all: lines printed at once interleave
        dist.all_gather_object(devices, str(device_for_rank()))
        if rank == 0:
            print(f"{world_size} ranks, backend {backend} ({why}), devices {devices}", flush=True)
        losses, _ = train_ddp(args.epochs, args.global_batch_size, args.lr)
        # each rank's loss is on its own shard; the mean over ranks is the global batch's loss
        mean_losses = torch.tensor(losses, device=device_for_rank())
        dist.all_reduce(mean_losses)
        mean_losses = (mean_losses / world_size).tolist()
        if rank == 0:
            steps_per_epoch = len(losses) // args.epochs
            for epoch in range(args.epochs):
                epoch_losses = mean_losses[epoch * steps_per_epoch:(epoch + 1) * steps_per_epoch]
                print(f"epoch {epoch}: {len(epoch_losses)} steps, mean loss "
                      f"{sum(epoch_losses) / len(epoch_losses):.4f}", flush=True)
            if args.losses_json:
                with open(args.losses_json, "w") as file:
                    json.dump(mean_losses, file)
    finally:
        end_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
