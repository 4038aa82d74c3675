"""The package's layers: few modules at the top, short imports for learners, no upward import."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import course_lib

PACKAGE = Path(course_lib.__file__).parent
# Lower layers first; a module may import its own layer and the ones before it, never after.
LAYERS = ["runtime", "training", "topics", "checks", "authoring", "examples"]
# What learners type every day, as DESIGN.md lists it: the facade exports these and nothing else.
DAILY_NAMES = ["launch", "spawn", "DistributedSession", "DistributedRunError", "Trainer", "TrainConfig",
               "make_dataset", "make_model", "device_for_rank", "gpu_count", "current_session"]


def imported_modules(path, package=None):
    """Every module a file of `package` imports, at the top or inside a function, as dotted names."""
    package = package or ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                yield f"{module}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def layer_of(dotted):
    parts = dotted.split(".")
    return parts[1] if parts[0] == "course_lib" and len(parts) > 1 and parts[1] in LAYERS else None


def test_few_modules_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= 6, top
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)


def test_no_layer_imports_a_higher_one():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        own = layer_of("course_lib." + ".".join(path.relative_to(PACKAGE).parts))
        if own is None:
            continue
        for module in imported_modules(path):
            other = layer_of(module)
            if other is not None and LAYERS.index(other) > LAYERS.index(own):
                upward.append(f"{path.relative_to(PACKAGE)} imports {module}")
    assert not upward, "\n".join(upward)


def test_the_checker_sees_an_upward_import(tmp_path):
    # The walk above must catch a lazy import inside a function, relative or absolute.
    module = tmp_path / "probe.py"
    module.write_text("def f():\n    from ..training import trainers\n    import course_lib.topics.memory\n")
    found = {layer_of(m) for m in imported_modules(module, package="course_lib.runtime")}
    assert found == {"training", "topics"}


def module_names(folder, package):
    """(path, dotted name) of every module under `folder`, the files of `package`; a package is
    named by its __init__.py."""
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        yield path, ".".join((package, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def import_cycles(modules):
    """modules: (path, dotted name) pairs. Each circle of imports among them (at the top or inside
    a function, relative or absolute), once, as 'a -> b -> a'."""
    names = dict((name, path) for path, name in modules)
    imports = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        imports[name] = set()
        for module in imported_modules(path, package=package):
            while module and module not in names:  # `from .cells import is_code` imports .cells
                module = module.rpartition(".")[0]
            if module and module != name:
                imports[name].add(module)
    cycles = []

    def walk(path):  # each circle is found from its first module in sorted order, so only once
        for module in sorted(imports[path[-1]]):
            if module == path[0]:
                cycles.append(" -> ".join(path + [module]))
            elif module > path[0] and module not in path:
                walk(path + [module])

    for name in sorted(imports):
        walk([name])
    return cycles


def test_no_module_of_authoring_is_in_an_import_cycle():
    cycles = import_cycles(module_names(PACKAGE / "authoring", "course_lib.authoring"))
    assert not cycles, ("the commands import the pipelines, and no pipeline imports back; these "
                        "modules import each other:\n" + "\n".join(cycles))


def test_the_cycle_checker_sees_a_cycle(tmp_path):
    # Across a lazy absolute import, a relative one, and a package's __init__; a one-way import is none.
    (tmp_path / "__init__.py").write_text("from .commands import main\n")
    (tmp_path / "commands.py").write_text("from . import gradebook\nfrom .cells import is_code\n")
    (tmp_path / "gradebook.py").write_text("def grade_class():\n    import course_lib.probe.commands\n")
    (tmp_path / "cells.py").write_text("def is_code():\n    from . import main\n")
    (tmp_path / "layout.py").write_text("from .cells import is_code\n")
    cycles = import_cycles(module_names(tmp_path, "course_lib.probe"))
    assert cycles == ["course_lib.probe -> course_lib.probe.commands -> course_lib.probe.cells -> course_lib.probe",
                      "course_lib.probe.commands -> course_lib.probe.gradebook -> course_lib.probe.commands"]


# The runtime's roles: each may import the ones listed with it, never another.
RUNTIME_ROLES = {"shared": {"shared"}, "rank": {"rank", "shared"}, "launcher": {"launcher", "rank", "shared"}}


def runtime_role_of(dotted):
    parts = dotted.split(".")
    return parts[2] if parts[:2] == ["course_lib", "runtime"] and len(parts) > 2 and parts[2] in RUNTIME_ROLES else None


def role_crossings(modules):
    """modules: (path, dotted name) pairs; each import that crosses a role it may not."""
    crossings = []
    for path, name in modules:
        own = runtime_role_of(name)
        package = name.rsplit(".", 1)[0]
        for module in imported_modules(path, package=package):
            other = runtime_role_of(module)
            if own is not None and other is not None and other not in RUNTIME_ROLES[own]:
                crossings.append(f"{name} ({own}) imports {module} ({other})")
    return crossings


def test_the_runtime_is_split_by_where_code_runs():
    runtime = PACKAGE / "runtime"
    assert {p.name for p in runtime.iterdir() if (p / "__init__.py").exists()} == set(RUNTIME_ROLES)
    assert sorted(p.name for p in runtime.glob("*.py")) == ["__init__.py"], "every module has a role"
    modules = [(path, "course_lib." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
               for path in runtime.rglob("*.py")]
    crossings = role_crossings(modules)
    assert not crossings, "the rank side never imports the launcher; the shared bottom neither:\n" + "\n".join(crossings)


def test_the_role_checker_sees_a_crossing(tmp_path):
    (tmp_path / "rank_probe.py").write_text("def f():\n    from ..launcher import supervisor\n")
    (tmp_path / "shared_probe.py").write_text("from course_lib.runtime.rank import main\n")
    (tmp_path / "launcher_probe.py").write_text("from ..rank.main import run_rank\nfrom ..shared import env\n")
    found = role_crossings([(tmp_path / "rank_probe.py", "course_lib.runtime.rank.probe"),
                            (tmp_path / "shared_probe.py", "course_lib.runtime.shared.probe"),
                            (tmp_path / "launcher_probe.py", "course_lib.runtime.launcher.probe")])
    assert len(found) == 2 and "launcher.supervisor" in found[0] and "rank.main" in found[1]


def test_daily_names_come_from_the_package_without_loading_torch():
    code = ("import sys, course_lib; assert 'torch' not in sys.modules, 'import course_lib loaded torch'; "
            f"names = {DAILY_NAMES!r}; "
            "print(all(callable(getattr(course_lib, n)) for n in names)); print(sorted(set(names) - set(dir(course_lib))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["True", "[]"]


def test_the_facade_exports_the_daily_names_and_nothing_else():
    assert sorted(course_lib._EXPORTS) == sorted(DAILY_NAMES)
    assert sorted(course_lib.__all__) == sorted([*DAILY_NAMES, "load_ipython_extension"])
    for name in ("cpu_cores", "choose_start_method", "threads_per_rank", "free_port"):
        assert not hasattr(course_lib, name), f"course_lib.{name}: import it from the module that owns it"


def test_the_short_names_are_the_real_ones():
    from course_lib.runtime.launcher.launch import launch
    from course_lib.training.trainers import Trainer

    assert course_lib.launch is launch and course_lib.Trainer is Trainer


def notebook_imports():
    """(file, module, name) for every `from course_lib... import name` in solutions/, lessons/ and
    the README's code."""
    import nbformat

    # `from m import a, b` on one line, or `from m import (a,\n b)` over several
    pattern = re.compile(r"^[ \t]*from[ \t]+(course_lib[\w.]*)[ \t]+import[ \t]+(\([\w\s,]+\)|[\w \t,]+)", re.M)
    sources = [(path, cell.source) for path in sorted(PACKAGE.parent.glob("*/[0-9][0-9]_*.ipynb"))
               for cell in nbformat.read(str(path), as_version=4).cells if cell.cell_type == "code"]
    readme = PACKAGE.parent / "README.md"
    sources += [(readme, block) for block in re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)]
    for path, source in sources:
        for module, names in pattern.findall(source):
            for name in filter(None, (n.strip(" \t\n()") for n in names.split(","))):
                yield path.relative_to(PACKAGE.parent), module, name
        for module in re.findall(r"^\s*import\s+(course_lib[\w.]*)", source, re.M):
            yield path.relative_to(PACKAGE.parent), module, ""


