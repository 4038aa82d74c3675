"""Graders for lesson 06, mixed precision: fp16's range, a correct AMP step, the scaler with
gradient accumulation.

- fp16 round trip: gradients scaled, cast to float16 and back, then unscaled, as a loss scale does;
  the gradients passed in are left as they were.
- AMP step: zero the gradients, forward under float16 autocast, scaled backward, unscale_, clip to
  max_norm in true units, scaler.step, scaler.update; return the unscaled loss; a step whose
  gradients overflow is skipped and halves the scale.
- AMP with gradient accumulation: one optimizer step over several micro-batches (4, then 3), each
  loss divided by their number; unscale_, clip, step and update once; the step after it starts from
  zero gradients (the grader takes two steps in a row), and clipping bites in true units (a step
  whose gradient is twice max_norm, at scale 1024, must move the weights by lr x max_norm).

Every grader runs on the CPU with float16 autocast and torch.amp.GradScaler("cpu"), which torch
supports, so the grades are the same on a laptop and on a GPU node. amp_steps.py runs the
learner's steps (each run a crossing that returns weights, losses and the scale as plain data) and
the correct ones, on the grader's side, from the same start; the data and the model's weights come
from grading_seed, and the round trip's gradients include 8 drawn from it.
"""
import torch

from ..engine import describe, expect, expect_close, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import call_learner
from .amp_steps import (LR, accumulation_hint, as_float, clipping_hint, expect_no_refusal,
                        fp32_loss_and_grad_norm, observe_steps, reference_amp_accumulation_step,
                        reference_amp_step, reference_weights, setup, weights)

AMP_STEP_CALL = "amp_step(model, optimizer, scaler, X, y, max_norm)"
ACCUMULATION_CALL = "amp_accumulation_step(model, optimizer, scaler, micro_batches, max_norm)"


# Exercise 1: what fp16 keeps of a gradient, with and without a loss scale.

def reference_fp16_round_trip(grads, scale):
    return (grads * scale).to(torch.float16).to(torch.float32) / scale


def _round_trip_grads():
    # From far below fp16's smallest subnormal (6e-8) up to values that overflow once scaled, then
    # 8 drawn from grading_seed, between 1e-10 and 1, of either sign.
    generator = torch.Generator().manual_seed(grading_seed(0))
    drawn = 10 ** (-10 * torch.rand(8, generator=generator))
    drawn = drawn * torch.where(torch.rand(8, generator=generator) < 0.5, -1.0, 1.0)
    return torch.cat([torch.logspace(-12, 0, 49), torch.tensor([0.0, -3e-6, 2.0]), drawn])


ROUND_TRIP_SCALES = (1.0, 1024.0, 65536.0)


def _round_trips(fp16_round_trip, grads):
    """On the learner's side: for each scale, the tensor returned (None if it is not a tensor) and
    what it is (type and dtype)."""
    observed = []
    for scale in ROUND_TRIP_SCALES:
        passed = grads.clone()
        got = fp16_round_trip(passed, scale)
        tensor = isinstance(got, torch.Tensor)
        observed.append({"tensor": got.detach().as_subclass(torch.Tensor) if tensor else None,
                         "shown": f"{type(got).__name__} {getattr(got, 'dtype', '')}",
                         "described": describe(got), "grads_after": passed})
    return observed


