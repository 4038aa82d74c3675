"""The roles of a notebook's cells against the course's lesson (exercise, edited, added, the
course's own), and the lesson read from its solution: its imports, what its exercises use and show.
"""
import builtins
import re
from dataclasses import dataclass

from ..cells import (BEGIN_SOLUTION, STUB, exercise_name, is_check_cell, is_code, is_exercise_cell,
                     is_solution_only)
from .constructs import MAGIC_CONSTRUCTS, construct_list
from .reading import Parsed, Use, name_chain, parse_cell
from .similarity import (PACKAGE, cell_grams, course_corpus, distinctive_sizes, facade, text_lines,
                         units_of)

# course_lib names any exercise may use, wherever imported from: the facade's plumbing (not
# Trainer or TrainConfig: the training loop answers several exercises) and the timing tools
_DAILY = ("launch", "spawn", "DistributedSession", "DistributedRunError", "current_session",
          "device_for_rank", "gpu_count", "make_dataset", "make_model")
PLUMBING = ({f"course_lib.{name}" for name in _DAILY}
            | {f"{facade()[name]}.{name}" for name in _DAILY if name in facade()}
            | {"course_lib.topics.timing.synchronize", "course_lib.topics.timing.time_it"})


@dataclass
class Cell:
    index: int
    role: str  # exercise, edited, added (the learner's); course, check (the course's own)
    exercise: str | None
    parsed: Parsed
    names: dict  # name -> ("import", path) or ("cell", index): the notebook's names, at its end
    source: str = ""
    original: str | None = None  # an edited course cell: the lesson's id of it

    def resolve(self, use) -> str | None:
        """The dotted name a use stands for ('sys.modules', 'course_lib.topics.x.f', 'eval'),
        None when it is a name the notebook defines or that is undefined."""
        if use.local_path:
            return ".".join([use.local_path, *use.attrs])
        bound = self.names.get(use.root)
        if bound is None:
            return ".".join([use.root, *use.attrs]) if hasattr(builtins, use.root) else None
        return ".".join([bound[1], *use.attrs]) if bound[0] == "import" else None


def _normal(source: str) -> str:
    return "\n".join(line.rstrip() for line in source.strip().splitlines())


def read_notebook(notebook, course) -> list:
    """Each cell of `notebook` with its role against the course's lesson, in order."""
    cells, names = [], {}
    check_cells = _restored_checks(notebook.cells, course)
    exercise_of = _exercise_cells(notebook.cells, course, check_cells)
    for index, cell in enumerate(notebook.cells):
        if not is_code(cell):
            continue
        parsed, cell_id = parse_cell(cell.source), cell.get("id")
        for _, bound, _, path in parsed.imports:
            if bound:
                names[bound] = ("import", path)
        for name in parsed.own:
            names[name] = ("cell", index)
        if index in check_cells:
            role, original = "check", None
        elif index in exercise_of:
            role, original = "exercise", cell_id
        elif _normal(cell.source) in course.course_sources:
            role, original = "course", None
        elif cell_id in course.cell_ids:
            role, original = "edited", cell_id
        else:
            role, original = "added", None
        # `names` is shared, filled by the cells after this one too: a function looks its
        # globals up when it is called, and a grader calls it after the notebook has run
        cells.append(Cell(index, role, exercise_of.get(index), parsed, names, cell.source,
                          original))
    return cells


def _restored_checks(cells, course) -> set:
    """Indexes of the check cells grading puts the course's back in place of (restore.py)."""
    found, graders = set(), set()
    for index, cell in enumerate(cells):
        if is_code(cell) and cell.get("id") in course.check_ids:
            found.add(index)
            graders.add(course.check_ids[cell.get("id")])
    for index, cell in enumerate(cells):
        name = exercise_name(cell) if is_check_cell(cell) else None
        if name in course.check_names and name not in graders:
            found.add(index)
            graders.add(name)
    return found


def _exercise_cells(cells, course, check_cells) -> dict:
    """{index: exercise} of the learner's exercise cells: the solution's exercise cell ids, a
    cell that still holds a stub or a solution region, else the cell just above the check."""
    found = {}
    for index, cell in enumerate(cells):
        if not is_code(cell) or index in check_cells:
            continue
        if cell.get("id") in course.exercise_ids:
            found[index] = course.exercise_ids[cell.get("id")]
        elif STUB in cell.source or BEGIN_SOLUTION in cell.source:
            later = [exercise_name(c) for c in cells[index + 1:] if is_check_cell(c)]
            found[index] = later[0] if later else None
    missing = set(course.exercise_ids.values()) - set(found.values())
    for index in sorted(check_cells):
        name = exercise_name(cells[index])
        above = index - 1
        while above >= 0 and not is_code(cells[above]):
            above -= 1
        if name in missing and above >= 0 and above not in {*found, *check_cells} and \
                _normal(cells[above].source) not in course.course_sources:
            found[above] = name
    return found


_LESSONS = {}  # a class is graded against one solution: read it once


def lesson_of(solution):
    key = tuple((cell.cell_type, cell.get("id"), cell.source,
                 tuple(cell.get("metadata", {}).get("tags", []))) for cell in solution.cells)
    if key not in _LESSONS:
        if len(_LESSONS) > 32:
            _LESSONS.clear()
        _LESSONS[key] = Lesson(solution)
    return _LESSONS[key]


