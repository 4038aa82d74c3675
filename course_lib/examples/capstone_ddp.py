# Step 1: start from train.py, below; then change it step by step
"""The capstone's answer: train.py converted to DDP, one file for torchrun and for plain python.

    torchrun --standalone --nproc_per_node=2 train_ddp.py   # 2 ranks: NCCL on 2 GPUs, else gloo
    python train_ddp.py                                     # one process on one device, as train.py

Every optimizer step still sees GLOBAL_BATCH_SIZE samples, whatever the number of ranks: each
rank accumulates GLOBAL_BATCH_SIZE // (MICRO_BATCH_SIZE * world_size) micro-batches per step.
"""
import argparse
import gc
import os
from contextlib import nullcontext

import torch
import torch.distributed as dist
# Step 2: import what DDP needs
# (not a step: imported before init_process_group, torch.distributed.nn keeps no reference to the
# group; a workaround for a detail of torch 2.13, see course_lib/runtime/rank/script_end.py)
import torch.distributed.nn  # noqa: F401
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from course_lib import make_dataset, make_model
from course_lib.training.checkpoint import write_atomically  # temporary file, fsync, rename

SAMPLES = 256
GLOBAL_BATCH_SIZE = 32  # samples per optimizer step, over all ranks
MICRO_BATCH_SIZE = 8    # samples per forward and backward, on each rank
LR, MOMENTUM, SEED = 0.2, 0.9, 0


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="train until this many epochs are done")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="saved every epoch, resumed from")
    parser.add_argument("--amp", action="store_true", help="mixed precision")
    return parser.parse_args()


def setup():
    """(distributed, rank, world_size, device): torchrun's environment when it set RANK."""
    # Step 3: with plain python (no RANK) train as train.py did: one process, one device
    if "RANK" not in os.environ:
        return False, 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Step 4: under torchrun join the process group: NCCL with a GPU per rank (LOCAL_RANK), else gloo
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.device_count() >= int(os.environ["LOCAL_WORLD_SIZE"]):
        torch.cuda.set_device(local_rank)  # before NCCL touches a GPU
        dist.init_process_group("nccl")
        return True, dist.get_rank(), dist.get_world_size(), torch.device("cuda", local_rank)
    dist.init_process_group("gloo")
    return True, dist.get_rank(), dist.get_world_size(), torch.device("cpu")


def precision_for(device, amp):
    """(autocast dtype, GradScaler): by what the device computes in natively (lesson 06)."""
    # Step 5: mixed precision by capability: bf16 on CPUs and GPUs from Ampere on, else fp16 + scaler
    use_bf16 = device.type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)
    amp_dtype = torch.bfloat16 if use_bf16 else torch.float16
    return amp_dtype, torch.amp.GradScaler(device.type, enabled=amp and amp_dtype == torch.float16)


def train(args, distributed, rank, world_size, device):
    model = make_model(seed=0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    amp_dtype, scaler = precision_for(device, args.amp)

    start_epoch = 0
    if os.path.exists(args.checkpoint):
        # Step 6: every rank resumes, into the model before DDP wraps it
        checkpoint = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        start_epoch = checkpoint["epoch"] + 1
    # Step 7: wrap the model in DDP
    if distributed:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    # Step 8: each rank its share of every epoch: a DistributedSampler, set_epoch(epoch) each epoch
    dataset = make_dataset(SAMPLES)
    order = torch.Generator()
    sampler = (DistributedSampler(dataset, seed=SEED) if distributed
               else RandomSampler(dataset, generator=order))
    loader = DataLoader(dataset, batch_size=MICRO_BATCH_SIZE, sampler=sampler)
    # Step 9: GLOBAL_BATCH_SIZE samples per step over all ranks: fewer micro-batches on each rank
    if GLOBAL_BATCH_SIZE % (MICRO_BATCH_SIZE * world_size):
        raise ValueError(f"{GLOBAL_BATCH_SIZE} samples per step cannot be split in micro-batches "
                         f"of {MICRO_BATCH_SIZE} on {world_size} ranks")
    grad_accum_steps = GLOBAL_BATCH_SIZE // (MICRO_BATCH_SIZE * world_size)

    for epoch in range(start_epoch, args.epochs):
        if distributed:
            sampler.set_epoch(epoch)  # this epoch's order, the same on every rank
        else:
            order.manual_seed(SEED + epoch)
        step_loss = torch.zeros((), device=device)
        for micro_step, (X, y) in enumerate(loader):
            X, y = X.to(device), y.to(device)
            last = (micro_step + 1) % grad_accum_steps == 0
            # Step 10: all-reduce the gradients once per step: no_sync on all micro-batches but the last
            with model.no_sync() if distributed and not last else nullcontext():
                with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                    loss = F.cross_entropy(model(X), y) / grad_accum_steps
                scaler.scale(loss).backward()
            step_loss += loss.detach()
            if last:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                # Step 11: log the global batch's loss (the mean over the ranks), on rank 0 only
                if distributed:
                    dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)
                if rank == 0:
                    print(f"epoch {epoch} step {micro_step // grad_accum_steps} "
                          f"loss {step_loss.item():.6f}", flush=True)
                step_loss.zero_()
        # Step 12: rank 0 alone saves, the model without its DDP wrapper, atomically (lesson 07)
        if rank == 0:
            unwrapped = model.module if distributed else model
            write_atomically({"model": unwrapped.state_dict(), "optimizer": optimizer.state_dict(),
                              "scaler": scaler.state_dict(), "epoch": epoch}, args.checkpoint)
            print(f"epoch {epoch} saved {args.checkpoint}", flush=True)


def main():
    args = parse_args()
    distributed, rank, world_size, device = setup()
    try:
        train(args, distributed, rank, world_size, device)
    finally:
        # Step 13: shut down: destroy the process group
        if distributed:
            gc.collect()  # not a step: frees the DDP wrapper's reference cycle first (script_end.py)
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
