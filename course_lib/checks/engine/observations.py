"""What a grader's code beside the learner's returns across a crossing (boundary.py): plain data.

A learner may answer with any number type (NumPy's integers and floats, 0-dim arrays), and a wrong
answer with any object at all; the grader's comparisons, on the other side, read plain data only.
`as_plain` turns an answer into that, keeping what the comparisons need: numbers stay numbers
(NumPy's become Python's), arrays become tensors, containers keep their kind, and anything else
becomes its repr (the verdict quotes it as the learner's answer).
"""
import numbers

import torch

from .boundary import PLAIN_SCALARS

REPR_LIMIT = 120


def as_plain(value):
    """`value` as plain data for a crossing: see the module's docstring."""
    if type(value) in PLAIN_SCALARS or isinstance(value, (torch.dtype, torch.Size)):
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().as_subclass(torch.Tensor)
    if _is_numpy(value):
        return _from_numpy(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if type(value) in (list, tuple):
        return type(value)(as_plain(item) for item in value)
    if type(value) is dict and all(isinstance(key, (str, int)) and not isinstance(key, bool)
                                   for key in value):
        return {key: as_plain(item) for key, item in value.items()}
    return repr(value)[:REPR_LIMIT]


def _is_numpy(value) -> bool:
    return type(value).__module__ == "numpy"


def _from_numpy(value):
    import numpy as np

    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return torch.as_tensor(value.copy())
    return repr(value)[:REPR_LIMIT]
