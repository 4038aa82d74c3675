"""Running a learner's AMP step beside a correct one, for lesson 06's graders: the correct steps,
the same model, optimizer and data for both, the weights to compare, the scaler's refusals as
verdicts, and what the size of an SGD update says about how the gradient was clipped.

Everything runs on the CPU with float16 autocast and torch.amp.GradScaler("cpu").
"""
import torch
import torch.nn.functional as F

from ..engine import GradingError, expect

LR = 0.1  # plain SGD: an update is LR x the gradient that stepped, so its size shows the clipping


def setup(seed=0):
    """(model, SGD optimizer, X, y): the course model and 128 samples, the same at every call."""
    from ...training.data import make_dataset
    from ...training.models import make_model

    model = make_model(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    X, y = make_dataset(n_samples=128, seed=6).tensors
    return model, optimizer, X, y


def weights(model):
    """All parameters, flattened into one tensor (a copy)."""
    return torch.cat([p.detach().flatten() for p in model.parameters()]).clone()


# The correct steps the learner's are compared with.

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


def steps_side_by_side(amp_accumulation_step, steps, init_scale=65536.0, max_norm=1e3):
    """(model, reference model, returned losses): one step per list of micro-batches, each by the
    answer and by the reference, from the same start. max_norm 1e3 does not clip: clipping would
    hide a gradient of the wrong size."""
    (model, optimizer, _, _), (reference, reference_optimizer, _, _) = setup(), setup()
    scaler, reference_scaler = (torch.amp.GradScaler("cpu", init_scale=init_scale) for _ in range(2))
    losses = []
    for micro_batches in steps:
        losses.append(call_step(amp_accumulation_step, model, optimizer, scaler, micro_batches,
                                max_norm))
        reference_amp_accumulation_step(reference, reference_optimizer, reference_scaler,
                                        micro_batches, max_norm)
    return model, reference, losses


def fp32_loss_and_grad_norm(X, y):
    """The float32 loss of a fresh model on (X, y), and its gradient's norm (true units)."""
    model, _, _, _ = setup()
    loss = F.cross_entropy(model(X), y)
    loss.backward()
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    return loss.item(), norm.item()


def first_layer_dtypes(model):
    """A list that fills with the dtype of the first Linear's output at each forward."""
    seen = []
    model[0].register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    return seen


def as_float(loss, what):
    """The returned loss as a float, or a verdict that it is not a number."""
    try:
        return float(loss)
    except (TypeError, ValueError, RuntimeError):
        expect(False, what, "the loss as a number", repr(loss)[:80],
               "the step returned something that is not a number")


def call_step(step_function, *args):
    """The learner's step; the scaler's refusal of a second unscale_/step becomes a verdict."""
    try:
        return step_function(*args)
    except RuntimeError as error:
        if "since the last update()" not in str(error):
            raise
        raise GradingError("the scaler's calls in one optimizer step",
                           "unscale_ and step at most once per optimizer step, then update",
                           f"RuntimeError: {error}",
                           "the scaler refused to unscale or step a second time in the same "
                           "optimizer step: yours does it more than once before the update "
                           "(per micro-batch?)") from None


def clipping_hint(update_norm, max_norm, true_norm, scale):
    """Why an SGD step's update is not lr x max_norm, judged from its size."""
    stepped = update_norm / LR  # the norm of the gradient the optimizer stepped with
    if abs(stepped - true_norm) <= 1e-2 * true_norm:
        return (f"the step's gradient (norm {true_norm:.4g} in true units) reached the optimizer "
                f"whole: max_norm = {max_norm:.4g} never cut it")
    if stepped < max_norm / 10:
        return (f"the gradient that stepped has norm {stepped:.3g}, max_norm / {max_norm / stepped:.0f}: "
                f"it was cut to max_norm while still multiplied by the scale ({scale:g})")
    return (f"the gradient that stepped has norm {stepped:.4g}; cut to max_norm in true units it "
            f"would be {max_norm:.4g}")


def accumulation_hint(update, expected_update):
    """What a one-step update that differs from the reference's says about the answer."""
    ratio = update.norm().item() / expected_update.norm().item()
    if abs(ratio - 4) < 0.2:
        return ("the update is 4 times a correct one: the 4 micro-batches' gradients add up, so "
                "each micro-batch's loss must count for a quarter")
    if abs(ratio - 0.25) < 0.05:
        return "the update is a quarter of a correct one: only one micro-batch's gradient stepped"
    if ratio < 0.1:
        return (f"the update is {ratio:.3f} times a correct one: this step's gradient needs no "
                f"clipping at max_norm = 1000, yet it was cut, while still multiplied by the scale "
                f"(65536)")
    return (f"the update is {ratio:.2f} times a correct one's size: one optimizer step on the mean "
            f"loss of the 4 micro-batches")
