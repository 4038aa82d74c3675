"""Answers of the capstone (lesson 14) as files: the reference conversion (course_lib/examples/
capstone_ddp.py) with edits, written to a temporary file only when a grader opens it.
"""
import os
import shutil
import tempfile
import weakref
from importlib.resources import files
from pathlib import Path

REFERENCE = files("course_lib.examples") / "capstone_ddp.py"


def edited_reference_text(edits) -> str:
    """course_lib/examples/capstone_ddp.py (the reference conversion) with each (old, new) of
    `edits` applied once; each `old` must be in it."""
    text = REFERENCE.read_text()
    for old, new in edits:
        if old not in text:
            raise ValueError(f"the reference conversion has no {old!r} to edit")
        text = text.replace(old, new, 1)
    return text


def write_edited_reference(path, edits) -> Path:
    Path(path).write_text(edited_reference_text(edits))
    return Path(path)


class ScriptFile(os.PathLike):
    """A path to a script whose text `make_text()` returns, written to a temporary file when a
    grader opens it (so that declaring an answer writes nothing)."""

    def __init__(self, make_text, name: str = "train_ddp.py"):
        self.make_text, self.name, self.folder = make_text, name, None

    def __fspath__(self) -> str:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="capstone_answer_")
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        path = Path(self.folder) / self.name
        path.write_text(self.make_text())
        return str(path)

    def __repr__(self) -> str:
        return f"ScriptFile({self.name})"


def edited_reference(*edits) -> ScriptFile:
    """The reference conversion with `edits` applied, as a path a grader can open."""
    return ScriptFile(lambda: edited_reference_text(edits))


# texts of the reference that wrong and correct answers edit
NO_SYNC = 'with model.no_sync() if distributed and not last else nullcontext():'
LOSS_ALL_REDUCE = ("                if distributed:\n"
                   "                    dist.all_reduce(step_loss, op=dist.ReduceOp.AVG)\n")

# the mistakes, as (text of the reference, what replaces it)
NO_PROCESS_GROUP = ('    dist.init_process_group("gloo")\n', "")
NCCL_ON_THE_CPU = ('    dist.init_process_group("gloo")', '    dist.init_process_group("nccl")')
EVERY_RANK_SAVES = ("        if rank == 0:\n            unwrapped",
                    "        if True:\n            unwrapped")
SAVES_IN_PLACE = ("            write_atomically(", "            torch.save(")
RENAMES_UNSYNCED = [("            write_atomically(", "            save_then_rename("),
                    ("def parse_args():", "def save_then_rename(state, path):\n"
                     "    torch.save(state, path + '.tmp')  # no fsync before the rename\n"
                     "    os.replace(path + '.tmp', path)\n\n\ndef parse_args():")]
