"""Lesson 14's grader against answers: correct conversions of train.py written differently from
the reference (ALTERNATIVES, each must pass) and the reference with one mistake (WRONG_ANSWERS,
each must be rejected). Each runs under torchrun: SLOW_CHECKS puts them in the slow tier.
"""
import os

from course_lib.checks import lesson14
from test_measured_graders import measured_answer

from . import wrong_answer
from .edited_scripts import (EVERY_RANK_SAVES, LOSS_ALL_REDUCE, NCCL_ON_THE_CPU, NO_PROCESS_GROUP,
                             NO_SYNC, RENAMES_UNSYNCED, SAVES_IN_PLACE, ScriptFile,
                             edited_reference)

# nanoGPT's shape: one flat script, `ddp` from RANK, require_backward_grad_sync set by hand, the
# epoch's losses all-reduced at once and printed at its end, an atomic save, course_lib's helpers.
NANOGPT_STYLE = '''
import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from course_lib import device_for_rank, make_dataset, make_model
from course_lib.runtime.shared.env import choose_backend
from course_lib.training.amp import choose_amp

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--checkpoint", default="checkpoint.pt")
parser.add_argument("--amp", action="store_true")
args = parser.parse_args()

ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group(choose_backend(int(os.environ["LOCAL_WORLD_SIZE"]))[0])
    rank, world_size, device = dist.get_rank(), dist.get_world_size(), device_for_rank()
else:
    rank, world_size = 0, 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
master_process = rank == 0
amp_dtype = torch.bfloat16 if choose_amp(device) == "bf16" else torch.float16
scaler = torch.amp.GradScaler(device.type, enabled=args.amp and amp_dtype == torch.float16)

raw_model = make_model(seed=0).to(device)
optimizer = torch.optim.SGD(raw_model.parameters(), lr=0.2, momentum=0.9)
start_epoch = 0
if os.path.exists(args.checkpoint):
    state = torch.load(args.checkpoint, map_location=device)
    raw_model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    start_epoch = state["epoch"] + 1
model = DistributedDataParallel(raw_model) if ddp else raw_model

dataset = make_dataset(256)
sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
loader = DataLoader(dataset, batch_size=8, sampler=sampler)
gradient_accumulation_steps = 32 // (8 * world_size)
for epoch in range(start_epoch, args.epochs):
    sampler.set_epoch(epoch)
    batches, step_losses = iter(loader), []
    for step in range(len(loader) // gradient_accumulation_steps):
        total = torch.zeros((), device=device)
        for micro_step in range(gradient_accumulation_steps):
            X, y = (t.to(device) for t in next(batches))
            if ddp:
                model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
            with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):
                loss = F.cross_entropy(model(X), y) / gradient_accumulation_steps
            scaler.scale(loss).backward()
            total += loss.detach()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        step_losses.append(total)
    losses = torch.stack(step_losses)
    if ddp:
        dist.all_reduce(losses, op=dist.ReduceOp.SUM)
        losses /= world_size
    if master_process:
        for step, loss in enumerate(losses.tolist()):
            print(f"epoch {epoch} step {step} loss {loss:.6f}")
        partial = args.checkpoint + ".partial"
        with open(partial, "wb") as file:
            torch.save({"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict(), "epoch": epoch}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, args.checkpoint)
    if ddp:
        dist.barrier()

if ddp:
    del model
    gc.collect()
    dist.destroy_process_group()
'''

OTHER_APIS = [  # the reference, with another API for several of its steps
    ("sampler = (DistributedSampler(dataset, seed=SEED) if distributed\n"
     "               else RandomSampler(dataset, generator=order))",
     "sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=SEED)"),
    ("        if distributed:\n            sampler.set_epoch(epoch)  # this epoch's order, the same "
     "on every rank\n        else:\n            order.manual_seed(SEED + epoch)\n",
     "        sampler.set_epoch(epoch)  # also with plain python: one replica, the same order\n"),
    (NO_SYNC, "with contextlib.ExitStack() as stack:\n"
              "                if distributed and not last:\n"
              "                    stack.enter_context(model.no_sync())"),
    (LOSS_ALL_REDUCE, "                if distributed:\n"
                      "                    dist.reduce(step_loss, dst=0)  # only rank 0 prints it\n"
                      "                    step_loss /= world_size\n"),
    ("import gc\n", "import contextlib\nimport gc\n"),
    ('    use_bf16 = device.type == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False)',
     '    use_bf16 = device.type != "cuda" or torch.cuda.get_device_capability(device) >= (8, 0)'),
]

# Correct conversions written differently from the reference, as paths a grader opens (written
# when opened); tests/checks/test_capstone.py grades them too, beside the reference.
ALTERNATIVE_CONVERSIONS = {
    "nanoGPT style": ScriptFile(lambda: NANOGPT_STYLE),
    "other APIs": edited_reference(*OTHER_APIS),
}

# each handed to the grader as the notebook hands train_ddp_path: a str (the check's argument is
# recorded as plain data in class grading), the file written when the test runs
ALTERNATIVES = {
    lesson14.check_capstone: [measured_answer(name, lambda path=path: [os.fspath(path)])
                              for name, path in ALTERNATIVE_CONVERSIONS.items()],
}


# Wrong answers: the reference conversion with one mistake each (test_capstone.py has more, each
# with the message it must get)

SLOW_CHECKS = {lesson14.check_capstone}  # it runs the learner's script under torchrun
WRONG_ANSWERS = {
    lesson14.check_capstone: [
        wrong_answer("DDP without init_process_group on the CPU", edited_reference(NO_PROCESS_GROUP)),
        wrong_answer("NCCL although the ranks have no GPU", edited_reference(NCCL_ON_THE_CPU)),
        wrong_answer("every rank saves the checkpoint", edited_reference(EVERY_RANK_SAVES)),
        wrong_answer("rank 0 overwrites the checkpoint in place", edited_reference(SAVES_IN_PLACE)),
        wrong_answer("renamed before fsync", edited_reference(*RENAMES_UNSYNCED)),
    ],
}
