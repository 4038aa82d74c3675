"""A submission that reaches or copies the course's reference answers is found by reading it
(course_lib/authoring/copy_detection/), and no honest answer is: every solution, every lesson
stub and every correct alternative of tests/checks/answers reads clean.

Fast: nothing is executed, the course's sources are tokenised once per process.
"""
import copy
import inspect
import re
import sys
import textwrap
from functools import lru_cache
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from course_lib.authoring.build import build_lesson
from course_lib.authoring.cells import is_solution_only
from course_lib.authoring.copy_detection import COPY_THRESHOLD, copy_scores, findings
from course_lib.authoring.copy_detection.notebook import lesson_of as read_lesson
from course_lib.topics import accumulation

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "checks"))  # tests/checks/answers, as its tests import it

from answers import answer_modules, lesson_of  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@lru_cache(maxsize=None)
def solution(number: str):
    return nbformat.read(next((ROOT / "solutions").glob(f"{number}_*.ipynb")), as_version=4)


@lru_cache(maxsize=None)
def lesson(number: str):
    """The lesson as build-lessons writes it (lessons/ must equal it: test_notebooks says so)."""
    return build_lesson(solution(number), f"{number}.ipynb", ROOT)


def numbers():
    return sorted(path.name[:2] for path in (ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))


def submission(number: str, exercise_source: str = None, extra: list = (), grader: str = None):
    """Lesson `number` as a learner hands it in: the first exercise cell (of `grader`'s
    exercise, if given) holding `exercise_source`, `extra` cells appended at the end."""
    notebook = copy.copy(lesson(number))  # cells shared with the lesson, never edited in place
    notebook.cells = list(notebook.cells) + [new_code_cell(source) for source in extra]
    if exercise_source is not None:
        index = notebook.cells.index(exercise_cell(notebook, number, grader))
        notebook.cells[index] = copy.copy(notebook.cells[index])
        notebook.cells[index].source = exercise_source
    return notebook


def exercise_cell(notebook, number, grader=None):
    """The learner's cell of `grader`'s exercise (by the solution's cell id), else the first."""
    course = read_lesson(solution(number))
    wanted = [cell_id for cell_id, name in course.exercise_ids.items() if grader in (None, name)]
    return next(cell for cell in notebook.cells if cell.get("id") in wanted)


def reasons(notebook, number):
    return [f"cell {found.cell_index} ({found.exercise}): {found.reason}"
            for found in findings(notebook, solution(number))]


# Every honest text reads clean

def test_every_solution_and_every_lesson_stub_reads_clean():
    dirty = []
    for number in numbers():
        handed_in = copy.deepcopy(solution(number))  # solutions/ less its solution-only cells:
        handed_in.cells = [cell for cell in handed_in.cells if not is_solution_only(cell)]
        for kind, notebook in (("solution", handed_in), ("stub", lesson(number))):
            dirty += [f"{number} {kind}: {reason}" for reason in reasons(notebook, number)]
    assert not dirty, "honest notebooks flagged:\n" + "\n".join(dirty)


def test_the_clean_check_sees_a_solution_that_reaches_the_course():
    """Probe: the test above would fail on a solution that imports a reference answer."""
    notebook = copy.deepcopy(solution("05"))
    cell = exercise_cell(notebook, "05")
    cell.source = "from course_lib.topics.accumulation import _accumulate\n" + cell.source
    assert reasons(notebook, "05")


def sources_of(values):
    """(name, source) of each function or class among an answer's arguments."""
    for value in values:
        if inspect.isfunction(value) or inspect.isclass(value):
            try:
                yield value.__qualname__, textwrap.dedent(inspect.getsource(value))
            except (OSError, TypeError):
                continue
        elif isinstance(value, (tuple, list)):
            yield from sources_of(value)
        elif isinstance(value, dict):
            yield from sources_of(value.values())


