"""Lesson 02 graders: DataParallel's scatter and gather, and gradients equal to one device's.

- scatter a batch: each tensor cut along dim 0 with chunk's sizes (7 rows on 2 devices: 4 + 3),
  chunk i on devices[i], tuples/lists/dicts scattered item by item, other objects to every replica;
  written by the learner (the course's own scatter, imported at the top, does not count).
- gather the outputs: the replicas' outputs concatenated along dim 0, replica 0 first, on
  output_device (each output moved there, wherever it was), tuples gathered element by element;
  written by the learner, not the course's gather.
- gradients equal one device's: lesson02_gradients.py.

The first two compare the learner's function with course_lib.training.dp's reference on uneven
batches, nested inputs and a mix of devices: PyTorch's "meta" device (shapes and placement without
data) next to the CPU, so a CPU-only machine can check that every chunk and output lands on the
device it was sent to.
"""
import torch

from .engine import describe, expect, grader, wrong_answer
from .engine.learner_call import call_learner as _call
from ..training import dp

CPU = torch.device("cpu")
META = torch.device("meta")  # a device with shapes but no data: placement checks without GPUs


def _first_difference(actual, expected, where: str):
    """None when `actual` matches `expected` (structure, tensor values and devices), else
    (where, expected, got) describing the first place they differ."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return where, describe(expected), describe(actual)
        if actual.shape != expected.shape:
            return f"{where}.shape", str(tuple(expected.shape)), str(tuple(actual.shape))
        if actual.device != expected.device:
            return f"{where}.device", str(expected.device), str(actual.device)
        if expected.device.type != "meta" and not torch.equal(actual.cpu(), expected.cpu()):
            return where, describe(expected), describe(actual)
        return None
    if isinstance(expected, (tuple, list, dict)):
        if type(actual) is not type(expected) or len(actual) != len(expected):
            return where, f"a {type(expected).__name__} of {len(expected)}", describe(actual)
        if isinstance(expected, dict):
            if set(actual) != set(expected):
                return f"{where} keys", str(sorted(expected)), str(sorted(actual))
            pairs = [(f"{where}[{key!r}]", actual[key], expected[key]) for key in expected]
        else:
            pairs = [(f"{where}[{i}]", a, e) for i, (a, e) in enumerate(zip(actual, expected))]
        for inner_where, inner_actual, inner_expected in pairs:
            found = _first_difference(inner_actual, inner_expected, inner_where)
            if found:
                return found
        return None
    return None if actual == expected else (where, describe(expected), describe(actual))


def _expect_same(actual, expected, call: str, hint: str):
    found = _first_difference(actual, expected, "result")
    if found:
        where, wanted, got = found
        expect(False, f"{call}: {where}", wanted, got, hint)


def _rows(count, width=3, offset=0):
    return torch.arange(offset, offset + count * width, dtype=torch.float32).reshape(count, width)


# Exercise 1: scatter ----------------------------------------------------------------------------

SCATTER_HINT = ("compare the chunk sizes and devices with the exercise's rules: DataParallel's "
                "sizes (10 rows on 3 devices: 4 + 4 + 2), chunk i on devices[i], containers "
                "scattered item by item, anything else to every replica")


@grader("scatter a batch")
def check_scatter_batch(scatter_batch):
    from ..training.dp import scatter

    two, three, four = [CPU] * 2, [CPU] * 3, [CPU] * 4
    batch = _rows(10)
    cases = [
        ("scatter_batch(7 rows, 2 devices)", _rows(7), two),        # 4 + 3
        ("scatter_batch(10 rows, 3 devices)", batch, three),        # 4 + 4 + 2, not 4 + 3 + 3
        ("scatter_batch(3 rows, 4 devices)", _rows(3), four),       # only 3 replicas get work
        ("scatter_batch((X, {'mask': M}, 'tag'), 2 devices)",
         (_rows(5), {"mask": _rows(5, width=2, offset=100)}, "tag"), two),
        ("scatter_batch([X, Y], 3 devices)", [_rows(7), _rows(7, width=1, offset=50)], three),
        ("scatter_batch(7 rows, 2 'meta' devices)", _rows(7), [META, META]),
        ("scatter_batch(7 rows, devices [cpu, 'meta'])", _rows(7), [CPU, META]),
        ("scatter_batch((X, Y), devices ['meta', cpu, 'meta'])",
         (_rows(10), _rows(10, width=1, offset=50)), [META, CPU, META]),
        ("scatter_batch({'x': 3 rows, 'mask': 3 rows}, devices [cpu, 'meta', cpu, 'meta'])",
         {"x": _rows(3), "mask": _rows(3, width=2, offset=100)}, [CPU, META, CPU, META]),
    ]
    for call, inputs, devices in cases:
        result = _call(scatter_batch, inputs, devices, what=call, hint=SCATTER_HINT,
                       written_by_you=dp.scatter)
        expect(isinstance(result, (list, tuple)), call, "a list with one entry per replica",
               describe(result), SCATTER_HINT)
        _expect_same(list(result), scatter(inputs, devices), call, SCATTER_HINT)


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


# Exercise 2: gather -----------------------------------------------------------------------------

GATHER_HINT = ("compare the rows, their order and the device with the exercise's rules: the "
               "replicas' rows one after another along dim 0, replica 0's first, all on "
               "output_device; a tuple of outputs gives a tuple")


@grader("gather the outputs")
def check_gather_outputs(gather_outputs):
    from ..training.dp import gather

    uneven = [_rows(4), _rows(3, offset=100)]
    three = [_rows(2), _rows(5, offset=100), _rows(1, offset=200)]
    pairs = [(_rows(4), _rows(4, width=2, offset=500)), (_rows(3, offset=100), _rows(3, width=2))]
    cases = [
        ("gather_outputs([4 rows, 3 rows], cpu)", uneven, CPU),
        ("gather_outputs([2 rows, 5 rows, 1 row], cpu)", three, CPU),
        ("gather_outputs([(logits, features), (logits, features)], cpu)", pairs, CPU),
        ("gather_outputs([4 rows, 3 rows], 'meta')", uneven, META),
        ("gather_outputs([2 rows, 5 rows, 1 row], 'meta')", three, META),
        ("gather_outputs([4 rows on cpu, 3 rows on 'meta'], 'meta')",
         [_rows(4), _rows(3, offset=100).to(META)], META),
        ("gather_outputs([(logits, features) on 'meta', (logits, features) on cpu], 'meta')",
         [tuple(t.to(META) for t in pairs[0]), pairs[1]], META),
    ]
    for call, outputs, output_device in cases:
        result = _call(gather_outputs, outputs, output_device, what=call, hint=GATHER_HINT,
                       written_by_you=dp.gather)
        _expect_same(result, gather(outputs, output_device), call, GATHER_HINT)


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


WRONG_ANSWERS = {
    check_scatter_batch: [
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
        wrong_answer("calls the course's scatter", lambda inputs, devices: dp.scatter(inputs,
                                                                                   devices)),
    ],
    check_gather_outputs: [
        wrong_answer("concatenates in reverse replica order", _gather_by(_join_in_reverse)),
        wrong_answer("puts the largest chunk first", _gather_by(_join_largest_chunk_first)),
        wrong_answer("leaves the result on the first output's device",
                     _gather_by(_join_on_the_first_outputs_device)),
        wrong_answer("stacks instead of concatenating", _gather_by(_join_with_stack)),
        wrong_answer("concatenates first, then moves the result to output_device",
                     _gather_by(_join_then_move)),
        wrong_answer("is the course's gather", dp.gather),
    ],
}


from .lesson02_gradients import check_data_parallel_gradients  # noqa: E402,F401 (exercise 3)
