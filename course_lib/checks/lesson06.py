"""Graders for lesson 06, mixed precision: fp16's range, a correct AMP step, the scaler with
gradient accumulation.

- fp16 round trip: gradients scaled, cast to float16 and back, then unscaled, as a loss scale does.
- AMP step: zero the gradients, forward under float16 autocast, scaled backward, unscale_, clip to
  max_norm in true units, scaler.step, scaler.update; return the unscaled loss; a step whose
  gradients overflow is skipped and halves the scale.
- AMP with gradient accumulation: one optimizer step over several micro-batches, each loss divided
  by their number; unscale_, clip, step and update once; the step after it starts from zero
  gradients (the grader takes two steps in a row).

Every grader runs on the CPU with float16 autocast and torch.amp.GradScaler("cpu"), which torch
supports, so the grades are the same on a laptop and on a GPU node.
"""
import torch
import torch.nn.functional as F

from . import describe, expect, expect_close, grader, wrong_answer

LR = 0.1


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
               "cast back with .to(torch.float32) (or .float()) before dividing by the scale")
        expected = reference_fp16_round_trip(grads, scale)
        wrong = ~torch.isclose(got, expected, rtol=1e-6, atol=0.0) if got.shape == grads.shape \
            else torch.ones_like(grads, dtype=torch.bool)
        first = int(wrong.nonzero()[0]) if wrong.any() else 0
        expect(not wrong.any(), f"fp16_round_trip(grads, {scale:g})",
               f"{expected[first].item():.6g} for the gradient {grads[first].item():.6g}",
               f"{got.flatten()[first].item():.6g}" if got.numel() > first else describe(got),
               "multiply by the scale BEFORE the cast to float16 (that is what saves the small "
               "values), then cast back to float32 and divide by the scale")


def _round_trip_without_scale(grads, scale):
    return grads.to(torch.float16).to(torch.float32)


def _round_trip_not_unscaled(grads, scale):
    return (grads * scale).to(torch.float16).to(torch.float32)


def _round_trip_scaled_after_cast(grads, scale):
    return grads.to(torch.float16).to(torch.float32) * scale / scale


def _round_trip_in_bfloat16(grads, scale):
    return (grads * scale).to(torch.bfloat16).to(torch.float32) / scale


# Exercise 2: one AMP step, amp_step(model, optimizer, scaler, X, y, max_norm).

