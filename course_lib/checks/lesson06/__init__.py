"""Graders for lesson 06, mixed precision: fp16's range, a correct AMP step, the scaler with
gradient accumulation.

- fp16 round trip: gradients scaled, cast to float16 and back, then unscaled, as a loss scale does.
- AMP step: zero the gradients, forward under float16 autocast, scaled backward, unscale_, clip to
  max_norm in true units, scaler.step, scaler.update; return the unscaled loss; a step whose
  gradients overflow is skipped and halves the scale.
- AMP with gradient accumulation: one optimizer step over several micro-batches, each loss divided
  by their number; unscale_, clip, step and update once; the step after it starts from zero
  gradients (the grader takes two steps in a row), and clipping bites in true units (a step whose
  gradient is twice max_norm, at scale 1024, must move the weights by lr x max_norm).

Every grader runs on the CPU with float16 autocast and torch.amp.GradScaler("cpu"), which torch
supports, so the grades are the same on a laptop and on a GPU node. amp_steps.py runs the
learner's steps beside the correct ones.
"""
import torch

from ..engine import describe, expect, expect_close, grader
from .amp_steps import (LR, accumulation_hint, as_float, call_step, clipping_hint,
                        first_layer_dtypes, fp32_loss_and_grad_norm, reference_amp_step, setup,
                        steps_side_by_side, weights)


# Exercise 1: what fp16 keeps of a gradient, with and without a loss scale.

def reference_fp16_round_trip(grads, scale):
    return (grads * scale).to(torch.float16).to(torch.float32) / scale


def _round_trip_grads():
    # From far below fp16's smallest subnormal (6e-8) up to values that overflow once scaled.
    return torch.cat([torch.logspace(-12, 0, 49), torch.tensor([0.0, -3e-6, 2.0])])


@grader("fp16 round trip")
def check_fp16_round_trip(fp16_round_trip):
    grads = _round_trip_grads()
    for scale in (1.0, 1024.0, 65536.0):
        got = fp16_round_trip(grads.clone(), scale)
        expect(isinstance(got, torch.Tensor) and got.dtype == torch.float32,
               f"fp16_round_trip(grads, {scale:g})", "a float32 tensor",
               f"{type(got).__name__} {getattr(got, 'dtype', '')}",
               "the values come back to the gradients' own dtype, float32, after their trip "
               "through float16")
        expected = reference_fp16_round_trip(grads, scale)
        wrong = ~torch.isclose(got, expected, rtol=1e-6, atol=0.0) if got.shape == grads.shape \
            else torch.ones_like(grads, dtype=torch.bool)
        first = int(wrong.nonzero()[0]) if wrong.any() else 0
        expect(not wrong.any(), f"fp16_round_trip(grads, {scale:g})",
               f"{expected[first].item():.6g} for the gradient {grads[first].item():.6g}",
               f"{got.flatten()[first].item():.6g}" if got.numel() > first else describe(got),
               _round_trip_hint(got, grads, scale))


def _round_trip_hint(got, grads, scale):
    """Which step of the round trip the answer got wrong, judged from the values it returned."""
    if got.shape != grads.shape:
        return f"return one value per gradient: shape {tuple(grads.shape)}"
    unscaled = reference_fp16_round_trip(grads, 1.0)
    if scale != 1.0 and torch.allclose(got, unscaled, rtol=1e-6, atol=0.0, equal_nan=True):
        return (f"your values are what fp16 keeps with no scale at all: the small gradients were "
                f"stored in float16 before they were multiplied by {scale:g}")
    if torch.allclose(got, reference_fp16_round_trip(grads, scale) * scale, rtol=1e-6, atol=0.0,
                      equal_nan=True):
        return f"your values are {scale:g} times the gradients: they come back still scaled"
    return ("the value must go through float16 (not bfloat16 or float32) while it is multiplied "
            "by the scale, and come back in the gradient's own units")


# Exercise 2: one AMP step, amp_step(model, optimizer, scaler, X, y, max_norm).

