"""Gradient accumulation under DDP: `accumulate_with_no_sync`, the loop lesson 05 builds, with one
optimizer step and one all-reduce per `grad_accum_steps` micro-batches (the others inside no_sync).
"""
from contextlib import nullcontext

import torch.nn.functional as F

__all__ = ["accumulate_with_no_sync"]


def accumulate_with_no_sync(ddp_model, optimizer, micro_batches, grad_accum_steps):
    """Train on this rank's micro-batches: one optimizer step, and one all-reduce, per
    grad_accum_steps of them. Returns this rank's loss for every step (the mean over its
    micro-batches, not averaged over the ranks)."""
    losses, step_loss = [], 0.0
    for micro_step, (X, y) in enumerate(micro_batches):
        is_last = (micro_step + 1) % grad_accum_steps == 0
        with nullcontext() if is_last else ddp_model.no_sync():
            loss = F.cross_entropy(ddp_model(X), y) / grad_accum_steps
            loss.backward()
        step_loss += loss.item()
        if is_last:
            optimizer.step()
            optimizer.zero_grad()
            losses.append(step_loss)
            step_loss = 0.0
    return losses
