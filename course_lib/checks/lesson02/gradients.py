"""Lesson 02, exercise 3: gradients equal one device's.

One DataParallel forward and backward by hand, seen through the model's hooks
(checks/engine/replicas.py): one replica per chunk of the batch (scatter), each a copy of the
model (replicate), each in a thread of its own (parallel_apply), every replica's output reaching
one loss over the whole batch (gather), and the model's gradients after it equal to those of one
device on the whole batch, although the model comes in holding an earlier step's gradients.
Any spelling of the four steps passes (autograd.grad, a summed loss...); handing them to the
course's own DataParallel (course_lib.training.dp) does not: the exercise asks for them by hand.
"""
import threading

import torch
import torch.nn.functional as F

from ...training.dp import DataParallel
from ..engine import describe, expect, expect_close, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import call_learner as _call
from ..engine.observations import as_plain
from ..engine.replicas import ReplicaForward, chunk_of, gradient_scale, replica_forwards

CPU = torch.device("cpu")
MODEL_SEED, DATA_SEED = 1, 2  # at grading time, shifted by the grading offset (boundary.py)

CASES = [(13, 3), (7, 2), (8, 2)]  # (samples, devices): 5 + 5 + 3, 4 + 3, 4 + 4 samples
STALE_GRADIENT = 0.25  # every gradient the model holds when the function is called


def _one_device(X, y, model_seed):
    """One device on the whole batch: the model's gradients, and the gradient of the logits."""
    from ...training.models import make_model

    model = make_model(seed=model_seed)
    logits = model(X)
    logits.retain_grad()
    F.cross_entropy(logits, y).backward()
    return [p.grad.clone() for p in model.parameters()], logits.grad


@grader("gradients equal one device's")
def check_data_parallel_gradients(data_parallel_gradients):
    from ...training.data import make_dataset

    model_seed = grading_seed(MODEL_SEED)
    X_all, y_all = make_dataset(n_samples=13, seed=grading_seed(DATA_SEED)).tensors
    for samples, device_count in CASES:
        X, y = X_all[:samples], y_all[:samples]
        call = f"data_parallel_gradients(model, {samples} samples, {device_count} devices)"
        expected, logits_gradient = _one_device(X, y, model_seed)
        gradients, forwards = _call(lambda: _observe_a_run(data_parallel_gradients, model_seed,
                                                           X, y, device_count), what=call,
                                    written_by_you=(DataParallel.forward,))
        _expect_a_gradient_per_parameter(gradients, expected, call)
        _expect_the_four_steps([_as_forward(seen) for seen in forwards], X, logits_gradient,
                               device_count, call)
        _expect_one_devices_gradients(gradients, expected, device_count, call)


def _observe_a_run(data_parallel_gradients, model_seed, X, y, device_count):
    """Beside the learner's code: its function on a fresh model with hooks, and what it returned
    and the hooks saw, as plain data (the grader judges it): the gradients, and for every forward
    the module it ran (0: the model itself, k: the k-th replica seen), its thread (0: the calling
    thread, k: the k-th other), its inputs and the gradient that reached its output."""
    from ...training.models import make_model

    model = make_model(seed=model_seed)
    for parameter in model.parameters():  # what an earlier step left: this one starts from zero
        parameter.grad = torch.full_like(parameter, STALE_GRADIENT)
    with replica_forwards(model) as forwards:
        gradients = data_parallel_gradients(model, X, y, [CPU] * device_count)
    modules, threads = [model], [threading.current_thread()]
    seen = [{"module": _index_in(forward.module, modules),
             "thread": _index_in(forward.thread, threads),
             "inputs": forward.inputs, "output_gradient": forward.output_gradient}
            for forward in forwards]
    return as_plain(gradients), seen


def _index_in(item, known: list) -> int:
    """The index of `item` among `known` (by identity), appended when new."""
    found = next((index for index, other in enumerate(known) if other is item), None)
    if found is None:
        known.append(item)
        found = len(known) - 1
    return found


def _as_forward(seen: dict) -> ReplicaForward:
    gradient = seen["output_gradient"]
    return ReplicaForward(seen["module"], seen["thread"], seen["inputs"],
                          [] if gradient is None else [gradient])


def _expect_a_gradient_per_parameter(gradients, expected, call):
    shapes = [tuple(g.shape) for g in expected]  # one device's: one per parameter, in order
    expect(isinstance(gradients, (list, tuple)) and len(gradients) == len(shapes)
           and all(isinstance(g, torch.Tensor) for g in gradients), call,
           f"a list of {len(shapes)} gradient tensors, one per parameter, shapes {shapes}",
           describe(gradients), "return the model's gradients, one per parameter in "
           "model.parameters() order; equal outputs alone do not show equal gradients")
    for index, (got, shape) in enumerate(zip(gradients, shapes)):
        expect(tuple(got.shape) == shape, f"{call}: gradient {index}", f"shape {shape}",
               f"shape {tuple(got.shape)}", "return the parameters' gradients, in "
               "model.parameters() order")