def answers_of(table_name):
    """(lesson number, grader name, answer name, its source) for each answer in the tables."""
    for module in answer_modules():
        for check, cases in getattr(module, table_name, {}).items():
            number = lesson_of(check.__module__)[-2:]
            for case in cases:
                values = ([*case.values[0], *case.values[1].values()]
                          if table_name == "ALTERNATIVES" else [*case.args, *case.kwargs.values()])
                for name, source in sources_of(values):
                    yield number, check.__name__, name, source


def test_every_correct_alternative_reads_clean_in_its_exercise_cell():
    alternatives = list(answers_of("ALTERNATIVES"))
    assert len(alternatives) > 50, "fewer alternatives than the answers hold: is the walk right?"
    dirty = [f"{number} {grader} {name}: {reason}"
             for number, grader, name, source in alternatives
             for reason in reasons(submission(number, source, grader=grader), number)]
    assert not dirty, "correct alternatives flagged:\n" + "\n".join(dirty)


# Wrong answers that are the course's own code: found (the others are wrong, not copied)

COURSE_WRONG_ANSWERS = {
    ("05", "accumulate_with_no_sync"), ("05", "accumulate_off_by_one"),
    ("05", "through_the_course_helper"), ("03", "naive_all_reduce"), ("02", "gather"),
}


def test_wrong_answers_that_are_the_courses_code_are_found():
    flagged = {(number, name): reasons(submission(number, source, grader=grader), number)
               for number, grader, name, source in answers_of("WRONG_ANSWERS")
               if (number, name) in COURSE_WRONG_ANSWERS}
    assert set(flagged) == COURSE_WRONG_ANSWERS
    missed = [key for key, found in flagged.items() if not found]
    assert not missed, f"wrong answers that are the course's own code, not flagged: {missed}"


# 1. Course internals

EXERCISE_05 = ("def train_with_accumulation(ddp_model, optimizer, micro_batches, "
               "grad_accum_steps):\n")
ARGUMENTS = "(ddp_model, optimizer, micro_batches, grad_accum_steps)\n"


def test_a_reference_imported_in_the_exercise_is_found():
    source = ("from course_lib.topics.accumulation import accumulate_with_no_sync\n" + EXERCISE_05
              + "    return accumulate_with_no_sync(ddp_model, optimizer, micro_batches, "
              "grad_accum_steps)\n")
    found = reasons(submission("05", source), "05")
    assert any("course_lib.topics.accumulation.accumulate_with_no_sync" in r
               for r in found), found
    assert all("check_train_with_accumulation" in r for r in found), found


def test_a_reference_imported_under_an_alias_in_another_cell_is_found():
    source = EXERCISE_05 + "    return helper" + ARGUMENTS
    extra = ["from course_lib.topics.accumulation import accumulate_with_no_sync as helper"]
    found = reasons(submission("05", source, extra), "05")
    assert any("uses course_lib.topics.accumulation.accumulate_with_no_sync" in r
               for r in found), found


def test_a_helper_in_another_cell_that_calls_the_reference_is_found():
    source = EXERCISE_05 + "    return my_loop" + ARGUMENTS
    helper = ("def my_loop(*args):\n    import course_lib.topics.accumulation as course\n"
              "    return course.accumulate_with_no_sync(*args)\n")
    found = reasons(submission("05", source, [helper]), "05")
    assert any("my_loop" in r and "accumulate_with_no_sync" in r for r in found), found


def test_a_course_cell_function_that_wraps_a_reference_is_not_for_the_exercise_its_data_is():
    """A lesson cell that defines a function around the course's loop: an exercise calling it
    is found; the results a demonstration computed (data, no answer to fresh inputs) are not."""
    course = copy.deepcopy(solution("05"))
    demo = ("def course_loop(*args):\n    return accumulate_with_no_sync(*args)\n\n"
            "course_losses = course_loop(None, None, [], 1)")
    course.cells.insert(2, new_code_cell(demo))
    handed_in = build_lesson(course, "05.ipynb", ROOT)
    cell = exercise_cell(handed_in, "05")
    cell.source = EXERCISE_05 + "    return course_loop" + ARGUMENTS
    found = [found.reason for found in findings(handed_in, course)]
    assert any("course_loop" in r and "accumulate_with_no_sync" in r for r in found), found
    cell.source = EXERCISE_05 + "    return list(course_losses)\n"
    assert findings(handed_in, course) == []


