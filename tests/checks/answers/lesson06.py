"""Lesson 06's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""

import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import lesson06


from . import answer, wrong_answer  # noqa: F401


def round_trip_with_half_and_float(grads, scale):
    return grads.mul(scale).half().float().div(scale)


def round_trip_through_numpy(grads, scale):
    with np.errstate(over="ignore"):  # large values overflow to inf, as in the cast to fp16
        scaled = (grads.numpy() * np.float32(scale)).astype(np.float16)
    return torch.from_numpy(scaled.astype(np.float32) / np.float32(scale))


def amp_step_with_amp_autocast(model, optimizer, scaler, X, y, max_norm):
    for parameter in model.parameters():
        parameter.grad = None
    with torch.amp.autocast("cpu", dtype=torch.float16):
        logits = model(X)
        loss = F.cross_entropy(logits, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    torch.nn.utils.clip_grad_norm_(parameters, max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach())


def amp_step_zeroing_after_the_step(model, optimizer, scaler, X, y, max_norm):
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = F.cross_entropy(model(X), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    model.zero_grad()  # ready for the next step
    return loss.detach()  # a 0-dim tensor


def amp_accumulation_zeroing_at_the_end(model, optimizer, scaler, micro_batches, max_norm):
    losses = []
    for X, y in micro_batches:
        with torch.autocast(device_type=X.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(X), y)
        scaler.scale(loss / len(micro_batches)).backward()
        losses.append(loss.detach().float())
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return torch.stack(losses).mean().item()


def amp_accumulation_weighted_by_samples(model, optimizer, scaler, micro_batches, max_norm):
    model.zero_grad(set_to_none=True)
    samples = sum(len(X) for X, _ in micro_batches)
    total = 0.0
    for X, y in micro_batches:
        with torch.autocast(device_type=X.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(X), y, reduction="sum") / samples
        scaler.scale(loss).backward()
        total += loss.item()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total


def amp_accumulation_clipping_by_hand(model, optimizer, scaler, micro_batches, max_norm):
    # clips by hand after unscale_, with torch.linalg norms; returns a 0-dim tensor
    for parameter in model.parameters():
        parameter.grad = None
    losses = []
    for X, y in micro_batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(X), y)
        scaler.scale(loss * (1 / len(micro_batches))).backward()
        losses.append(loss.detach())
    scaler.unscale_(optimizer)
    grads = [p.grad for p in model.parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for grad in grads:
        grad.mul_(factor)
    scaler.step(optimizer)
    scaler.update()
    return torch.stack(losses).mean()


ALTERNATIVES = {
    lesson06.check_fp16_round_trip: [
        answer(".half() and .float()", round_trip_with_half_and_float),
        answer("through numpy", round_trip_through_numpy),
    ],
    lesson06.check_amp_step: [
        answer("torch.amp.autocast, grads set to None by hand", amp_step_with_amp_autocast),
        answer("zeroes after the step, returns a tensor", amp_step_zeroing_after_the_step),
    ],
    lesson06.check_amp_accumulation_step: [
        answer("zeroes at the end, mean of losses", amp_accumulation_zeroing_at_the_end),
        answer("summed losses over all samples", amp_accumulation_weighted_by_samples),
        answer("clips by hand after unscale_, a tensor loss", amp_accumulation_clipping_by_hand),
    ],
}
