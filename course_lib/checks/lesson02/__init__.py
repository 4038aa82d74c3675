"""Lesson 02 graders: DataParallel's scatter and gather, and gradients equal to one device's.

- scatter a batch: each tensor cut along dim 0 with chunk's sizes (7 rows on 2 devices: 4 + 3),
  chunk i on devices[i], tuples/lists/dicts scattered item by item, other objects to every replica;
  written by the learner (the course's own scatter, imported at the top, does not count).
- gather the outputs: the replicas' outputs concatenated along dim 0, replica 0 first, on
  output_device (each output moved there, wherever it was), tuples (of 2 or 3) gathered element
  by element;
  written by the learner, not the course's gather.
- gradients equal one device's: gradients.py.

The first two compare the learner's function with course_lib.training.dp's reference on uneven
batches, nested inputs and a mix of devices: PyTorch's "meta" device (shapes and placement without
data) next to the CPU, so a CPU-only machine can check that every chunk and output lands on the
device it was sent to.
"""
import torch

from ...training import dp
from ..engine import describe, expect, grader
from ..engine.boundary import grading_seed
from ..engine.learner_call import call_learner as _call
from ..engine.observations import as_plain
from .gradients import check_data_parallel_gradients  # noqa: F401 (exercise 3)

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
    """`count` rows of consecutive numbers from `offset`, shifted by an amount drawn at grading
    time (none in a notebook): the learner's function never knows the values beforehand."""
    start = offset + grading_seed(0) % 997
    return torch.arange(start, start + count * width, dtype=torch.float32).reshape(count, width)


# Exercise 1: scatter ----------------------------------------------------------------------------

SCATTER_HINT = ("compare the chunk sizes and devices with the exercise's rules: DataParallel's "
                "sizes (10 rows on 3 devices: 4 + 4 + 2), chunk i on devices[i], containers "
                "scattered item by item, anything else to every replica; a container makes "
                "only as many replicas as its shortest item (zip, not zip_longest)")


@grader("scatter a batch")
def check_scatter_batch(scatter_batch):
    from ...training.dp import scatter

    two, three, four = [CPU] * 2, [CPU] * 3, [CPU] * 4
    batch = _rows(10)
    cases = [
        ("scatter_batch(7 rows, 2 devices)", _rows(7), two),        # 4 + 3
        ("scatter_batch(10 rows, 3 devices)", batch, three),        # 4 + 4 + 2, not 4 + 3 + 3
        ("scatter_batch(3 rows, 4 devices)", _rows(3), four),       # only 3 replicas get work
        ("scatter_batch((X, {'mask': M}, 'tag'), 2 devices)",
         (_rows(5), {"mask": _rows(5, width=2, offset=100)}, "tag"), two),
        ("scatter_batch([X, Y], 3 devices)", [_rows(7), _rows(7, width=1, offset=50)], three),
        ("scatter_batch((3 rows, 'tag'), 4 devices)", (_rows(3), "tag"), four),  # 3, not 4
        ("scatter_batch(7 rows, 2 'meta' devices)", _rows(7), [META, META]),
        ("scatter_batch(7 rows, devices [cpu, 'meta'])", _rows(7), [CPU, META]),
        ("scatter_batch((X, Y), devices ['meta', cpu, 'meta'])",
         (_rows(10), _rows(10, width=1, offset=50)), [META, CPU, META]),
        ("scatter_batch({'x': 3 rows, 'mask': 3 rows}, devices [cpu, 'meta', cpu, 'meta'])",
         {"x": _rows(3), "mask": _rows(3, width=2, offset=100)}, [CPU, META, CPU, META]),
    ]
    for call, inputs, devices in cases:
        expected = scatter(inputs, devices)  # before the learner's function sees the inputs
        result = _call(lambda: as_plain(scatter_batch(inputs, devices)), what=call,
                       hint=SCATTER_HINT, written_by_you=(dp.scatter,))
        expect(isinstance(result, (list, tuple)), call, "a list with one entry per replica",
               describe(result), SCATTER_HINT)
        _expect_same(list(result), expected, call, SCATTER_HINT)


# Exercise 2: gather -----------------------------------------------------------------------------

GATHER_HINT = ("compare the rows, their order and the device with the exercise's rules: the "
               "replicas' rows one after another along dim 0, replica 0's first, all on "
               "output_device; a tuple of outputs gives a tuple")


@grader("gather the outputs")
def check_gather_outputs(gather_outputs):
    from ...training.dp import gather

    uneven = [_rows(4), _rows(3, offset=100)]
    three = [_rows(2), _rows(5, offset=100), _rows(1, offset=200)]
    pairs = [(_rows(4), _rows(4, width=2, offset=500)), (_rows(3, offset=100), _rows(3, width=2))]
    cases = [
        ("gather_outputs([4 rows, 3 rows], cpu)", uneven, CPU),
        ("gather_outputs([2 rows, 5 rows, 1 row], cpu)", three, CPU),
        ("gather_outputs([(logits, features), (logits, features)], cpu)", pairs, CPU),
        ("gather_outputs([(a, b, c), (a, b, c)], cpu)",
         [pair + (_rows(len(pair[0]), width=1, offset=900),) for pair in pairs], CPU),
        ("gather_outputs([4 rows, 3 rows], 'meta')", uneven, META),
        ("gather_outputs([2 rows, 5 rows, 1 row], 'meta')", three, META),
        ("gather_outputs([4 rows on cpu, 3 rows on 'meta'], 'meta')",
         [_rows(4), _rows(3, offset=100).to(META)], META),
        ("gather_outputs([(logits, features) on 'meta', (logits, features) on cpu], 'meta')",
         [tuple(t.to(META) for t in pairs[0]), pairs[1]], META),
    ]
    for call, outputs, output_device in cases:
        expected = gather(outputs, output_device)  # before the learner's function sees them
        result = _call(lambda: as_plain(gather_outputs(outputs, output_device)), what=call,
                       hint=GATHER_HINT, written_by_you=(dp.gather,))
        _expect_same(result, expected, call, GATHER_HINT)
