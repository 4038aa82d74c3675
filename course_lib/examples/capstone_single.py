"""Train the course's model on one device, a checkpoint every epoch: the capstone's starting point.

    python train.py            # 3 epochs; resumes from checkpoint.pt when an earlier run left one
    python train.py --amp      # mixed precision, written for one (older) GPU: fp16 with a GradScaler

Every optimizer step sees GLOBAL_BATCH_SIZE samples, accumulated over micro-batches of
MICRO_BATCH_SIZE. Each epoch shuffles with its own seed, so a resumed run sees the same order.
"""
import argparse
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler

from course_lib import make_dataset, make_model

SAMPLES = 256
GLOBAL_BATCH_SIZE = 32  # samples per optimizer step
MICRO_BATCH_SIZE = 8    # samples per forward and backward
LR, MOMENTUM, SEED = 0.2, 0.9, 0


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="train until this many epochs are done")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="saved every epoch, resumed from")
    parser.add_argument("--amp", action="store_true", help="mixed precision")
    return parser.parse_args()


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = make_model(seed=0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    use_amp = args.amp and device.type == "cuda"  # fp16, the format of the GPU this was written on
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)

    start_epoch = 0
    if os.path.exists(args.checkpoint):  # resume: the state at the end of the last saved epoch
        checkpoint = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        start_epoch = checkpoint["epoch"] + 1

    dataset = make_dataset(SAMPLES)
    order = torch.Generator()
    loader = DataLoader(dataset, batch_size=MICRO_BATCH_SIZE,
                        sampler=RandomSampler(dataset, generator=order))
    grad_accum_steps = GLOBAL_BATCH_SIZE // MICRO_BATCH_SIZE

    for epoch in range(start_epoch, args.epochs):
        order.manual_seed(SEED + epoch)  # this epoch's order, the same in a resumed run
        step_loss = torch.zeros((), device=device)
        for micro_step, (X, y) in enumerate(loader):
            X, y = X.to(device), y.to(device)
            with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
                loss = F.cross_entropy(model(X), y) / grad_accum_steps
            scaler.scale(loss).backward()
            step_loss += loss.detach()
            if (micro_step + 1) % grad_accum_steps == 0:  # a step's last micro-batch
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                print(f"epoch {epoch} step {micro_step // grad_accum_steps} "
                      f"loss {step_loss.item():.6f}", flush=True)
                step_loss.zero_()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "epoch": epoch}, args.checkpoint)
        print(f"epoch {epoch} saved {args.checkpoint}", flush=True)


if __name__ == "__main__":
    main()
