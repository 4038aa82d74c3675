"""Where the course's notebooks live: solutions/NN_topic.ipynb pairs with lessons/NN_topic.ipynb.

Finds the course root, lists the notebooks, and turns `3`, `03` or a path into one lesson.
"""
import re
from pathlib import Path

SOLUTIONS = "solutions"
LESSONS = "lessons"
NOTEBOOK_NAME = re.compile(r"^(\d{2})_\w+\.ipynb$")


def find_course_root(start: Path = None) -> Path:
    """The nearest folder, from `start` (default: the current one) up, that holds lessons/ or
    solutions/; `start` itself when none does."""
    start = Path.cwd() if start is None else Path(start)
    start = start.resolve()
    for folder in (start, *start.parents):
        if (folder / LESSONS).is_dir() or (folder / SOLUTIONS).is_dir():
            return folder
    return start


def course_notebooks(folder: Path) -> list:
    """The course notebooks (NN_topic.ipynb) in `folder`, sorted by number; [] if it is missing."""
    if not folder.is_dir():
        return []
    return sorted(path for path in folder.glob("*.ipynb") if NOTEBOOK_NAME.match(path.name))


def lesson_number(path: Path) -> str:
    """'03' for 03_ring_allreduce.ipynb."""
    return NOTEBOOK_NAME.match(Path(path).name).group(1)


def matches_numbers(path: Path, numbers) -> bool:
    """Whether `path` is one of the lessons `numbers` names ('3', '03', '3,4'); all when empty."""
    wanted = {part.strip().zfill(2) for item in numbers for part in item.split(",") if part.strip()}
    return not wanted or lesson_number(path) in wanted


def find_lesson(which: str, root: Path) -> Path:
    """The notebook `which` names: a path to a notebook, or a lesson number like 3 or 03."""
    if which.endswith(".ipynb"):
        path = Path(which)
        if not path.is_file():
            raise LookupError(f"no notebook at {which}; give a lesson number (e.g. 3) or the "
                              f"path of an existing notebook")
        return path
    lessons = course_notebooks(root / LESSONS)
    found = [path for path in lessons if which.isdigit() and matches_numbers(path, [which])]
    if not found:
        available = ", ".join(lesson_number(path) for path in lessons) or "none"
        raise LookupError(f"no lesson {which!r} in {root / LESSONS} (lessons there: {available}); "
                          f"give a number like 3 or 03, and run this from the course folder")
    return found[0]
