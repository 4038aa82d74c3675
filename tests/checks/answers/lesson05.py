"""Lesson 05's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import statistics
from contextlib import ExitStack, nullcontext

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib.checks import lesson05
from course_lib.topics.accumulation import accumulate_off_by_one, accumulate_with_no_sync

from . import answer, wrong_answer


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
        losses.append(total.item())
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
        answer("groups with an ExitStack, losses summed detached", accumulation_grouped_with_exit_stack),
        answer("buffers a group, mean of undivided losses", accumulation_by_mean_of_losses),
        answer("the first micro-batches around DDP, through its module, numpy losses",
               accumulation_around_ddp),
    ],
}


# Wrong answers

def flawed(divide=True, sync_on="last", forward_outside_no_sync=False, losses_as="floats"):
    """The reference loop with one mistake. losses_as: "floats", or each step's loss a 0-dim
    "detached tensor", or a "tensor with its graph" (every micro-batch's graph kept alive)."""

    def loop(ddp_model, optimizer, micro_batches, grad_accum_steps):
        losses, step_loss = [], 0.0
        for micro_step, (X, y) in enumerate(micro_batches):
            # "first": the off-by-one, micro_step % grad_accum_steps == 0 (the first of a group)
            steps_now = micro_step % grad_accum_steps == (0 if sync_on == "first"
                                                          else grad_accum_steps - 1)
            syncs = {"last": steps_now, "first": steps_now, "every": True, "never": False}[sync_on]
            context = nullcontext() if syncs else ddp_model.no_sync()
            if forward_outside_no_sync:  # DDP decides in forward: this backward syncs anyway
                loss = F.cross_entropy(ddp_model(X), y)
                with context:
                    (loss / grad_accum_steps if divide else loss).backward()
            else:
                with context:
                    loss = F.cross_entropy(ddp_model(X), y)
                    (loss / grad_accum_steps if divide else loss).backward()
            share = loss / grad_accum_steps
            step_loss += {"floats": share.item(), "detached tensor": share.detach(),
                          "tensor with its graph": share}[losses_as]
            if steps_now:
                optimizer.step()
                optimizer.zero_grad()
                losses.append(step_loss)
                step_loss = 0.0
        return losses

    return loop


def returns_the_global_loss(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """Right training, but each step's loss all-reduced: the global batch's, not this rank's."""
    losses = flawed()(ddp_model, optimizer, micro_batches, grad_accum_steps)
    global_losses = torch.tensor(losses)
    dist.all_reduce(global_losses)
    return (global_losses / dist.get_world_size()).tolist()


def one_forward_per_step(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """The step's micro-batches concatenated into one forward: right weights, one all-reduce,
    but the memory of the whole group at once, which is what accumulation avoids."""
    losses = []
    for start in range(0, len(micro_batches), grad_accum_steps):
        group = micro_batches[start:start + grad_accum_steps]
        X, y = torch.cat([X for X, _ in group]), torch.cat([y for _, y in group])
        loss = F.cross_entropy(ddp_model(X), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def syncs_the_first_micro_batch_too(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """Right weights and one all-reduce per step is not what this does: micro-batch 1 of every
    step also syncs (the context entered for micro-batches 2 to k-1 only)."""
    losses, step_loss = [], 0.0
    for micro_step, (X, y) in enumerate(micro_batches):
        position = micro_step % grad_accum_steps
        context = ddp_model.no_sync() if 0 < position < grad_accum_steps - 1 else nullcontext()
        with context:
            loss = F.cross_entropy(ddp_model(X), y) / grad_accum_steps
            loss.backward()
        step_loss += loss.item()
        if position == grad_accum_steps - 1:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(step_loss)
            step_loss = 0.0
    return losses


def through_the_course_helper(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """The course's loop, through the private helper its two public loops share."""
    from course_lib.topics.accumulation import _accumulate
    return _accumulate(ddp_model, optimizer, micro_batches, grad_accum_steps,
                       is_last=lambda micro_step: (micro_step + 1) % grad_accum_steps == 0)


def loop_stub(ddp_model, optimizer, micro_batches, grad_accum_steps):
    raise NotImplementedError("Exercise: write this part, then run the check cell below")


WRONG_ANSWERS = {
    lesson05.check_train_with_accumulation: [
        wrong_answer("does not divide the loss by grad_accum_steps", flawed(divide=False)),
        wrong_answer("syncs on every micro-batch (right weights, too many all-reduces)",
                     flawed(sync_on="every")),
        wrong_answer("no_sync around the backward only",
                     flawed(forward_outside_no_sync=True)),
        wrong_answer("syncs and steps on the first micro-batch instead of the last",
                     flawed(sync_on="first")),
        wrong_answer("no_sync on every micro-batch: never syncs", flawed(sync_on="never")),
        wrong_answer("returns the loss all-reduced over the ranks, not this rank's",
                     returns_the_global_loss),
        wrong_answer("calls the course's accumulate_with_no_sync", accumulate_with_no_sync),
        wrong_answer("calls the course's loop through its private helper", through_the_course_helper),
        wrong_answer("the course's off-by-one demo (section 5)", accumulate_off_by_one),
        wrong_answer("one forward of the whole group per step", one_forward_per_step),
        wrong_answer("syncs on the first micro-batch of each step too",
                     syncs_the_first_micro_batch_too),
        wrong_answer("the stub", loop_stub),
        wrong_answer("returns 0-dim tensors, detached", flawed(losses_as="detached tensor")),
        wrong_answer("returns the summed loss tensors, their graphs kept",
                     flawed(losses_as="tensor with its graph")),
    ],
}