def test_notebooks_import_from_the_facade_topics_training_and_graders_check_names():
    found = list(notebook_imports())
    assert found, "no notebook imports course_lib: is the pattern right?"
    deep = [f"{path}: from {module} import {name}" for path, module, name in found
            if module.startswith("course_lib.runtime")
            or (module.startswith("course_lib.checks") and not name.startswith("check_"))]
    assert not deep, "notebooks reach past the facade:\n" + "\n".join(deep)


# The graders: an engine that knows no lesson, and a module or package per lesson.
CHECKS = PACKAGE / "checks"
LESSON = re.compile(r"lesson\d\d")


def checks_unit_of(dotted):
    """'engine', 'lesson04', ... for a module of course_lib.checks; None outside it."""
    parts = dotted.split(".")
    if parts[:2] != ["course_lib", "checks"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] == "engine" or LESSON.fullmatch(parts[2]) else None


def checks_crossings(checks_folder, package="course_lib.checks"):
    """Each import inside checks/ that crosses units: the engine importing a lesson, a lesson
    importing another lesson."""
    crossings = []
    for path in sorted(checks_folder.rglob("*.py")):
        relative = path.relative_to(checks_folder).with_suffix("").parts
        name = ".".join([package, *(relative[:-1] if relative[-1] == "__init__" else relative)])
        own = checks_unit_of(name)
        importer = name if relative[-1] == "__init__" else name.rsplit(".", 1)[0]
        for module in imported_modules(path, package=importer):
            other = checks_unit_of(module)
            if own is None or other is None or other == own:
                continue
            if own == "engine" or other != "engine":
                crossings.append(f"{name} ({own}) imports {module} ({other})")
    return crossings