@grader("fp16 round trip")
def check_fp16_round_trip(fp16_round_trip):
    grads = _round_trip_grads()
    answers = call_learner(_round_trips, fp16_round_trip, grads,
                           what="fp16_round_trip(grads, scale)")
    for scale, answer in zip(ROUND_TRIP_SCALES, answers):
        got = answer["tensor"]
        expect(got is not None and got.dtype == torch.float32,
               f"fp16_round_trip(grads, {scale:g})", "a float32 tensor", answer["shown"],
               "the values come back to the gradients' own dtype, float32, after their trip "
               "through float16")
        expected = reference_fp16_round_trip(grads, scale)
        wrong = ~torch.isclose(got, expected, rtol=1e-6, atol=0.0) if got.shape == grads.shape \
            else torch.ones_like(grads, dtype=torch.bool)
        first = int(wrong.nonzero()[0]) if wrong.any() else 0
        expect(not wrong.any(), f"fp16_round_trip(grads, {scale:g})",
               f"{expected[first].item():.6g} for the gradient {grads[first].item():.6g}",
               f"{got.flatten()[first].item():.6g}" if got.numel() > first else answer["described"],
               _round_trip_hint(got, grads, scale))
        expect(torch.equal(answer["grads_after"], grads),
               f"the gradients passed to fp16_round_trip(grads, {scale:g}), after it returns",
               "unchanged", "changed in place", "the caller still needs its gradients: compute "
               "into a new tensor (grads * scale), not with mul_ or *= on grads itself")


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
    # Scale 1: a large scale would hide stale gradients (they are divided by it at unscale_).
    batches = [(X[64 * (step % 2): 64 * (step % 2) + 64], y[64 * (step % 2): 64 * (step % 2) + 64])
               for step in range(steps)]
    observed = call_learner(observe_steps, amp_step, batches, 1.0, max_norm, what=AMP_STEP_CALL)
    expected = reference_weights(reference_amp_step, batches, 1.0, max_norm)
    for step, after in enumerate(observed["weights"]):
        expect_close(after, expected[step], f"{what}, after step {step + 1}",
                     hint="the steps before matched: this one started from other gradients "
                          "(the previous step's still there?)" if step else
                          "a single step from fresh gradients differs from a correct AMP step",
                     rtol=1e-4, atol=1e-6)
    expect_no_refusal(observed)


