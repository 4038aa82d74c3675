"""Lesson 02's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import math

import torch
import torch.nn.functional as F

from course_lib.checks import lesson02
from course_lib.training.dp import gather, parallel_apply, replicate, scatter


from . import answer, wrong_answer  # noqa: F401


def scatter_with_split_sizes(inputs, devices):
    """torch.split with chunk's size, ceil(rows / devices); containers by explicit loops."""
    if isinstance(inputs, torch.Tensor):
        size = math.ceil(len(inputs) / len(devices))
        return [part.to(device) for part, device in zip(inputs.split(size), devices)]
    if isinstance(inputs, dict):
        scattered = {key: scatter_with_split_sizes(value, devices) for key, value in inputs.items()}
        replicas = min(map(len, scattered.values()))
        return [dict((key, parts[i]) for key, parts in scattered.items()) for i in range(replicas)]
    if isinstance(inputs, (list, tuple)):
        scattered = [scatter_with_split_sizes(item, devices) for item in inputs]
        replicas = min(map(len, scattered))
        return [type(inputs)(parts[i] for parts in scattered) for i in range(replicas)]
    return [inputs] * len(devices)


def scatter_with_narrow(inputs, devices):
    """Row ranges with tensor.narrow; tuples and lists rebuilt with map."""
    if isinstance(inputs, torch.Tensor):
        rows, step = inputs.shape[0], -(-inputs.shape[0] // len(devices))
        starts = range(0, rows, step)
        return [inputs.narrow(0, start, min(step, rows - start)).to(device)
                for start, device in zip(starts, devices)]
    if isinstance(inputs, dict):
        keys = list(inputs)
        columns = zip(*(scatter_with_narrow(inputs[key], devices) for key in keys))
        return [dict(zip(keys, column)) for column in columns]
    if isinstance(inputs, tuple):
        return list(map(tuple, zip(*(scatter_with_narrow(item, devices) for item in inputs))))
    if isinstance(inputs, list):
        return list(map(list, zip(*(scatter_with_narrow(item, devices) for item in inputs))))
    return [inputs for _ in devices]


def gather_into_a_preallocated_tensor(outputs, output_device):
    if isinstance(outputs[0], tuple):
        return tuple(gather_into_a_preallocated_tensor(list(parts), output_device)
                     for parts in zip(*outputs))
    rows = sum(output.shape[0] for output in outputs)
    result = torch.empty((rows, *outputs[0].shape[1:]), dtype=outputs[0].dtype,
                         device=output_device)
    start = 0
    for output in outputs:
        result[start:start + len(output)] = output.to(output_device)
        start += len(output)
    return result


def gather_by_pairwise_concatenation(outputs, output_device):
    if isinstance(outputs[0], tuple):
        return tuple(map(lambda parts: gather_by_pairwise_concatenation(list(parts), output_device),
                         zip(*outputs)))
    result = outputs[0].to(output_device)
    for output in outputs[1:]:
        result = torch.cat((result, output.to(output_device)))
    return result


def gradients_from_a_summed_loss(model, X, y, devices):
    """Sum of per-replica summed losses, divided by the whole batch: the same mean."""
    for parameter in model.parameters():
        parameter.grad = None
    chunks, labels = scatter(X, devices), scatter(y, devices)
    used = devices[:len(chunks)]
    outputs = parallel_apply(replicate(model, used), chunks, used)
    loss = sum(F.cross_entropy(output, label, reduction="sum")
               for output, label in zip(outputs, labels)) / len(X)
    loss.backward()
    return [parameter.grad for parameter in model.parameters()]


def gradients_with_autograd_grad(model, X, y, devices):
    chunks = scatter(X, devices)
    used = devices[:len(chunks)]
    logits = gather(parallel_apply(replicate(model, used), chunks, used), devices[0])
    loss = F.nll_loss(F.log_softmax(logits, dim=1), y)
    return list(torch.autograd.grad(loss, list(model.parameters())))


def gradients_through_the_course_wrapper(model, X, y, devices):
    """course_lib's DataParallel module runs the four steps itself; a loss summed, then divided."""
    from course_lib.training.dp import DataParallel

    model.zero_grad(set_to_none=True)
    logits = DataParallel(model, devices=devices)(X)
    (F.cross_entropy(logits, y, reduction="sum") / len(y)).backward()
    return [parameter.grad.clone() for parameter in model.parameters()]


ALTERNATIVES = {
    lesson02.check_scatter_batch: [
        answer("torch.split with ceil sizes", scatter_with_split_sizes),
        answer("tensor.narrow and map", scatter_with_narrow),
    ],
    lesson02.check_gather_outputs: [
        answer("copies into a preallocated tensor", gather_into_a_preallocated_tensor),
        answer("concatenates pairwise", gather_by_pairwise_concatenation),
    ],
    lesson02.check_data_parallel_gradients: [
        answer("summed per-replica losses over the batch size", gradients_from_a_summed_loss),
        answer("torch.autograd.grad with nll_loss", gradients_with_autograd_grad),
        answer("the course's DataParallel module, a summed loss",
               gradients_through_the_course_wrapper),
    ],
}
