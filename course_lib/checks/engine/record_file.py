"""The record of a graded notebook's checks, as a file: written with torch.save in the sandbox, read
back by the judge with torch.load(weights_only=True) only (torch's restricted unpickler: containers,
numbers, strings, tensors, dtypes; no other class, no function), after its size is checked.

    {"format": FORMAT, "version": VERSION, "seed_offset": int, "checks": [check, ...]}
    check = {"grader": "module.check_x", "exercise": str, "args": [part], "kwargs": [[name, part]],
             "argument_problem": str, "outcomes": [outcome], "complete": bool, "verdict": str}
    outcome = {"key": str, "kind": "value" | "grading_error" | "not_implemented" | "error",
               "value": part, "fields": {str: str}, "type": str, "message": str}

Parts are crossing_data's encoding. Nothing else is ever unpickled.
"""
import io
import os
from pathlib import Path

FORMAT = "course_lib grading record"
VERSION = 1
MAX_RECORD_BYTES = 256 * 2**20
CHECK_KEYS = {"grader": str, "exercise": str, "args": list, "kwargs": list, "argument_problem": str,
              "outcomes": list, "complete": bool, "verdict": str}
OUTCOME_KEYS = {"key": str, "kind": str, "value": tuple, "fields": dict, "type": str, "message": str}
OUTCOME_KINDS = ("value", "grading_error", "not_implemented", "error")


class RecordFileError(ValueError):
    """A record file that is not one this course wrote (or too big to read): refused unread."""


def write_record(path, seed_offset: int, checks: list) -> None:
    """Write the record atomically (a kernel killed while writing leaves the last whole one)."""
    import torch

    path = Path(path)
    temporary = path.with_name(path.name + ".writing")
    torch.save({"format": FORMAT, "version": VERSION, "seed_offset": seed_offset, "checks": checks},
               temporary)
    os.replace(temporary, path)


def read_record(data, limit: int = MAX_RECORD_BYTES) -> dict:
    """The record in `data` (bytes, or a path), checked: RecordFileError when it is too big, not
    torch's format, holds anything the restricted unpickler refuses, or is not shaped as above."""
    import torch

    if not isinstance(data, (bytes, bytearray)):
        path = Path(data)
        if path.is_symlink() or not path.is_file():
            raise RecordFileError(f"{path.name} is not a regular file")
        if path.stat().st_size > limit:
            raise RecordFileError(f"the record is over {limit} bytes: not read")
        data = path.read_bytes()
    if len(data) > limit:
        raise RecordFileError(f"the record is over {limit} bytes: not read")
    try:
        record = torch.load(io.BytesIO(bytes(data)), map_location="cpu", weights_only=True, mmap=False)
    except Exception as error:  # the restricted unpickler's refusal, or not a torch file at all
        raise RecordFileError(f"not a record this course wrote ({type(error).__name__}: "
                              f"{str(error)[:300]})") from None
    _check_shape(record)
    return record


def _check_shape(record) -> None:
    if type(record) is not dict or record.get("format") != FORMAT:
        raise RecordFileError("not a record this course wrote (no format header)")
    if record.get("version") != VERSION:
        raise RecordFileError(f"a record of version {record.get('version')!r}; this course reads {VERSION}")
    if type(record.get("seed_offset")) is not int or type(record.get("checks")) is not list:
        raise RecordFileError("a record without its seed offset or checks")
    for check in record["checks"]:
        _check_keys(check, CHECK_KEYS, "check")
        if any(type(item) is not list or len(item) != 2 or type(item[0]) is not str
               for item in check["kwargs"]):
            raise RecordFileError("a recorded check whose keyword arguments are not [name, value]")
        for outcome in check["outcomes"]:
            _check_keys(outcome, OUTCOME_KEYS, "outcome")
            if outcome["kind"] not in OUTCOME_KINDS:
                raise RecordFileError(f"an outcome of kind {outcome['kind']!r}")
            if any(type(key) is not str or type(value) is not str
                   for key, value in outcome["fields"].items()):
                raise RecordFileError("an outcome whose fields are not strings")


def _check_keys(item, keys: dict, what: str) -> None:
    if type(item) is not dict or set(item) != set(keys):
        raise RecordFileError(f"a recorded {what} with other keys than {sorted(keys)}")
    for key, kind in keys.items():
        if type(item[key]) is not kind:
            raise RecordFileError(f"a recorded {what}'s {key} is not a {kind.__name__}")