def test_checks_is_an_engine_and_a_unit_per_lesson():
    units = sorted(p.stem for p in CHECKS.iterdir() if p.name != "__pycache__" and p.name != "__init__.py")
    strays = [unit for unit in units if unit != "engine" and not LESSON.fullmatch(unit)]
    assert not strays, f"checks/ holds the engine and lessonNN modules or packages only: {strays}"
    crossings = checks_crossings(CHECKS)
    assert not crossings, ("a lesson imports the engine and the layers below, never another "
                           "lesson; the engine imports no lesson:\n" + "\n".join(crossings))


def test_the_checks_checker_sees_a_crossing(tmp_path):
    for folder in ("engine", "lesson04", "lesson05"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "engine" / "ranks.py").write_text("def f():\n    from ..lesson04 import check_x\n")
    (tmp_path / "lesson04" / "buckets.py").write_text("from ..engine import grader\nfrom . import sampler\n")
    (tmp_path / "lesson05" / "__init__.py").write_text("import course_lib.checks.lesson04.buckets\n")
    (tmp_path / "lesson06.py").write_text("from .engine.ranks import run_on_ranks\nfrom ..training import dp\n")
    found = checks_crossings(tmp_path)
    assert found == ["course_lib.checks.engine.ranks (engine) imports course_lib.checks.lesson04.check_x (lesson04)",
                     "course_lib.checks.lesson05 (lesson05) imports course_lib.checks.lesson04.buckets (lesson04)"]


def test_no_grader_module_is_over_300_lines():
    long = [f"{path.relative_to(PACKAGE)}: {n} lines" for path in sorted(CHECKS.rglob("*.py"))
            if (n := len(path.read_text().splitlines())) > 300]
    assert not long, "split these by concept (a lesson's package holds its helpers):\n" + "\n".join(long)


def test_no_answer_ships_in_the_package():
    # Wrong answers and correct alternatives are test fixtures (tests/checks/answers/): a learner
    # who imports course_lib must not find them.
    words = re.compile(r"\b(WRONG_ANSWERS|ALTERNATIVES|wrong_answer|hanging_wrong_answer|WrongAnswer)\b")
    shipped = [f"{path.relative_to(PACKAGE)}: {match.group(1)}" for path in sorted(PACKAGE.rglob("*.py"))
               for match in words.finditer(path.read_text())]
    assert not shipped, "answers belong in tests/checks/answers/:\n" + "\n".join(shipped)