@grader("AMP step")
def check_amp_step(amp_step):
    model, optimizer, X, y = setup()
    X64, y64 = X[:64], y[:64]
    fp32_loss, true_norm = fp32_loss_and_grad_norm(X64, y64)
    max_norm = true_norm / 2  # clipping must bite, measured in true (unscaled) units
    before = weights(model)
    observed = call_learner(observe_steps, amp_step, [(X64, y64)], 65536.0, max_norm,
                            what=AMP_STEP_CALL)
    expect_no_refusal(observed)
    loss = as_float(observed, 0, "the returned loss")
    dtypes = observed["dtypes"]

    expect(dtypes == [torch.float16], "the dtype of the first Linear's output",
           "[torch.float16] (one forward under float16 autocast)", str(dtypes),
           "the first Linear did not compute in float16: the forward pass ran outside float16 "
           "autocast" if dtypes else "the model's forward pass never ran")
    scaled = abs(loss - fp32_loss * 65536.0) <= 1e-2 * fp32_loss * 65536.0
    expect_close(loss, fp32_loss, "the returned loss", rtol=1e-2,
                 hint="it is 65536 times the loss: the scaled loss" if scaled else
                      "the cross-entropy of this batch, a float, in its own units")
    update_norm = (observed["weights"][0] - before).norm().item()
    expect_close(update_norm, LR * max_norm,
                 f"the size of the SGD update (lr x clipped gradient norm), gradient norm "
                 f"{true_norm:.4g}, max_norm {max_norm:.4g}",
                 clipping_hint(update_norm, max_norm, true_norm, 65536.0), rtol=1e-3)
    expect(observed["scale"] == 65536.0, "the scale after a step without inf",
           "65536.0 (unchanged)", str(observed["scale"]),
           "the scale changed after a clean step: it was updated more than once, or lowered")

    # A scale this large makes the fp16 gradients overflow: the step must be skipped.
    observed = call_learner(observe_steps, amp_step, [(X64, y64)], 2.0**20, max_norm,
                            what=AMP_STEP_CALL)
    expect_no_refusal(observed)
    loss = as_float(observed, 0, "the loss of the overflowing step")
    after, scale = observed["weights"][0], observed["scale"]
    expect(torch.equal(after, before), "the weights after a step whose gradients overflowed",
           "unchanged (the scaler skips the step)",
           "changed" if after.isfinite().all() else "inf/nan",
           "the gradients held inf at scale 2^20, yet the weights moved: that step went to the "
           "optimizer without the scaler's inf check")
    expect(scale == 2.0**19, "the scale after a step whose gradients overflowed",
           f"{2.0**19} (halved from {2.0**20})", str(scale),
           "the scale stayed at 2^20 after an overflow: it was never updated, so the next step "
           "overflows again" if scale == 2.0**20 else
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


def _accumulation_steps(amp_accumulation_step, steps, init_scale=65536.0, max_norm=1e3):
    """(what the learner's steps gave, observed on their side; the correct weights after each).
    max_norm 1e3 does not clip: clipping would hide a gradient of the wrong size."""
    observed = call_learner(observe_steps, amp_accumulation_step, [(batches,) for batches in steps],
                            init_scale, max_norm, what=ACCUMULATION_CALL)
    expect_no_refusal(observed)
    expected = reference_weights(reference_amp_accumulation_step, [(batches,) for batches in steps],
                                 init_scale, max_norm)
    return observed, expected


@grader("AMP with gradient accumulation")
def check_amp_accumulation_step(amp_accumulation_step):
    _, _, X, y = setup()
    micro_batches = _micro_batches(X, y)
    fp32_loss, true_norm = fp32_loss_and_grad_norm(X[:64], y[:64])  # the 4 micro-batches' mean
    start = weights(setup()[0])
    observed, expected = _accumulation_steps(amp_accumulation_step, [micro_batches])
    loss = as_float(observed, 0, "the returned loss")
    expect_close(observed["weights"][-1], expected[-1],
                 "the weights after one step over 4 micro-batches (no clipping)",
                 hint=accumulation_hint(observed["weights"][-1] - start, expected[-1] - start),
                 rtol=1e-4, atol=1e-6)
    # Two steps in a row, with a small scale (a large one would divide leftover gradients away):
    # gradients left over from the first step must not leak into the second, of 3 micro-batches
    # (a count written in as the notebook's 4 shows).
    observed, expected = _accumulation_steps(amp_accumulation_step,
                                             [micro_batches, _micro_batches(X[64:], y[64:], n=3)],
                                             init_scale=2.0)
    expect_close(observed["weights"][-1], expected[-1],
                 "the weights after two steps in a row, of 4 then 3 micro-batches (scale 2.0)",
                 hint="the first step was right and the second is not: it started from the "
                      "gradients the first step left behind, or divided its losses by 4, not by "
                      "len(micro_batches)",
                 rtol=1e-4, atol=1e-6)
    expect_close(loss, fp32_loss, "the returned loss (the mean over the 4 micro-batches)",
                 rtol=1e-2, hint=f"it is {loss / fp32_loss:.2f} times the mean of the "
                                 f"micro-batches' losses")

    # Clipping that bites, at a scale that is not 1 (at scale 1, scaled and true units agree):
    # the step's whole gradient, unscaled, must be cut to max_norm.
    max_norm, scale = true_norm / 2, 1024.0
    observed, expected = _accumulation_steps(amp_accumulation_step, [micro_batches],
                                             init_scale=scale, max_norm=max_norm)
    update_norm = (observed["weights"][-1] - start).norm().item()
    expect_close(update_norm, LR * max_norm,
                 f"the size of the SGD update (lr x clipped gradient norm), the step's gradient "
                 f"norm {true_norm:.4g}, max_norm {max_norm:.4g}, scale {scale:g}",
                 clipping_hint(update_norm, max_norm, true_norm, scale), rtol=1e-3)
    expect_close(observed["weights"][-1], expected[-1],
                 "the weights after one clipped step over 4 micro-batches",
                 hint="the update has the right size but not the right direction: clip the "
                      "gradient of the whole step, all micro-batches summed", rtol=1e-4, atol=1e-6)

    # Only the last micro-batch overflows: the whole step must be skipped, the scale halved once.
    exploding = (micro_batches[-1][0] * 1e6, micro_batches[-1][1])
    observed = call_learner(observe_steps, amp_accumulation_step,
                            [(micro_batches[:-1] + [exploding],)], 65536.0, 1e3,
                            what=ACCUMULATION_CALL)
    expect_no_refusal(observed)
    expect(torch.equal(observed["weights"][-1], start),
           "the weights after a step whose last micro-batch overflowed",
           "unchanged (one inf anywhere skips the whole step)", "changed",
           "the last micro-batch's gradients held inf, yet the weights moved: a step was taken "
           "before that micro-batch, or without the scaler's inf check")
    expect(observed["scale"] == 32768.0, "the scale after one skipped step",
           "32768.0 (halved once)", str(observed["scale"]),
           f"{65536.0 / observed['scale']:g} = 65536 / your scale: the scale must be halved "
           f"once per skipped optimizer step")