class Lesson:
    """A lesson as its solution says: its cells, its course_lib imports, what each exercise's
    answer uses (course_lib names, notebook names, constructs), and the text it writes or shows."""

    def __init__(self, solution):
        lesson_cells = [cell for cell in solution.cells if not is_solution_only(cell)]
        self.exercise_ids, self.check_ids, self.cell_ids = {}, {}, set()
        self.course_sources = set()
        for index, cell in enumerate(lesson_cells):
            if not is_code(cell):
                continue
            if is_exercise_cell(cell):
                later = [exercise_name(c) for c in lesson_cells[index + 1:] if is_check_cell(c)]
                self.exercise_ids[cell.get("id")] = later[0] if later else None
            else:
                self.course_sources.add(_normal(cell.source))
                self.cell_ids.add(cell.get("id"))
            if is_check_cell(cell):
                self.check_ids[cell.get("id")] = exercise_name(cell)
        self.check_names = set(self.check_ids.values())
        read = read_notebook(solution, _Unknown())
        self.import_paths = {path for cell in read if not _solution_only(solution, cell)
                             for path, _, _, _ in cell.parsed.imports
                             if path.split(".")[0] == "course_lib"}
        self.exercise_refs, self.exercise_names, self.graded = {}, {}, {}
        self.exercise_constructs, self.cell_constructs, self.magics = set(), {}, set()
        for cell in read:
            keys = {key for key, _, _ in construct_list(cell.parsed, cell.resolve)}
            if not is_exercise_cell(solution.cells[cell.index]):
                self.cell_constructs[solution.cells[cell.index].get("id")] = keys
                if not _solution_only(solution, cell):  # `%load_ext course_lib` again is fine
                    self.magics |= {key for key in keys if key.startswith(MAGIC_CONSTRUCTS)}
                continue
            exercise = self.exercise_ids.get(solution.cells[cell.index].get("id"))
            self.exercise_constructs |= keys
            refs = self.exercise_refs.setdefault(exercise, set())
            refs |= {q for use in cell.parsed.uses if (q := cell.resolve(use)) and
                     q.split(".")[0] == "course_lib"}
            refs |= {path for path, _, _, _ in cell.parsed.imports if path.startswith("course_lib")}
            self.exercise_names.setdefault(exercise, set()).update(
                use.root for use in cell.parsed.uses)
            for bound, _, _ in cell.parsed.statements:
                self.graded |= dict.fromkeys(bound, exercise)
        for exercise, path in _permitted(solution, read):
            self.exercise_refs.setdefault(exercise, set()).add(path)
        self.all_exercise_refs = set().union(PLUMBING, *self.exercise_refs.values())
        shown = [course_corpus().units[unit] for unit in shown_units(read)]
        self.solution_grams = set().union(*(cell_grams(cell.parsed) for cell in read),
                                          *(unit.grams for unit in shown))
        self.solution_lines = set().union(*(text_lines(cell.source) for cell in read),
                                          *(unit.lines for unit in shown))
        self.distinctive = distinctive_sizes(self.solution_grams)

    def allowed_constructs(self, cell) -> set:
        """What a learner cell may use: what the solution's exercise cells use, the lesson's own
        magics, and in an edited course cell what that cell had."""
        return (self.exercise_constructs | self.magics
                | self.cell_constructs.get(cell.original, set()))

    def exercise_allowed(self, exercise) -> set:
        refs = self.exercise_refs.get(exercise)
        return PLUMBING | (refs if refs is not None else self.all_exercise_refs)


_PERMISSION = re.compile(r"\b(?:may|can)\s+(?:also\s+)?(?:call|use)\b", re.I)


def _permitted(solution, read) -> list:
    """(exercise, path) for each course_lib function or class an exercise's own text permits
    ("You may call `cost_model.ring_all_reduce_time(...)`"): the markdown above its cell."""
    found, text, names = [], [], read[0].names if read else {}
    for index, cell in enumerate(solution.cells):
        if cell.cell_type == "markdown":
            text.append(cell.source)
        elif is_exercise_cell(cell):
            later = [exercise_name(c) for c in solution.cells[index + 1:] if is_check_cell(c)]
            for sentence in re.split(r"(?<=[.!?])\s", " ".join(text)):
                if not _PERMISSION.search(sentence):
                    continue
                for dotted in re.findall(r"`([A-Za-z_][\w.]*)", sentence):
                    root, *attrs = dotted.split(".")
                    bound = names.get(root)
                    path = ".".join([bound[1], *attrs]) if bound and bound[0] == "import" else ""
                    if path.startswith("course_lib.") and not _is_module(path) and later:
                        found.append((later[0], path))
            text = []
        elif is_check_cell(cell):
            text = []
    return found


def _is_module(path: str) -> bool:
    where = PACKAGE.parent.joinpath(*path.split("."))
    return where.is_dir() or where.with_suffix(".py").exists()


class _Unknown:
    """The lesson as seen while the solution itself is read: every cell is the course's."""
    exercise_ids, check_ids, check_names, cell_ids, course_sources = {}, {}, set(), set(), set()


def _solution_only(solution, cell) -> bool:
    return is_solution_only(solution.cells[cell.index])


def covered(path: str, allowed) -> bool:
    return any(path == prefix or path.startswith(prefix + ".") for prefix in allowed)


def shown_units(read) -> set:
    """The course units a lesson displays (inspect.getsource of one): a learner may copy those."""
    shown = set()
    for cell in read:
        for use in cell.parsed.uses:
            if cell.resolve(use) == "inspect.getsource" and use.args:
                chain = name_chain(use.args[0])
                if chain:
                    path = cell.resolve(Use(chain[0], tuple(chain[1:]), use.line))
                    shown |= units_of(path) if path else set()
    return shown
