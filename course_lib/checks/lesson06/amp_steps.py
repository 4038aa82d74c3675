"""Running a learner's AMP step and a correct one from the same start, for lesson 06's graders:
the correct steps, the same model, optimizer and data for both, the learner's steps observed as
plain data on their side of the boundary (weights, losses, scale, the scaler's refusal) and the
correct ones run on the grader's, the weights to compare, and what the size of an SGD update says
about how the gradient was clipped.

Everything runs on the CPU with float16 autocast and torch.amp.GradScaler("cpu").
"""
import torch
import torch.nn.functional as F

from ..engine import GradingError, expect
from ..engine.boundary import grading_seed

LR = 0.1  # plain SGD: an update is LR x the gradient that stepped, so its size shows the clipping


def setup():
    """(model, SGD optimizer, X, y): the course model and 128 samples, the same at every call (of
    one grading: the seeds are grading_seed's)."""
    from ...training.data import make_dataset
    from ...training.models import make_model

    model = make_model(seed=grading_seed(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    X, y = make_dataset(n_samples=128, seed=grading_seed(6)).tensors
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


def observe_steps(step_function, steps, init_scale, max_norm):
    """On the learner's side of the boundary: the learner's step_function(model, optimizer, scaler,
    *data, max_norm) for each `data` of `steps`, from setup()'s model and a fresh scaler. Returns
    plain data: the weights after each step, what each step returned (a float, or None, and its
    repr), the scale at the end, the dtypes of the first Linear's outputs, and the scaler's refusal
    of a second unscale_/step (the text of its error; then the steps stop)."""
    model, optimizer, _, _ = setup()
    dtypes = first_layer_dtypes(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    observed = {"weights": [], "losses": [], "shown": [], "refused": None}
    for data in steps:
        try:
            loss = step_function(model, optimizer, scaler, *data, max_norm)
        except RuntimeError as error:
            if "since the last update()" not in str(error):
                raise
            observed["refused"] = str(error)
            break
        observed["weights"].append(weights(model))
        observed["losses"].append(_float_or_none(loss))
        observed["shown"].append(repr(loss)[:80])
    observed.update(scale=scaler.get_scale(), dtypes=list(dtypes))
    return observed


def _float_or_none(loss):
    try:
        return float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None


def reference_weights(reference_step, steps, init_scale, max_norm):
    """The weights after each of the correct steps, from the same start: the grader's side."""
    model, optimizer, _, _ = setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    after = []
    for data in steps:
        reference_step(model, optimizer, scaler, *data, max_norm)
        after.append(weights(model))
    return after


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


def as_float(observed, index, what):
    """The loss the step `index` returned, as a float, or a verdict that it is not a number."""
    expect(observed["losses"][index] is not None, what, "the loss as a number",
           observed["shown"][index], "the step returned something that is not a number")
    return observed["losses"][index]


def expect_no_refusal(observed):
    """The scaler's refusal of a second unscale_/step, seen on the learner's side, as a verdict."""
    if observed["refused"] is not None:
        raise GradingError("the scaler's calls in one optimizer step",
                           "unscale_ and step at most once per optimizer step, then update",
                           f"RuntimeError: {observed['refused']}",
                           "the scaler refused to unscale or step a second time in the same "
                           "optimizer step: yours does it more than once before the update "
                           "(per micro-batch?)")


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