def test_the_exercise_name_rebound_through_global_in_a_later_cell_is_found():
    later = ("from course_lib.topics.accumulation import accumulate_with_no_sync\n\n"
             "def swap():\n    global train_with_accumulation\n"
             "    train_with_accumulation = accumulate_with_no_sync\n\nswap()")
    found = reasons(submission("05", None, [later]), "05")
    assert any("binds train_with_accumulation" in r for r in found), found


def test_the_exercise_name_bound_to_the_reference_in_a_later_cell_is_found():
    later = "train_with_accumulation = accumulate_with_no_sync"
    found = reasons(submission("05", None, [
        "from course_lib.topics.accumulation import accumulate_with_no_sync", later]), "05")
    assert any("binds train_with_accumulation" in r for r in found), found


def test_a_name_the_setup_cell_imports_for_a_demonstration_is_not_for_the_exercise():
    """Lesson 15's first cell imports DDPFromScratch for its demonstrations; an exercise cell
    that subclasses it is found, while the lesson's own cells that use it are not."""
    source = "class OverlappingDDP(DDPFromScratch):\n    pass\n"
    found = reasons(submission("15", source, grader="check_overlapping_ddp"), "15")
    assert any("course_lib.topics.from_scratch.DDPFromScratch" in r for r in found), found


def test_a_course_lib_module_the_lesson_does_not_import_is_found_in_any_cell():
    found = reasons(submission("05", None, ["from course_lib.checks.engine import oracle"]), "05")
    assert any("which this lesson does not import" in r for r in found), found


def test_plumbing_and_timing_tools_are_allowed_in_an_exercise_and_the_trainer_is_not():
    body = ("model = make_model(seed=0)\nstep_seconds = [time_it(lambda: model, repeats=2)]\n"
            "warmup_steps, samples_per_second = 0, 32 / step_seconds[0]\n")
    assert reasons(submission("01", body, grader="check_throughput"), "01") == []
    body = EXERCISE_05 + "    return Trainer(ddp_model, micro_batches, TrainConfig()).fit()\n"
    found = reasons(submission("05", body), "05")
    assert any("uses course_lib.Trainer" in r for r in found), found


def test_a_constant_the_lesson_imports_is_allowed_in_an_exercise():
    body = ("def recipes_that_fit(n_parameters, gpu_memory_bytes, world_size, activation_bytes):\n"
            "    cards = gpu_memory_bytes / GiB\n"
            "    return [recipe for recipe in RECIPES if estimate_memory(\n"
            "        n_parameters, recipe.optimizer, recipe.precision, recipe.strategy, world_size,\n"
            "        activation_bytes).total / GiB <= cards]\n")
    assert reasons(submission("11", body, grader="check_recipes_that_fit"), "11") == []


def test_the_lessons_own_imports_and_magics_in_a_learner_cell_are_not_findings():
    extra = ["from course_lib import launch, make_model\nmodel = make_model()"]
    assert reasons(submission("05", None, extra), "05") == []
    assert reasons(submission("03", None, ["%load_ext course_lib"]), "03") == []
    assert reasons(submission("05", None, ["%load_ext course_lib"]), "05")  # not lesson 05's


# 2. Ways around a static reading: each found in an exercise cell; its honest twin is not