def _expect_the_four_steps(forwards, X, logits_gradient, device_count, call):
    """Scatter, replicate, parallel_apply and gather, each by what it left in the hooks (module
    and thread as _observe_a_run numbers them: 0 is the model itself, the calling thread)."""
    chunks = list(X.chunk(device_count))
    sizes = " + ".join(str(len(chunk)) for chunk in chunks)
    fed_the_loss = [f for f in forwards if f.output_gradient is not None]
    expect(fed_the_loss, f"{call}: the model's outputs", "outputs that the loss is computed from",
           f"{len(forwards)} forward(s), none of whose outputs received a gradient",
           "the loss must be computed from the replicas' outputs, and backpropagated")
    for forward in fed_the_loss:  # scatter: every forward that fed the loss ran on one chunk
        expect(chunk_of(forward, chunks) is not None, f"{call}: the samples one forward ran on",
               f"one chunk per replica, DataParallel's sizes {sizes}",
               f"a forward on {len(forward.inputs)} samples that fed the loss",
               "the model ran on samples that are not a chunk of the batch: the batch is cut "
               "into one chunk per device before any replica runs")
    by_chunk = {chunk_of(f, chunks): f for f in fed_the_loss}
    for index, chunk in enumerate(chunks):
        expect(index in by_chunk, f"{call}: replica {index}'s output",
               f"part of the loss (chunk {index}, {len(chunk)} samples)", "no gradient reached it",
               f"replica {index}'s output never reached the loss: the loss covers every "
               "replica's output, gathered into one batch")
    threads = [by_chunk[index].thread for index in range(len(chunks))]
    for index in range(len(chunks)):
        forward = by_chunk[index]
        expect(forward.module != 0, f"{call}: the module replica {index} ran",
               "a replica of the model (a copy per device)", "the model object itself",
               f"chunk {index} ran on the original model: each device gets its own replica, "
               "the model stays the source the replicas are copied from")
        expect(forward.thread != 0
               and threads.count(forward.thread) == 1, f"{call}: the thread replica {index} ran in",
               "a thread of its own, one per replica", "the calling thread"
               if forward.thread == 0 else "a thread another replica "
               "also ran in", f"replica {index} ran one after another with the others: the "
               "replicas run at the same time, each in a thread of its own")
    starts = [0] + [int(n) for n in torch.tensor([len(c) for c in chunks]).cumsum(0)]
    for index, chunk in enumerate(chunks):
        got = by_chunk[index].output_gradient
        wanted = logits_gradient[starts[index]:starts[index + 1]]
        if torch.allclose(got, wanted, rtol=1e-4, atol=1e-7):
            continue
        scale = gradient_scale(got, wanted)
        hint = (f"replica {index}'s {len(chunk)} samples weigh {scale:.3g} times what they weigh "
                f"in one loss over all {len(X)} samples: every sample of the batch must weigh "
                "the same" if scale is not None else
                f"replica {index}'s rows met other labels than their own: row i of the gathered "
                "logits must be sample i of the batch, replica 0's rows first")
        expect(False, f"{call}: the gradient that reached replica {index}'s output",
               "the rows of one loss over the whole batch (what one device computes)",
               f"values off by up to {(got - wanted).abs().max().item():.2e}", hint)


def _expect_one_devices_gradients(gradients, expected, device_count, call):
    for index, (got, wanted) in enumerate(zip(gradients, expected)):
        got = got.detach()
        if torch.allclose(got, wanted, rtol=1e-4, atol=1e-6):
            continue
        scale = gradient_scale(got, wanted)
        stale = torch.allclose(got - wanted, torch.full_like(wanted, STALE_GRADIENT), atol=1e-5)
        hint = ("the gradients the model held before the call (an earlier step's) are still in "
                "what you return: clear them before the backward" if stale else
                f"gradient {index} is {scale:.3g} times one device's although every replica's "
                "output got the right gradient: the model's gradients after backward() are "
                "already the replicas' total" if scale is not None and abs(scale - 1) > 1e-3 else
                "every replica's output got the right gradient, but what you return is not the "
                "model's parameters' gradients after that backward")
        expect_close(got, wanted, f"{call}: gradient {index} (shape {tuple(wanted.shape)})",
                     hint, rtol=1e-4, atol=1e-6)
