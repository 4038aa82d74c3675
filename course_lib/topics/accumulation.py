"""Gradient accumulation under DDP: `accumulate_with_no_sync`, the loop lesson 05 builds, with one
optimizer step and one all-reduce per `grad_accum_steps` micro-batches (the others inside no_sync);
and `accumulate_off_by_one`, the same loop with the off-by-one lesson 05 shows, for its demo.
"""
from contextlib import nullcontext

import torch.nn.functional as F

__all__ = ["accumulate_with_no_sync", "accumulate_off_by_one"]


def accumulate_with_no_sync(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """Train on this rank's micro-batches: one optimizer step, and one all-reduce, per
    grad_accum_steps of them. Returns this rank's loss for every step (the mean over its
    micro-batches, not averaged over the ranks)."""
    return _accumulate(ddp_model, optimizer, micro_batches, grad_accum_steps,
                       is_last=lambda micro_step: (micro_step + 1) % grad_accum_steps == 0)


def accumulate_off_by_one(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """The same loop with one line wrong: `micro_step % grad_accum_steps == 0` is true on the
    FIRST micro-batch of each group, so it syncs and steps there (lesson 05, section 5)."""
    return _accumulate(ddp_model, optimizer, micro_batches, grad_accum_steps,
                       is_last=lambda micro_step: micro_step % grad_accum_steps == 0)


def _accumulate(ddp_model, optimizer, micro_batches, grad_accum_steps, is_last):
    """The loop: sync and step after each micro-step for which is_last(micro_step) holds."""
    losses, step_loss = [], 0.0
    for micro_step, (X, y) in enumerate(micro_batches):
        last = is_last(micro_step)
        with nullcontext() if last else ddp_model.no_sync():
            loss = F.cross_entropy(ddp_model(X), y) / grad_accum_steps
            loss.backward()
        step_loss += loss.item()
        if last:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(step_loss)
            step_loss = 0.0
    return losses