CONSTRUCTS = [  # (what, flagged code, an honest twin)
    ("importlib", "import importlib\nimportlib.import_module('os')", "import os"),
    ("__import__", "m = __import__('course_lib.topics')", "m = 1"),
    ("exec", "exec('x = 1')", "x = 1"),
    ("eval", "x = eval('1 + 1')", "x = 1 + 1"),
    ("compile", "code = compile('1', 'f', 'eval')", "code = '1'"),
    ("sys.modules", "import sys\nm = sys.modules['course_lib']", "import sys\nm = sys.argv"),
    ("globals", "f = globals()['accumulate_with_no_sync']", "f = len"),
    ("vars", "f = vars(course)['x']", "f = course.x"),
    ("locals", "f = locals()['x']", "f = x"),
    ("computed name", "f = getattr(module, name)", "f = getattr(module, 'weight')"),
    ("'__globals__'", "g = getattr(train, '__globals__')", "g = getattr(train, 'bias')"),
    ("setattr", "setattr(module, name, 1)", "setattr(module, 'weight', 1)"),
    (".__globals__", "g = train.__globals__", "g = train.weight"),
    (".__globals__", "g = train.__globals__.get('x')", "g = train.weights.get('x')"),
    ("import of __main__", "import __main__\n__main__.f = g", "import math\nmath.f = g"),
    (".__closure__", "c = train.__closure__", "c = train.bias"),
    (".__code__", "c = train.__code__", "c = train.grad"),
    (".__dict__", "d = model.__dict__", "d = model.state_dict()"),
    (".__subclasses__", "s = object.__subclasses__()", "s = object()"),
    (".__builtins__", "b = train.__builtins__", "b = train"),
    (".__reduce__", "r = model.__reduce__()", "r = model"),
    (".f_back", "frame = frame.f_back", "frame = frame.back"),
    (".gi_frame", "frame = generator.gi_frame", "frame = next(generator)"),
    ("inspect", "import inspect\nsource = inspect.getsource(f)", "source = str(f)"),
    ("gc", "import gc\nobjects = gc.get_objects()", "import gc\ngc.collect()"),
    ("ctypes", "import ctypes", "import math"),
    ("sys.settrace", "import sys\nsys.settrace(None)", "import sys\nsys.exit"),
    ("sys.setprofile", "import sys\nsys.setprofile(None)", "import sys\nsys.version"),
    ("get_ipython()", "get_ipython().run_cell('x = 1')", "x = 1"),
    ("%run", "%run other.py", "%time x = 1"),
    ("%load", "%load other.py", "%matplotlib inline"),
    ("shell line", "!cat other.ipynb", "x = 'cat'"),
    ("%bash", "%%bash\nls", "%%time\nx = 1"),
    ("%script", "%%script python\nprint(1)", "%%capture\nprint(1)"),
    ("%writefile", "%%writefile pytest.py\nx = 1", "x = 1"),
    ("pickle", "import pickle\nx = pickle.loads(data)", "import pickle\nx = pickle.dumps(data)"),
    ("IPython", "import IPython\nshell = IPython.get_ipython()",
     "from IPython.display import display\ndisplay(1)"),
    ("types.FunctionType", "import types\nf = types.FunctionType(code, {})",
     "import types\nspace = types.SimpleNamespace(a=1)"),
    ("marshal", "import marshal\nx = marshal.loads(data)", "x = bytes(data)"),
    ("a file named", "text = open('/course/solutions/05_accumulation.ipynb').read()",
     "text = open(path).read()"),
    ("a file named", "text = open('../anna/05_accumulation.ipynb').read()",
     "text = open('losses.json').read()"),
    ("subprocess", "import subprocess\nsubprocess.run(['ls'])", "import os\nos.getpid()"),
    ("os.system", "import os\nos.system('ls')", "import os\nos.getcwd()"),
    ("eval", "%time x = eval('1')", "%time x = 1"),  # a magic's code is read too
    ("exec", "%%distributed\nexec('x = 1')", "%%distributed\nx = 1"),
]


@pytest.mark.parametrize("what, flagged, honest", CONSTRUCTS, ids=[f"{i}-{c[0]}" for i, c in
                                                                  enumerate(CONSTRUCTS)])
