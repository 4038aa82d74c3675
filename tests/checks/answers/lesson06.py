"""Lesson 06's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import numpy as np
import torch
import torch.nn.functional as F

from course_lib.checks import lesson06
from course_lib.checks.lesson06.amp_steps import reference_amp_step

from . import answer, wrong_answer


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


# Wrong answers

def round_trip_without_scale(grads, scale):
    return grads.to(torch.float16).to(torch.float32)


def round_trip_not_unscaled(grads, scale):
    return (grads * scale).to(torch.float16).to(torch.float32)


def round_trip_scaled_after_cast(grads, scale):
    return grads.to(torch.float16).to(torch.float32) * scale / scale


def round_trip_in_place(grads, scale):
    grads.mul_(scale)  # the caller's gradients, scaled for good
    return grads.half().float() / scale


def round_trip_in_bfloat16(grads, scale):
    return (grads * scale).to(torch.bfloat16).to(torch.float32) / scale


def amp_step_variant(autocast=True, zero_grad=True, scale=True, unscale=True,
                     scaler_step=True, update=True, return_scaled=False, clip_to="max_norm"):
    """reference_amp_step with one part missing or done wrong."""
    def amp_step(model, optimizer, scaler, X, y, max_norm):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=X.device.type, dtype=torch.float16, enabled=autocast):
            loss = F.cross_entropy(model(X), y)
        scaled = scaler.scale(loss) if scale else loss
        scaled.backward()
        if unscale:
            scaler.unscale_(optimizer)
        if clip_to is not None:  # a fixed number, or max_norm
            torch.nn.utils.clip_grad_norm_(model.parameters(),
                                           max_norm if clip_to == "max_norm" else clip_to)
        scaler.step(optimizer) if scaler_step else optimizer.step()
        if update:
            scaler.update()
        return (scaled if return_scaled else loss).item()

    return amp_step


def accumulation_steps_every_micro_batch(model, optimizer, scaler, micro_batches, max_norm):
    total = 0.0
    for X, y in micro_batches:
        total += reference_amp_step(model, optimizer, scaler, X, y, max_norm) / len(micro_batches)
    return total


def accumulation_variant(divide=True, zero_every_micro_batch=False, zero_grad=True, clip="after",
                         unscale_every_micro_batch=False, count=None):
    """reference_amp_accumulation_step with one mistake. `clip`: "after" unscale_ (right),
    "before" unscale_, "every micro-batch" (the scaled partial sums), or None; `count`: the
    number of micro-batches written in, not len(micro_batches)."""
    def amp_accumulation_step(model, optimizer, scaler, micro_batches, max_norm):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for X, y in micro_batches:
            if zero_every_micro_batch:
                optimizer.zero_grad(set_to_none=True)  # wipes the micro-batches before this one
            with torch.autocast(device_type=X.device.type, dtype=torch.float16):
                loss = F.cross_entropy(model(X), y) / ((count or len(micro_batches)) if divide
                                                       else 1)
            scaler.scale(loss).backward()
            if unscale_every_micro_batch:
                scaler.unscale_(optimizer)
            if clip == "every micro-batch":
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            total += loss.item() / (1 if divide else len(micro_batches))
        if clip == "before":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        if not unscale_every_micro_batch:
            scaler.unscale_(optimizer)
        if clip == "after":
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return total

    return amp_accumulation_step


def accumulation_clipping_scaled_by_hand(model, optimizer, scaler, micro_batches, max_norm):
    """Never calls unscale_: scaler.step unscales, after the clip saw the scaled gradients."""
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for X, y in micro_batches:
        with torch.autocast(device_type=X.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(X), y) / len(micro_batches)
        scaler.scale(loss).backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total


WRONG_ANSWERS = {
    lesson06.check_fp16_round_trip: [
        wrong_answer("casts to fp16 without the scale", round_trip_without_scale),
        wrong_answer("forgets to divide by the scale", round_trip_not_unscaled),
        wrong_answer("scales after the cast, too late", round_trip_scaled_after_cast),
        wrong_answer("uses bfloat16 instead of float16", round_trip_in_bfloat16),
        wrong_answer("scales the caller's gradients in place (mul_)", round_trip_in_place),
    ],
    lesson06.check_amp_step: [
        wrong_answer("clips before unscale_", amp_step_variant(unscale=False)),
        wrong_answer("no scaler: plain backward and optimizer.step",
                     amp_step_variant(scale=False, unscale=False, scaler_step=False,
                                      update=False)),
        wrong_answer("forgets scaler.update()", amp_step_variant(update=False)),
        wrong_answer("optimizer.step() instead of scaler.step()",
                     amp_step_variant(scaler_step=False)),
        wrong_answer("no autocast", amp_step_variant(autocast=False)),
        wrong_answer("never zeroes the gradients", amp_step_variant(zero_grad=False)),
        wrong_answer("returns the scaled loss", amp_step_variant(return_scaled=True)),
        wrong_answer("never clips", amp_step_variant(clip_to=None)),
        wrong_answer("clips to a fixed 1.0, not max_norm", amp_step_variant(clip_to=1.0)),
    ],
    lesson06.check_amp_accumulation_step: [
        wrong_answer("steps after every micro-batch", accumulation_steps_every_micro_batch),
        wrong_answer("does not divide the loss by the micro-batch count",
                     accumulation_variant(divide=False)),
        wrong_answer("divides the loss by 4, the notebook's micro-batch count",
                     accumulation_variant(count=4)),
        wrong_answer("zeroes the gradients before every micro-batch",
                     accumulation_variant(zero_every_micro_batch=True)),
        wrong_answer("never zeroes the gradients: the next step adds the last one's",
                     accumulation_variant(zero_grad=False)),
        wrong_answer("never clips: max_norm is ignored", accumulation_variant(clip=None)),
        wrong_answer("clips before unscale_ (max_norm in scaled units)",
                     accumulation_variant(clip="before")),
        wrong_answer("clips the scaled gradients after every micro-batch",
                     accumulation_variant(clip="every micro-batch")),
        wrong_answer("unscale_ and clip after every micro-batch",
                     accumulation_variant(clip="every micro-batch",
                                          unscale_every_micro_batch=True)),
        wrong_answer("no unscale_: clips, then scaler.step unscales",
                     accumulation_clipping_scaled_by_hand),
    ],
}
