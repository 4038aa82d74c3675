"""Lesson 05's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import statistics
from contextlib import ExitStack

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import lesson05


from . import answer, wrong_answer  # noqa: F401


def accumulation_grouped_with_exit_stack(ddp_model, optimizer, micro_batches, grad_accum_steps):
    losses = []
    groups = zip(*[iter(micro_batches)] * grad_accum_steps)
    for group in groups:
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for index, (X, y) in enumerate(group):
            with ExitStack() as stack:
                if index < grad_accum_steps - 1:
                    stack.enter_context(ddp_model.no_sync())
                loss = F.cross_entropy(ddp_model(X), y).div(grad_accum_steps)
                loss.backward()
            total += loss.detach()
        optimizer.step()
        losses.append(total)  # 0-dim tensors: float() of each gives the number
    return losses


def accumulation_by_mean_of_losses(ddp_model, optimizer, micro_batches, grad_accum_steps):
    losses, pending = [], []
    for X, y in micro_batches:
        pending.append((X, y))
        if len(pending) < grad_accum_steps:
            continue
        values = []
        with ddp_model.no_sync():
            for X_micro, y_micro in pending[:-1]:
                loss = F.cross_entropy(ddp_model(X_micro), y_micro)
                (loss * (1 / grad_accum_steps)).backward()
                values.append(loss.item())
        loss = F.cross_entropy(ddp_model(pending[-1][0]), pending[-1][1])
        (loss * (1 / grad_accum_steps)).backward()
        values.append(loss.item())
        optimizer.step()
        for parameter in ddp_model.parameters():
            parameter.grad = None
        losses.append(statistics.fmean(values))
        pending = []
    return losses


def accumulation_around_ddp(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """The first micro-batches through the wrapped module itself, which DDP never sees (so no
    hook, no all-reduce); the last through DDP, whose backward all-reduces the sum."""
    losses, step_loss = [], 0.0
    for micro_step, (X, y) in enumerate(micro_batches):
        last = micro_step % grad_accum_steps == grad_accum_steps - 1
        model = ddp_model if last else ddp_model.module
        loss = F.cross_entropy(model(X), y)
        loss.mul(1 / grad_accum_steps).backward()
        step_loss += loss.item() / grad_accum_steps
        if last:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(np.float32(step_loss))
            step_loss = 0.0
    return losses


ALTERNATIVES = {
    lesson05.check_train_with_accumulation: [
        answer("groups with an ExitStack, tensor losses", accumulation_grouped_with_exit_stack),
        answer("buffers a group, mean of undivided losses", accumulation_by_mean_of_losses),
        answer("the first micro-batches around DDP, through its module, numpy losses",
               accumulation_around_ddp),
    ],
}
