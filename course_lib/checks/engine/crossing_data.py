"""What crosses from the learner's side to the judge, as data: a value encoded into tagged plain
parts that torch.load(weights_only=True) reads back, and decoded again without running its code.

    ("v", x)                      x plain (boundary.plain): a number, a string, a tensor, a dtype
    ("list" | "tuple", [parts])   ("dict", [[key, part], ...])
    ("object", type name, part)   a course type of CROSSING_TYPES, rebuilt from its plain fields
    ("callable", name)            a check's argument that is code: replayed as a LearnerCode
"""
import dataclasses
import importlib
import sys

from .boundary import PLAIN_SCALARS, plain

# course types a grader may be handed (the measured records of topics/): rebuilt from their fields
CROSSING_TYPES = {"course_lib.topics.input_pipeline.DataWait",
                  "course_lib.topics.scaling.StepTiming", "course_lib.topics.timing.Timing",
                  "course_lib.topics.scaling.SpeedupPairs",
                  "course_lib.topics.cost_model.AllReduceSweep",
                  "course_lib.topics.from_scratch.pipeline.Record"}
MAX_DEPTH = 32
DICT_KEYS = (str, int, float, bool)  # a dict crosses as [key, value] pairs: any such key


class CrossingDataError(ValueError):
    """A recorded value that is not data this module wrote: refused, never run."""


class LearnerCode:
    """Stands for a learner's function or class in a replayed check: the judge runs no learner
    code, so a grader that calls it outside a crossing (boundary.py) is a bug of that grader."""

    def __init__(self, name: str):
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        raise GraderOutsideCrossing(f"the grader called the learner's {self.__name__} outside a "
                                    f"crossing: wrap that call in boundary.crossing (or call_learner)")

    def __repr__(self):
        return f"<the learner's {self.__name__}>"


class GraderOutsideCrossing(RuntimeError):
    """A grader ran learner code where the judge cannot: a bug of the grader, not the learner's."""


def register_crossing_type(cls) -> None:
    """Let instances of `cls` (a dataclass, or a dict or list with attributes) cross as their
    fields."""
    CROSSING_TYPES.add(_type_name(cls))


def encode(value, where: str = "value", callables: bool = False, depth: int = 0):
    """`value` as tagged plain parts; TypeError for what is neither data nor (with `callables`)
    code. Tensors are copied, so a later change does not reach the record."""
    torch = sys.modules.get("torch")  # never imported: no value can be a tensor (a kernel of the
    if depth > MAX_DEPTH:             # fixture course's never pays for importing it)
        raise TypeError(f"{where} is nested deeper than {MAX_DEPTH}")
    if torch and type(value) in (torch.Tensor, torch.nn.Parameter):
        return ("v", value.detach().clone().as_subclass(torch.Tensor))
    if type(value) in PLAIN_SCALARS or torch and type(value) in (torch.dtype, torch.Size):
        return ("v", value)
    converted = _from_numpy(value) if type(value).__module__ == "numpy" else value
    if converted is not value:  # np.float64(...), np.bool_, arrays: as Python's, tensors
        return encode(converted, where, callables, depth + 1)
    if type(value) in (list, tuple):
        return (type(value).__name__, [encode(item, f"{where}[{index}]", callables, depth + 1)
                                       for index, item in enumerate(value)])
    if type(value) is dict:
        pairs = [(_from_numpy(key) if type(key).__module__ == "numpy" else key, item)
                 for key, item in value.items()]
        for key, _ in pairs:
            if type(key) not in DICT_KEYS:
                raise TypeError(f"{where} has a key {key!r} that is not a str or a number")
        return ("dict", [[key, encode(item, f"{where}[{key!r}]", callables, depth + 1)]
                         for key, item in pairs])
    if _type_name(type(value)) in CROSSING_TYPES:
        return ("object", _type_name(type(value)), encode(_fields(value), where, False, depth + 1))
    if callables and callable(value):
        return ("callable", str(getattr(value, "__qualname__", type(value).__qualname__))[:200])
    plain(value, where)  # raises the TypeError that names it
    raise TypeError(f"{where} is not plain data")


def decode(part, depth: int = 0, callables: bool = False):
    """The value `part` stands for; CrossingDataError for anything encode did not write (code:
    only a check's own arguments, with `callables`, may be a LearnerCode)."""
    if depth > MAX_DEPTH + 2 or type(part) is not tuple or not part or type(part[0]) is not str:
        raise CrossingDataError(f"not a recorded value: {type(part).__name__}")
    tag, rest = part[0], part[1:]
    if tag == "v" and len(rest) == 1:
        try:
            return plain(_scalar_or_tensor(rest[0]))
        except TypeError as error:
            raise CrossingDataError(str(error)) from None
    if tag in ("list", "tuple") and len(rest) == 1 and type(rest[0]) is list:
        items = [decode(item, depth + 1, callables) for item in rest[0]]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and len(rest) == 1 and type(rest[0]) is list:
        pairs = [_pair(item, depth, callables) for item in rest[0]]
        return dict(pairs)
    if tag == "object" and len(rest) == 2 and rest[0] in CROSSING_TYPES:
        return _rebuild(rest[0], decode(rest[1], depth + 1))
    if tag == "callable" and callables and len(rest) == 1 and type(rest[0]) is str:
        return LearnerCode(rest[0])
    raise CrossingDataError(f"not a recorded value: tag {tag!r}")


def _scalar_or_tensor(value):
    import torch

    if type(value) in PLAIN_SCALARS or type(value) in (torch.dtype, torch.Size, torch.Tensor):
        return value
    raise CrossingDataError(f"a recorded value of type {type(value).__name__}")


def _pair(item, depth, callables):
    if type(item) is not list or len(item) != 2 or type(item[0]) not in DICT_KEYS:
        raise CrossingDataError("not a recorded dict item")
    return item[0], decode(item[1], depth + 1, callables)


def _type_name(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _from_numpy(value):
    import torch

    if getattr(value, "shape", ()) != ():
        return torch.from_numpy(value.copy())  # TypeError for an array of objects
    return value.item() if hasattr(value, "item") else value  # scalars: Python's bool, int, float


def _fields(value) -> dict:
    if dataclasses.is_dataclass(value):
        return {"fields": {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}}
    items = dict(value) if isinstance(value, dict) else list(value)
    return {"items": items, "attributes": dict(vars(value))}


def _rebuild(name: str, fields):
    module, _, qualname = name.rpartition(".")
    cls = getattr(importlib.import_module(module), qualname)
    if type(fields) is not dict:
        raise CrossingDataError(f"the fields of a recorded {name} are not a dict")
    if dataclasses.is_dataclass(cls) and set(fields) == {"fields"} and type(fields["fields"]) is dict:
        given = fields["fields"]
        made = cls(**{field.name: given[field.name] for field in dataclasses.fields(cls)
                      if field.init and field.name in given})
        for field in dataclasses.fields(cls):
            if not field.init and field.name in given:
                setattr(made, field.name, given[field.name])
        return made
    container = dict if issubclass(cls, dict) else list if issubclass(cls, list) else None
    if container and set(fields) == {"items", "attributes"} \
            and type(fields["items"]) is container and type(fields["attributes"]) is dict:
        made = cls(fields["items"])
        made.__dict__.update({key: item for key, item in fields["attributes"].items()
                              if type(key) is str and not key.startswith("__")})
        return made
    raise CrossingDataError(f"the fields of a recorded {name} do not fit it")