def test_each_way_around_a_static_reading_is_found_and_its_honest_twin_is_not(what, flagged,
                                                                             honest):
    body = EXERCISE_05 + textwrap.indent(flagged, "    ") + "\n" if "%" not in flagged else flagged
    twin = EXERCISE_05 + textwrap.indent(honest, "    ") + "\n" if "%" not in honest else honest
    found = reasons(submission("05", body), "05")
    assert any(what in r for r in found), f"{what!r} not found in {found}"
    assert reasons(submission("05", twin), "05") == []


def test_a_construct_in_a_learner_cell_outside_the_exercises_is_found_too():
    found = reasons(submission("05", None, ["import inspect\nprint(inspect.getsource(len))"]), "05")
    assert any("inspect" in r and "(None)" in r for r in found), found


def test_a_construct_the_lessons_own_cells_use_stays_allowed_in_an_edited_copy_of_that_cell():
    """Lesson 04 runs torchrun through subprocess in a course cell: a learner who edits that
    cell is not flagged for the subprocess the course wrote, but is in a new cell."""
    notebook = copy.deepcopy(lesson("04"))
    cell = next(cell for cell in notebook.cells if "subprocess.Popen(" in cell.source)
    cell.source = cell.source.replace("timeout=timeout)", "timeout=2 * timeout)")
    assert "2 * timeout" in cell.source and reasons(notebook, "04") == []
    notebook.cells.append(new_code_cell(cell.source))
    found = reasons(notebook, "04")
    assert any("subprocess" in r for r in found), found


# 3. Copied text

RENAMES = {"ddp_model": "net", "optimizer": "opt", "micro_batches": "batches", "losses": "history",
           "step_loss": "running", "micro_step": "index", "is_last": "ends_group", "last": "done",
           "_accumulate": "loop", "accumulate_with_no_sync": "train_with_accumulation",
           "grad_accum_steps": "k", "loss": "value"}


def pasted_reference() -> str:
    """inspect.getsource of the course's accumulate_with_no_sync and its helper, every name
    renamed, docstrings gone: what a learner who wants the grade without the work pastes."""
    text = inspect.getsource(accumulation.accumulate_with_no_sync) + "\n\n" + \
        inspect.getsource(accumulation._accumulate)
    text = re.sub(r'\n    """[\s\S]*?"""', "", text)
    return re.sub(r"\b(" + "|".join(RENAMES) + r")\b", lambda m: RENAMES[m.group()], text)


def test_a_pasted_renamed_reference_is_found():
    source = pasted_reference()
    assert "accumulate" not in source and '"""' not in source
    score, where = copy_scores(source, solution("05"))[0]
    assert score >= COPY_THRESHOLD, (score, where)
    found = reasons(submission("05", source), "05")
    assert any("course_lib/topics/accumulation.py" in r and "copied" in r for r in found), found


def test_copy_scores_of_the_correct_alternatives_stay_under_the_threshold():
    """Probe of the threshold: the best score of any honest alternative, and the margin."""
    best = max((copy_scores(source, solution(number)) or [(0.0, "")])[0][0]
               for number, _, name, source in answers_of("ALTERNATIVES"))
    assert best < COPY_THRESHOLD, best


def test_a_paste_is_found_in_a_notebook_without_cell_ids_too():
    """nbformat 4.4 notebooks have no cell ids: the exercise is the cell above its check cell."""
    notebook = copy.deepcopy(submission("05", pasted_reference()))
    for cell in notebook.cells:
        cell.pop("id", None)
    found = reasons(notebook, "05")
    assert any("check_train_with_accumulation" in r and "copied" in r for r in found), found


def test_a_docstring_sentence_of_the_course_copied_word_for_word_is_found():
    docstring = inspect.getdoc(accumulation.accumulate_with_no_sync).splitlines()[0]
    source = EXERCISE_05 + f'    """{docstring}"""\n    return []\n'
    found = reasons(submission("05", source), "05")
    assert any("word for word" in r for r in found), found