def _expect_step_like_reference(amp_step, X, y, max_norm, steps, what):
    model, optimizer, _, _ = setup()
    reference, reference_optimizer, _, _ = setup()
    # Scale 1: a large scale would hide stale gradients (they are divided by it at unscale_).
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    reference_scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    for step in range(steps):
        batch = slice(64 * (step % 2), 64 * (step % 2) + 64)
        call_step(amp_step, model, optimizer, scaler, X[batch], y[batch], max_norm)
        reference_amp_step(reference, reference_optimizer, reference_scaler, X[batch], y[batch],
                           max_norm)
        expect_close(weights(model), weights(reference), f"{what}, after step {step + 1}",
                     hint="the steps before matched: this one started from other gradients "
                          "(the previous step's still there?)" if step else
                          "a single step from fresh gradients differs from a correct AMP step",
                     rtol=1e-4, atol=1e-6)


@grader("AMP step")
def check_amp_step(amp_step):
    model, optimizer, X, y = setup()
    X64, y64 = X[:64], y[:64]
    fp32_loss, true_norm = fp32_loss_and_grad_norm(X64, y64)
    max_norm = true_norm / 2  # clipping must bite, measured in true (unscaled) units
    before = weights(model)
    dtypes = first_layer_dtypes(model)
    scaler = torch.amp.GradScaler("cpu")
    loss = as_float(call_step(amp_step, model, optimizer, scaler, X64, y64, max_norm),
                     "the returned loss")

    expect(dtypes == [torch.float16], "the dtype of the first Linear's output",
           "[torch.float16] (one forward under float16 autocast)", str(dtypes),
           "the first Linear did not compute in float16: the forward pass ran outside float16 "
           "autocast" if dtypes else "the model's forward pass never ran")
    scaled = abs(loss - fp32_loss * 65536.0) <= 1e-2 * fp32_loss * 65536.0
    expect_close(loss, fp32_loss, "the returned loss", rtol=1e-2,
                 hint="it is 65536 times the loss: the scaled loss" if scaled else
                      "the cross-entropy of this batch, a float, in its own units")
    update_norm = (weights(model) - before).norm().item()
    expect_close(update_norm, LR * max_norm,
                 f"the size of the SGD update (lr x clipped gradient norm), gradient norm "
                 f"{true_norm:.4g}, max_norm {max_norm:.4g}",
                 clipping_hint(update_norm, max_norm, true_norm, 65536.0), rtol=1e-3)
    expect(scaler.get_scale() == 65536.0, "the scale after a step without inf",
           "65536.0 (unchanged)", str(scaler.get_scale()),
           "the scale changed after a clean step: it was updated more than once, or lowered")

    # A scale this large makes the fp16 gradients overflow: the step must be skipped.
    model, optimizer, X, y = setup()
    before = weights(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    loss = as_float(call_step(amp_step, model, optimizer, scaler, X64, y64, max_norm),
                     "the loss of the overflowing step")
    after = weights(model)
    expect(torch.equal(after, before), "the weights after a step whose gradients overflowed",
           "unchanged (the scaler skips the step)",
           "changed" if after.isfinite().all() else "inf/nan",
           "the gradients held inf at scale 2^20, yet the weights moved: that step went to the "
           "optimizer without the scaler's inf check")
    expect(scaler.get_scale() == 2.0**19, "the scale after a step whose gradients overflowed",
           f"{2.0**19} (halved from {2.0**20})", str(scaler.get_scale()),
           "the scale stayed at 2^20 after an overflow: it was never updated, so the next step "
           "overflows again" if scaler.get_scale() == 2.0**20 else
           "after one overflowing step the scale is halved once")
    expect(abs(loss - fp32_loss) <= 1e-2 * fp32_loss, "the loss of the overflowing step",
           f"about {fp32_loss:.4f} (the loss is finite, only the scaled gradients overflow)",
           str(loss), "the loss of this batch in its own units, not multiplied by the scale")

    _expect_step_like_reference(amp_step, X, y, max_norm, 3,
                                "the weights of 3 AMP steps (vs a correct AMP step)")
    _expect_step_like_reference(amp_step, X, y, 1e3, 1,
                                "the weights of a step that needs no clipping")


# Exercise 3: one optimizer step over several micro-batches, with a scaler.

def _micro_batches(X, y, n=4, size=16):
    return [(X[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(n)]


@grader("AMP with gradient accumulation")
def check_amp_accumulation_step(amp_accumulation_step):
    _, _, X, y = setup()
    micro_batches = _micro_batches(X, y)
    fp32_loss, true_norm = fp32_loss_and_grad_norm(X[:64], y[:64])  # the 4 micro-batches' mean
    start = weights(setup()[0])
    model, reference, losses = steps_side_by_side(amp_accumulation_step, [micro_batches])
    loss = as_float(losses[0], "the returned loss")
    expect_close(weights(model), weights(reference),
                 "the weights after one step over 4 micro-batches (no clipping)",
                 hint=accumulation_hint(weights(model) - start, weights(reference) - start),
                 rtol=1e-4, atol=1e-6)
    # Two steps in a row, with a small scale (a large one would divide leftover gradients away):
    # gradients left over from the first step must not leak into the second.
    model, reference, _ = steps_side_by_side(amp_accumulation_step,
                                             [micro_batches, _micro_batches(X[64:], y[64:])],
                                             init_scale=2.0)
    expect_close(weights(model), weights(reference),
                 "the weights after two steps in a row (scale 2.0)",
                 hint="the first step was right and the second is not: it started from the "
                      "gradients the first step left behind",
                 rtol=1e-4, atol=1e-6)
    expect_close(loss, fp32_loss, "the returned loss (the mean over the 4 micro-batches)",
                 rtol=1e-2, hint=f"it is {loss / fp32_loss:.2f} times the mean of the "
                                 f"micro-batches' losses")

    # Clipping that bites, at a scale that is not 1 (at scale 1, scaled and true units agree):
    # the step's whole gradient, unscaled, must be cut to max_norm.
    max_norm, scale = true_norm / 2, 1024.0
    model, reference, _ = steps_side_by_side(amp_accumulation_step, [micro_batches],
                                             init_scale=scale, max_norm=max_norm)
    update_norm = (weights(model) - start).norm().item()
    expect_close(update_norm, LR * max_norm,
                 f"the size of the SGD update (lr x clipped gradient norm), the step's gradient "
                 f"norm {true_norm:.4g}, max_norm {max_norm:.4g}, scale {scale:g}",
                 clipping_hint(update_norm, max_norm, true_norm, scale), rtol=1e-3)
    expect_close(weights(model), weights(reference),
                 "the weights after one clipped step over 4 micro-batches",
                 hint="the update has the right size but not the right direction: clip the "
                      "gradient of the whole step, all micro-batches summed", rtol=1e-4, atol=1e-6)

    # Only the last micro-batch overflows: the whole step must be skipped, the scale halved once.
    model, optimizer, _, _ = setup()
    before = weights(model)
    scaler = torch.amp.GradScaler("cpu")
    exploding = (micro_batches[-1][0] * 1e6, micro_batches[-1][1])
    call_step(amp_accumulation_step, model, optimizer, scaler, micro_batches[:-1] + [exploding], 1e3)
    expect(torch.equal(weights(model), before),
           "the weights after a step whose last micro-batch overflowed",
           "unchanged (one inf anywhere skips the whole step)", "changed",
           "the last micro-batch's gradients held inf, yet the weights moved: a step was taken "
           "before that micro-batch, or without the scaler's inf check")
    expect(scaler.get_scale() == 32768.0, "the scale after one skipped step",
           "32768.0 (halved once)", str(scaler.get_scale()),
           f"{65536.0 / scaler.get_scale():g} = 65536 / your scale: the scale must be halved "
           f"once per skipped optimizer step")