def reference_amp_step(model, optimizer, scaler, X, y, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=X.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(X), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def _setup(seed=0):
    from ..training.data import make_dataset
    from ..training.models import make_model

    model = make_model(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    X, y = make_dataset(n_samples=128, seed=6).tensors
    return model, optimizer, X, y


def _weights(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


def _fp32_loss_and_grad_norm(X, y):
    model, _, _, _ = _setup()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    return loss.item(), norm.item()


def _first_layer_dtypes(model):
    seen = []
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    return seen


def _as_float(loss, what):
    try:
        return float(loss)
    except (TypeError, ValueError, RuntimeError):
        expect(False, what, "the loss as a number (loss.item())", repr(loss)[:80],
               "return the unscaled loss, e.g. loss.item()")


def _expect_step_like_reference(amp_step, X, y, max_norm, steps, what):
    model, optimizer, _, _ = _setup()
    reference, reference_optimizer, _, _ = _setup()
    # Scale 1: a large scale would hide stale gradients (they are divided by it at unscale_).
    scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    reference_scaler = torch.amp.GradScaler("cpu", init_scale=1.0)
    for step in range(steps):
        batch = slice(64 * (step % 2), 64 * (step % 2) + 64)
        amp_step(model, optimizer, scaler, X[batch], y[batch], max_norm)
        reference_amp_step(reference, reference_optimizer, reference_scaler, X[batch], y[batch],
                           max_norm)
    expect_close(_weights(model), _weights(reference), what,
                 hint="zero the gradients first, then autocast forward, scaler.scale(loss)"
                      ".backward(), scaler.unscale_, clip, scaler.step, scaler.update",
                 rtol=1e-4, atol=1e-6)


@grader("AMP step")
def check_amp_step(amp_step):
    model, optimizer, X, y = _setup()
    X64, y64 = X[:64], y[:64]
    fp32_loss, true_norm = _fp32_loss_and_grad_norm(X64, y64)
    max_norm = true_norm / 2  # clipping must bite, measured in true (unscaled) units
    before = _weights(model)
    dtypes = _first_layer_dtypes(model)
    scaler = torch.amp.GradScaler("cpu")
    loss = _as_float(amp_step(model, optimizer, scaler, X64, y64, max_norm), "the returned loss")

    expect(dtypes == [torch.float16], "the dtype of the first Linear's output",
           "[torch.float16] (one forward under float16 autocast)", str(dtypes),
           "run the forward and the loss inside torch.autocast(device_type=X.device.type, "
           "dtype=torch.float16)")
    expect_close(loss, fp32_loss, "the returned loss", rtol=1e-2,
                 hint="return the loss itself (loss.item()), not the scaled loss")
    update_norm = (_weights(model) - before).norm().item()
    if update_norm < LR * max_norm / 100:
        hint = ("the update is tiny: did you clip before scaler.unscale_(optimizer)? Clipping "
                "scaled gradients cuts them to max_norm / scale in true units")
    else:
        hint = ("clip with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) after "
                "scaler.unscale_(optimizer) and before scaler.step(optimizer)")
    expect_close(update_norm, LR * max_norm,
                 "the size of the SGD update (lr x clipped gradient norm)", hint, rtol=1e-3)
    expect(scaler.get_scale() == 65536.0, "the scale after a step without inf",
           "65536.0 (unchanged)", str(scaler.get_scale()),
           "call scaler.update() once, after scaler.step(optimizer)")

    # A scale this large makes the fp16 gradients overflow: the step must be skipped.
    model, optimizer, X, y = _setup()
    before = _weights(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**20)
    loss = _as_float(amp_step(model, optimizer, scaler, X64, y64, max_norm),
                     "the loss of the overflowing step")
    after = _weights(model)
    expect(torch.equal(after, before), "the weights after a step whose gradients overflowed",
           "unchanged (the scaler skips the step)",
           "changed" if after.isfinite().all() else "inf/nan",
           "step with scaler.step(optimizer), never optimizer.step(): it skips the step when "
           "the gradients hold inf or nan")
    expect(scaler.get_scale() == 2.0**19, "the scale after a step whose gradients overflowed",
           f"{2.0**19} (halved from {2.0**20})", str(scaler.get_scale()),
           "call scaler.update() after scaler.step(optimizer): it halves the scale after an inf")
    expect(abs(loss - fp32_loss) <= 1e-2 * fp32_loss, "the loss of the overflowing step",
           f"about {fp32_loss:.4f} (the loss is finite, only the scaled gradients overflow)",
           str(loss), "return the unscaled loss")

    _expect_step_like_reference(amp_step, X, y, max_norm, 3,
                                "the weights after 3 AMP steps (vs a correct AMP step)")
    _expect_step_like_reference(amp_step, X, y, 1e3, 1,
                                "the weights after a step that needs no clipping")


def _amp_step_variant(autocast=True, zero_grad=True, scale=True, unscale=True,
                      scaler_step=True, update=True, return_scaled=False):
    """reference_amp_step with one part missing or done wrong: a wrong answer."""
    def amp_step(model, optimizer, scaler, X, y, max_norm):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=X.device.type, dtype=torch.float16, enabled=autocast):
            loss = F.cross_entropy(model(X), y)
        scaled = scaler.scale(loss) if scale else loss
        scaled.backward()
        if unscale:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer) if scaler_step else optimizer.step()
        if update:
            scaler.update()
        return (scaled if return_scaled else loss).item()

    return amp_step


# Exercise 3: one optimizer step over several micro-batches, with a scaler.

def reference_amp_accumulation_step(model, optimizer, scaler, micro_batches, max_norm):
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for X, y in micro_batches:
        with torch.autocast(device_type=X.device.type, dtype=torch.float16):
            loss = F.cross_entropy(model(X), y) / len(micro_batches)
        scaler.scale(loss).backward()
        total += loss.item()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return total


def _micro_batches(X, y, n=4, size=16):
    return [(X[i * size:(i + 1) * size], y[i * size:(i + 1) * size]) for i in range(n)]


@grader("AMP with gradient accumulation")
def check_amp_accumulation_step(amp_accumulation_step):
    _, _, X, y = _setup()
    micro_batches = _micro_batches(X, y)
    fp32_loss, _ = _fp32_loss_and_grad_norm(X[:64], y[:64])
    model, reference, losses = _steps_side_by_side(amp_accumulation_step, [micro_batches])
    loss = _as_float(losses[0], "the returned loss")
    expect_close(_weights(model), _weights(reference),
                 "the weights after one step over 4 micro-batches",
                 hint="backward every micro-batch (loss / len(micro_batches), scaled), then "
                      "unscale_, clip, step and update ONCE",
                 rtol=1e-4, atol=1e-6)
    # Two steps in a row, with a small scale (a large one would divide leftover gradients away):
    # gradients left over from the first step must not leak into the second.
    model, reference, _ = _steps_side_by_side(amp_accumulation_step,
                                              [micro_batches, _micro_batches(X[64:], y[64:])],
                                              init_scale=2.0)
    expect_close(_weights(model), _weights(reference),
                 "the weights after two steps in a row (scale 2.0)",
                 hint="start every step from zero gradients: optimizer.zero_grad() before the "
                      "first micro-batch (or after optimizer.step()), never between micro-batches",
                 rtol=1e-4, atol=1e-6)
    expect_close(loss, fp32_loss, "the returned loss (the mean over the 4 micro-batches)",
                 rtol=1e-2, hint="divide each micro-batch's loss by len(micro_batches) and add up")

    # Only the last micro-batch overflows: the whole step must be skipped, the scale halved once.
    model, optimizer, _, _ = _setup()
    before = _weights(model)
    scaler = torch.amp.GradScaler("cpu")
    exploding = (micro_batches[-1][0] * 1e6, micro_batches[-1][1])
    amp_accumulation_step(model, optimizer, scaler, micro_batches[:-1] + [exploding], 1e3)
    expect(torch.equal(_weights(model), before),
           "the weights after a step whose last micro-batch overflowed",
           "unchanged (one inf anywhere skips the whole step)", "changed",
           "step once, with scaler.step(optimizer), after the last micro-batch")
    expect(scaler.get_scale() == 32768.0, "the scale after one skipped step",
           "32768.0 (halved once)", str(scaler.get_scale()),
           "call scaler.update() once per optimizer step, not per micro-batch")


def _accumulation_steps_every_micro_batch(model, optimizer, scaler, micro_batches, max_norm):
    total = 0.0
    for X, y in micro_batches:
        total += reference_amp_step(model, optimizer, scaler, X, y, max_norm) / len(micro_batches)
    return total


def _steps_side_by_side(amp_accumulation_step, steps, init_scale=65536.0):
    """(model, reference model, returned losses): one step per list of micro-batches, each by the
    answer and by the reference, from the same start. No clipping (max_norm 1e3): clipping would
    hide a gradient of the wrong size."""
    (model, optimizer, _, _), (reference, reference_optimizer, _, _) = _setup(), _setup()
    scaler, reference_scaler = (torch.amp.GradScaler("cpu", init_scale=init_scale) for _ in range(2))
    losses = []
    for micro_batches in steps:
        losses.append(amp_accumulation_step(model, optimizer, scaler, micro_batches, 1e3))
        reference_amp_accumulation_step(reference, reference_optimizer, reference_scaler,
                                        micro_batches, 1e3)
    return model, reference, losses


def _accumulation_variant(divide=True, zero_every_micro_batch=False, zero_grad=True):
    """reference_amp_accumulation_step with one mistake: a wrong answer."""
    def amp_accumulation_step(model, optimizer, scaler, micro_batches, max_norm):
        if zero_grad:
            optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for X, y in micro_batches:
            if zero_every_micro_batch:
                optimizer.zero_grad(set_to_none=True)  # wipes the micro-batches before this one
            with torch.autocast(device_type=X.device.type, dtype=torch.float16):
                loss = F.cross_entropy(model(X), y) / (len(micro_batches) if divide else 1)
            scaler.scale(loss).backward()
            total += loss.item() / (1 if divide else len(micro_batches))
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        scaler.step(optimizer)
        scaler.update()
        return total

    return amp_accumulation_step


WRONG_ANSWERS = {
    check_fp16_round_trip: [
        wrong_answer("casts to fp16 without the scale", _round_trip_without_scale),
        wrong_answer("forgets to divide by the scale", _round_trip_not_unscaled),
        wrong_answer("scales after the cast, too late", _round_trip_scaled_after_cast),
        wrong_answer("uses bfloat16 instead of float16", _round_trip_in_bfloat16),
    ],
    check_amp_step: [
        wrong_answer("clips before unscale_", _amp_step_variant(unscale=False)),
        wrong_answer("no scaler: plain backward and optimizer.step",
                     _amp_step_variant(scale=False, unscale=False, scaler_step=False,
                                       update=False)),
        wrong_answer("forgets scaler.update()", _amp_step_variant(update=False)),
        wrong_answer("optimizer.step() instead of scaler.step()",
                     _amp_step_variant(scaler_step=False)),
        wrong_answer("no autocast", _amp_step_variant(autocast=False)),
        wrong_answer("never zeroes the gradients", _amp_step_variant(zero_grad=False)),
        wrong_answer("returns the scaled loss", _amp_step_variant(return_scaled=True)),
    ],
    check_amp_accumulation_step: [
        wrong_answer("steps after every micro-batch", _accumulation_steps_every_micro_batch),
        wrong_answer("does not divide the loss by the micro-batch count",
                     _accumulation_variant(divide=False)),
        wrong_answer("zeroes the gradients before every micro-batch",
                     _accumulation_variant(zero_every_micro_batch=True)),
        wrong_answer("never zeroes the gradients: the next step adds the last one's",
                     _accumulation_variant(zero_grad=False)),
    ],
}
