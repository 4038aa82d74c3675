"""Item 1: the course's internals in learner cells: an import the lesson does not make; a reference
answer in an exercise, used directly, through another cell's helper, or bound to the exercise name.
"""
import ast

from .finding import Finding
from .notebook import covered
from .similarity import module_constants


def internal_findings(cell, course) -> list:
    """A course_lib import the lesson does not make (any learner cell); in an exercise cell, a
    course_lib name its solution does not use, imported or used."""
    found, exercise = [], cell.role == "exercise"
    allowed = course.exercise_allowed(cell.exercise)
    for path, _, line, _ in cell.parsed.imports:
        if path.split(".")[0] != "course_lib":
            continue
        if path.endswith(".*"):
            why = f"imports every name of {path[:-2]}, which cannot be read one by one"
        elif not covered(path, course.import_paths):
            why = (f"imports {path}, which this lesson does not import: a cell may use the "
                   f"course_lib names the lesson itself imports, and only those")
        elif exercise and not covered(path, allowed):
            why = (f"imports {path} in the exercise: the lesson demonstrates it, and the "
                   f"exercise asks you to write it yourself")
        else:
            continue
        found.append(Finding(cell.exercise, cell.index, f"line {line}: {why}"))
    if exercise:
        for use in cell.parsed.uses:
            path = cell.resolve(use)
            if path and path.split(".")[0] == "course_lib" and not covered(path, allowed) \
                    and not _constant(path):
                found.append(Finding(cell.exercise, cell.index, f"line {use.line}: uses {path}, "
                                     f"the course's own code, which the exercise's answer does "
                                     f"not use: write it yourself"))
    return found


def _constant(path: str) -> bool:
    """A constant the lesson imports (GiB, N_FEATURES): data, no answer; never a grader's."""
    module, _, name = path.rpartition(".")
    return not module.startswith("course_lib.checks") and name in module_constants(module)


def helper_findings(cells, course) -> list:
    """An exercise that calls a name defined in another cell that uses the course's code; and
    an exercise's own name bound to the course's code in another cell."""
    tainted, changed = {}, True
    while changed:
        changed = False
        for cell in cells:
            if cell.role in ("exercise", "check"):
                continue
            for bound, uses, statement in cell.parsed.statements:
                if cell.role == "course" and not _makes_code(statement):
                    continue  # a demonstration's results: data, no answer to fresh inputs
                why = _tainted_by(cell, uses, course, tainted, bound)
                for name in bound if why else ():
                    if name not in tainted:
                        tainted[name], changed = (cell.index, why), True
    found = []
    for cell in cells:
        if cell.role == "exercise":
            known = course.exercise_names.get(cell.exercise, set())
            for use in cell.parsed.uses:
                if use.root in tainted and cell.resolve(use) is None and not use.local_path \
                        and use.root not in cell.parsed.own and use.root not in known:
                    where, why = tainted[use.root]
                    found.append(Finding(cell.exercise, cell.index, f"line {use.line}: uses "
                                         f"{use.root} (cell {where}), which uses {why}"))
        elif cell.role in ("added", "edited"):
            for bound, uses, _ in cell.parsed.statements:
                for name in sorted(set(bound) & set(course.graded)):
                    why = _tainted_by(cell, uses, course, tainted, ()) or _imported_as(cell, name)
                    if why:
                        found.append(Finding(course.graded[name], cell.index, f"binds {name}, "
                                             f"the exercise's answer, to {why}"))
    return found


def _makes_code(statement) -> bool:
    """A def, a class, or a name bound to a function (an alias, a lambda)."""
    return isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
        isinstance(statement, ast.Assign)
        and isinstance(statement.value, (ast.Name, ast.Attribute, ast.Lambda)))


def _tainted_by(cell, uses, course, tainted, bound) -> str | None:
    for use in uses:
        path = cell.resolve(use)
        if path and path.split(".")[0] == "course_lib" and not covered(path,
                                                                        course.all_exercise_refs):
            return f"{path}, the course's own code"
        if path is None and use.root in tainted and use.root not in bound:
            return f"{use.root} (cell {tainted[use.root][0]}), which uses {tainted[use.root][1]}"
    return None


def _imported_as(cell, name) -> str | None:
    for path, bound, _, _ in cell.parsed.imports:
        if bound == name and path.split(".")[0] == "course_lib":
            return f"{path}, the course's own code"
    return None
