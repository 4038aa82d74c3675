"""How a verdict on the capstone names a run of the learner's script and its processes: `reject`
fails the grade for one run, `who` names a process, `in_order` sorts by rank.
"""
from ..engine import expect
from .script_probe import Run


def reject(run: Run, expected: str, got: str, hint: str):
    expect(False, f"train_ddp.py {run.what}", expected, got, hint)


def who(rank) -> str:
    return "the process" if rank is None else f"rank {rank}"


def in_order(items):  # by rank, None (plain python) included
    return sorted(items, key=lambda item: str(item[0]))
