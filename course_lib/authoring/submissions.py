"""Who handed in what: a class folder's notebooks sorted into one submission per learner.

Duplicates (`07_x (1).ipynb`, `-Copy1`, `.ipynb_checkpoints`), other lessons' notebooks and stray
notebooks never become learners of their own and are never dropped silently: each is a note.
"""
import re
from dataclasses import dataclass, field
from pathlib import Path

from .layout import NOTEBOOK_NAME

CHECKPOINTS = ".ipynb_checkpoints"
# what JupyterLab (-Copy1), browsers ( (1)), Windows ( - Copy) and macOS ( copy) add to a name
COPY_MARK = re.compile(r"(?: \(\d+\)|-Copy\d*| - Copy(?: \(\d+\))?| copy(?: \d+)?)$", re.IGNORECASE)
CHECKPOINT_MARK = re.compile(r"-checkpoint$")


@dataclass
class Submission:
    """One learner's notebook to grade (None: nothing gradable), with what else was found."""

    learner: str
    notebook: Path = None
    notes: list = field(default_factory=list)


@dataclass
class _Found:
    path: Path
    learner: str
    kind: str  # lesson, copy, checkpoint, other lesson, extra


def find_submissions(paths, lesson_name: str) -> list:
    """One Submission per learner, in learner order, from notebooks and folders of them. A folder
    holds a folder per learner (alice/07_x.ipynb) or a notebook per learner (alice.ipynb)."""
    found = []
    for path in map(Path, paths):
        if path.is_file():
            found.append(_explicit(path, lesson_name))
        elif path.is_dir():
            notebooks = sorted(path.rglob("*.ipynb"))
            lesson_folders = {_outside_checkpoints(nb.parent) for nb in notebooks if _course_name(nb)}
            found += [_classify(path, nb, lesson_name, lesson_folders) for nb in notebooks]
        else:
            raise LookupError(f"no submission at {path}: give notebooks or folders of them")
    if not found:
        raise LookupError(f"no notebooks in {', '.join(map(str, paths))}")
    learners, seen = {}, set()
    for item in found:  # a notebook named twice (itself and its folder) counts once
        if item.path.resolve() not in seen:
            seen.add(item.path.resolve())
            learners.setdefault(item.learner, []).append(item)
    return [_submission(learner, items) for learner, items in sorted(learners.items())]


def plain_name(notebook: Path) -> str:
    """07_x.ipynb for `07_x (1).ipynb`, `07_x-Copy1.ipynb` and a checkpoint `07_x-checkpoint.ipynb`."""
    stem = CHECKPOINT_MARK.sub("", Path(notebook).stem) if CHECKPOINTS in Path(notebook).parts \
        else Path(notebook).stem
    while COPY_MARK.search(stem):
        stem = COPY_MARK.sub("", stem)
    return stem + ".ipynb"


def _course_name(notebook: Path):
    """The lesson number a notebook's plain name says ('07'), or None for alice.ipynb."""
    match = NOTEBOOK_NAME.match(plain_name(notebook))
    return match.group(1) if match else None


def _outside_checkpoints(folder: Path) -> Path:
    return folder.parent if folder.name == CHECKPOINTS else folder


def _kind(notebook: Path, lesson_name: str) -> str:
    number = _course_name(notebook)
    if number is not None and number != lesson_name[:2]:
        return "other lesson"
    if CHECKPOINTS in notebook.parts:
        return "checkpoint"
    return "copy" if plain_name(notebook) != notebook.name else "lesson"


def _classify(folder: Path, notebook: Path, lesson_name: str, lesson_folders) -> _Found:
    relative = notebook.relative_to(folder)
    parent = Path(*[part for part in relative.parent.parts if part != CHECKPOINTS])
    kind = _kind(notebook, lesson_name)
    if _course_name(notebook) is not None:  # 07_x.ipynb: its folder says who
        return _Found(notebook, parent.as_posix() if parent.parts else folder.resolve().name, kind)
    if parent.parts and folder / parent in lesson_folders:
        # scratch.ipynb beside alice/07_x.ipynb is alice's, not a learner called scratch
        return _Found(notebook, parent.as_posix(), "extra")
    return _Found(notebook, (parent / Path(plain_name(notebook)).stem).as_posix(), kind)


def _explicit(notebook: Path, lesson_name: str) -> _Found:
    """A notebook named on the command line: graded even as a copy or checkpoint, since the
    instructor chose it; another lesson's notebook is still not graded."""
    found = _classify(_outside_checkpoints(notebook.parent), notebook, lesson_name, set())
    if found.kind in ("copy", "checkpoint"):
        found.kind = "chosen " + found.kind
    return found


def _submission(learner: str, items) -> Submission:
    """The notebook to grade among what a learner handed in, and a note on each of the others."""
    def rank(item):  # the lesson's own name first, then a copy, newest first
        order = {"lesson": 0, "chosen copy": 0, "chosen checkpoint": 0, "copy": 1}
        return order.get(item.kind, 9), -item.path.stat().st_mtime, str(item.path)

    candidates = sorted(items, key=rank)
    chosen = candidates[0] if rank(candidates[0])[0] < 9 else None
    submission = Submission(learner, chosen.path if chosen else None)
    if chosen is not None and chosen.kind != "lesson":
        submission.notes.append(f"graded {chosen.path.name}, "
                                + ("a copy's name: no notebook under the lesson's own name was found"
                                   if chosen.kind == "copy" else f"chosen by the instructor ({chosen.kind[7:]})"))
    for item in candidates:
        if item is not chosen:
            submission.notes.append(_note(item, graded=chosen is not None))
    return submission


def _note(item: _Found, graded: bool) -> str:
    what = {"copy": "a duplicate", "checkpoint": "a Jupyter checkpoint copy",
            "other lesson": f"a notebook of lesson {_course_name(item.path)}",
            "extra": "a notebook of no lesson"}[item.kind]
    where = item.path.name if item.path.parent.name != CHECKPOINTS else f"{CHECKPOINTS}/{item.path.name}"
    if graded:
        return f"also handed in {where} ({what}): not graded"
    return (f"only {where} ({what}) was found: not graded; the learner should hand in the lesson's "
            f"notebook (or grade this file by naming it on the command line)")
