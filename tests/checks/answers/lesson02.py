"""Lesson 02's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones (WRONG_ANSWERS, each must be rejected)."""
import itertools
import math

import torch
import torch.nn.functional as F

from course_lib.checks import lesson02
from course_lib.training.dp import gather, parallel_apply, replicate, scatter

from . import answer, wrong_answer


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
    ],
}


# Wrong answers

def _scatter_by(split):
    """A scatter that handles containers right and cuts each tensor with split(tensor, devices)."""
    def scatter_batch(inputs, devices):
        if isinstance(inputs, torch.Tensor):
            return split(inputs, devices)
        if isinstance(inputs, (tuple, list, dict)):
            items = inputs.items() if isinstance(inputs, dict) else inputs
            return [type(inputs)(chunk) for chunk in zip(*(scatter_batch(item, devices)
                                                           for item in items))]
        return [inputs for _ in devices]
    return scatter_batch


def _split_along_dim_1(tensor, devices):
    return [chunk.to(d) for chunk, d in zip(tensor.chunk(len(devices), dim=1), devices)]


def _split_dropping_the_remainder(tensor, devices):
    size = max(len(tensor) // len(devices), 1)  # 7 rows on 2 devices: 3 + 3, row 6 is lost
    return [tensor[i * size:(i + 1) * size].to(d) for i, d in enumerate(devices)
            if i * size < len(tensor)]


def _split_without_moving(tensor, devices):
    return list(tensor.chunk(len(devices)))


def _split_like_tensor_split(tensor, devices):  # 10 rows on 3 devices: 4 + 3 + 3, not 4 + 4 + 2
    chunks = tensor.tensor_split(len(devices))
    return [chunk.to(d) for chunk, d in zip(chunks, devices) if len(chunk)]


def _split_onto_the_first_device(tensor, devices):
    return [chunk.to(devices[0]) for chunk in tensor.chunk(len(devices))]


def _scatter_dicts_by_device_count(inputs, devices):
    """Right for tensors, tuples and lists; a dict becomes len(devices) dicts, some of them empty
    chunks, instead of as many as its tensors give."""
    if isinstance(inputs, dict):
        chunks = {key: value.chunk(len(devices)) for key, value in inputs.items()}
        return [{key: (parts[i].to(device) if i < len(parts) else inputs[key][:0].to(device))
                 for key, parts in chunks.items()} for i, device in enumerate(devices)]
    return _scatter_by(_split_with_chunk)(inputs, devices)


def _split_with_chunk(tensor, devices):
    return [chunk.to(d) for chunk, d in zip(tensor.chunk(len(devices)), devices)]


def _scatter_tensors_only(inputs, devices):
    if isinstance(inputs, torch.Tensor):
        return [chunk.to(d) for chunk, d in zip(inputs.chunk(len(devices)), devices)]
    return [inputs for _ in devices]  # a tuple or dict reaches every replica whole


def _scatter_padded_with_zip_longest(inputs, devices):
    """Right for tensors and dicts of equal rows; a tuple is zipped with itertools.zip_longest, so
    (3 rows, 'tag') on 4 devices makes a 4th replica with None for its rows."""
    if isinstance(inputs, (tuple, list)):
        per_item = [_scatter_padded_with_zip_longest(item, devices) for item in inputs]
        return [type(inputs)(parts) for parts in itertools.zip_longest(*per_item)]
    return _scatter_by(_split_with_chunk)(inputs, devices)


def _gather_pairs_only(outputs, output_device):
    """Written for the notebook's (logits, features) pairs: a tuple gives its first two only."""
    if isinstance(outputs[0], tuple):
        return tuple(torch.cat([output[i].to(output_device) for output in outputs])
                     for i in (0, 1))
    return torch.cat([output.to(output_device) for output in outputs])


def _gather_by(join):
    """A gather that goes into tuples correctly and joins each list of tensors with join()."""
    def gather_outputs(outputs, output_device):
        if isinstance(outputs[0], tuple):
            return tuple(gather_outputs(list(parts), output_device) for parts in zip(*outputs))
        return join(outputs, output_device)
    return gather_outputs


def _join_in_reverse(outputs, output_device):
    return torch.cat([o.to(output_device) for o in reversed(outputs)])


def _join_largest_chunk_first(outputs, output_device):
    return torch.cat([o.to(output_device) for o in sorted(outputs, key=len, reverse=True)])


def _join_on_the_first_outputs_device(outputs, output_device):
    return torch.cat([o.to(outputs[0].device) for o in outputs])


def _join_then_move(outputs, output_device):
    return torch.cat(outputs).to(output_device)


def _join_with_stack(outputs, output_device):
    return torch.stack([o.to(output_device) for o in outputs])


def _dp_forward(model, X, devices):
    chunks = scatter(X, devices)
    used = devices[:len(chunks)]
    replicas = replicate(model, used)
    return replicas, chunks, parallel_apply(replicas, chunks, used)


def _gradients_summed_twice(model, X, y, devices):
    model.zero_grad()
    replicas, _, outputs = _dp_forward(model, X, devices)
    F.cross_entropy(gather(outputs, devices[0]), y).backward()
    # "All-reduce" the replicas' gradients by hand: but they are already summed into one .grad.
    total = [torch.zeros_like(p) for p in model.parameters()]
    for replica in replicas:
        for t, p in zip(total, replica.parameters()):
            t += p.grad
    return total


def _mean_of_replica_losses(model, X, y, devices):
    model.zero_grad()
    _, chunks, outputs = _dp_forward(model, X, devices)
    labels = scatter(y, devices)
    # One mean per replica, then their mean: with 5 + 5 + 3 samples the last 3 weigh too much.
    loss = torch.stack([F.cross_entropy(o, t) for o, t in zip(outputs, labels)]).mean()
    loss.backward()
    return [p.grad for p in model.parameters()]


def _never_clears_the_gradients(model, X, y, devices):
    """Right, on a model without gradients; an earlier step's are added to this one's."""
    _, _, outputs = _dp_forward(model, X, devices)
    F.cross_entropy(gather(outputs, devices[0]), y).backward()
    return [p.grad for p in model.parameters()]


def _outputs_instead_of_gradients(model, X, y, devices):
    _, _, outputs = _dp_forward(model, X, devices)
    return [gather(outputs, devices[0]).detach(), model(X).detach()]  # equal outputs, no gradients


def _first_replica_only(model, X, y, devices):
    model.zero_grad()
    _, _, outputs = _dp_forward(model, X, devices)
    F.cross_entropy(outputs[0], scatter(y, devices)[0]).backward()
    return [p.grad for p in model.parameters()]


def _one_device_backward(model, X, y, devices):
    """No DataParallel at all: the gradients are right, but nothing was split or replicated."""
    model.zero_grad()
    F.cross_entropy(model(X), y).backward()
    return [p.grad for p in model.parameters()]


def _chunks_on_the_model_itself(model, X, y, devices):
    """Scattered and gathered, but every chunk runs on the original model: no replicas."""
    model.zero_grad()
    chunks = scatter(X, devices)
    used = devices[:len(chunks)]
    outputs = parallel_apply([model] * len(chunks), chunks, used)
    F.cross_entropy(gather(outputs, devices[0]), y).backward()
    return [p.grad for p in model.parameters()]


def _replicas_one_after_another(model, X, y, devices):
    """Replicas, but run in a loop in the calling thread, not by parallel_apply's threads."""
    model.zero_grad()
    chunks = scatter(X, devices)
    replicas = replicate(model, devices[:len(chunks)])
    outputs = [replica(chunk) for replica, chunk in zip(replicas, chunks)]
    F.cross_entropy(gather(outputs, devices[0]), y).backward()
    return [p.grad for p in model.parameters()]


def _gathered_in_reverse(model, X, y, devices):
    model.zero_grad()
    _, _, outputs = _dp_forward(model, X, devices)
    F.cross_entropy(gather(outputs[::-1], devices[0]), y).backward()
    return [p.grad for p in model.parameters()]


def _gradients_through_the_course_wrapper(model, X, y, devices):
    """Right gradients, but course_lib's DataParallel module runs the four steps, not the learner."""
    from course_lib.training.dp import DataParallel

    model.zero_grad(set_to_none=True)
    logits = DataParallel(model, devices=devices)(X)
    (F.cross_entropy(logits, y, reduction="sum") / len(y)).backward()
    return [parameter.grad.clone() for parameter in model.parameters()]


WRONG_ANSWERS = {
    lesson02.check_scatter_batch: [
        wrong_answer("splits along dim 1 instead of the batch dim",
                     _scatter_by(_split_along_dim_1)),
        wrong_answer("drops the remainder of an uneven batch",
                     _scatter_by(_split_dropping_the_remainder)),
        wrong_answer("passes tuples and dicts whole to every replica", _scatter_tensors_only),
        wrong_answer("never moves the chunks to their device", _scatter_by(_split_without_moving)),
        wrong_answer("splits like tensor_split (4+3+3), not like DataParallel (4+4+2)",
                     _scatter_by(_split_like_tensor_split)),
        wrong_answer("puts every chunk on the first device",
                     _scatter_by(_split_onto_the_first_device)),
        wrong_answer("makes one dict per device, even with fewer rows than devices",
                     _scatter_dicts_by_device_count),
        wrong_answer("pads the replicas of a tuple with zip_longest", _scatter_padded_with_zip_longest),
        wrong_answer("calls the course's scatter",
                     lambda inputs, devices: scatter(inputs, devices)),
    ],
    lesson02.check_gather_outputs: [
        wrong_answer("concatenates in reverse replica order", _gather_by(_join_in_reverse)),
        wrong_answer("puts the largest chunk first", _gather_by(_join_largest_chunk_first)),
        wrong_answer("leaves the result on the first output's device",
                     _gather_by(_join_on_the_first_outputs_device)),
        wrong_answer("stacks instead of concatenating", _gather_by(_join_with_stack)),
        wrong_answer("concatenates first, then moves the result to output_device",
                     _gather_by(_join_then_move)),
        wrong_answer("gathers the notebook's pairs only: a 3-tuple loses its third",
                     _gather_pairs_only),
        wrong_answer("is the course's gather", gather),
    ],
    lesson02.check_data_parallel_gradients: [
        wrong_answer("one device's backward, no DataParallel at all", _one_device_backward),
        wrong_answer("runs every chunk on the model itself, no replicas",
                     _chunks_on_the_model_itself),
        wrong_answer("runs the replicas one after another in the calling thread",
                     _replicas_one_after_another),
        wrong_answer("gathers the outputs in reverse replica order", _gathered_in_reverse),
        wrong_answer("sums the replicas' gradients a second time", _gradients_summed_twice),
        wrong_answer("averages one mean loss per replica", _mean_of_replica_losses),
        wrong_answer("returns the outputs, comparing only outputs", _outputs_instead_of_gradients),
        wrong_answer("backpropagates replica 0's loss only", _first_replica_only),
        wrong_answer("hands the four steps to the course's DataParallel",
                     _gradients_through_the_course_wrapper),
        wrong_answer("never clears the gradients an earlier step left", _never_clears_the_gradients),
    ],
}
