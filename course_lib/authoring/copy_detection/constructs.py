"""Item 2: the ways around a static reading (exec, importlib, frames, dunders, magics, shell,
pickle...), each found unless an honest answer of the lesson uses it.
"""
import ast
import re

from .finding import Finding


REACHING_ATTRIBUTES = {
    "__globals__", "__closure__", "__code__", "__dict__", "__subclasses__", "__builtins__",
    "__reduce__", "__reduce_ex__", "__mro__", "__bases__", "__base__", "__loader__", "__spec__",
    "__file__", "__func__", "__self__", "__wrapped__", "__defaults__", "__kwdefaults__",
    "__getattribute__", "__import__", "__traceback__", "__objclass__", "__setstate__",
    "f_back", "f_globals", "f_locals", "f_code", "f_builtins", "f_trace", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code", "co_consts",
    "co_names", "func_globals"}
REACHING_NAMES = {"__builtins__", "__loader__", "__spec__", "__import__", "__file__"}
_DYNAMIC_BUILTINS = {
    "eval": "runs code from a string", "exec": "runs code from a string",
    "compile": "makes code from a string", "__import__": "imports a module by name at run time",
    "globals": "reads the notebook's names by string", "locals": "reads names by string",
    "vars": "reads an object's names by string", "breakpoint": "stops in a debugger"}
_NAME_BY_STRING = {"getattr": 1, "setattr": 1, "delattr": 1, "operator.attrgetter": 0,
                   "operator.methodcaller": 0}
_MODULES = {  # any use of these
    "importlib": "imports modules by name at run time", "inspect": "reads code and frames",
    "ctypes": "reaches the interpreter's memory", "marshal": "loads code objects",
    "dill": "loads objects that can run code", "cloudpickle": "loads objects that can run code",
    "shelve": "loads objects that can run code", "copyreg": "changes how objects unpickle",
    "subprocess": "runs another program", "pty": "runs another program",
    "runpy": "runs a module or file", "code": "runs code from a string",
    "codeop": "compiles code from a string", "builtins": "reaches the builtins",
    "linecache": "reads source files", "pkgutil": "finds and imports modules by name",
    "zipimport": "imports from an archive", "site": "changes where modules come from",
    "ipykernel": "reaches the kernel", "nbformat": "reads notebooks", "nbclient": "runs notebooks",
    "__main__": "reaches the notebook's names by string"}
_QUALIFIED = [  # these names of a module (gc.collect, pickle.dumps, IPython.display are fine)
    (re.compile(r"sys\.(modules|_getframe|settrace|setprofile|meta_path|path_hooks|"
                r"path_importer_cache|addaudithook|monitoring|_current_frames|path)\b"),
     "reaches the interpreter's modules, frames or tracing"),
    (re.compile(r"threading\.(settrace|setprofile)"), "hooks the interpreter (tracing)"),
    (re.compile(r"os\.(system|popen|exec\w*|spawn\w*|posix_spawn\w*|fork\w*|startfile)$"),
     "runs another program"),
    (re.compile(r"gc\.(get_objects|get_referrers|get_referents|garbage)"),
     "reaches every live object"),
    (re.compile(r"pickle\.(loads?|Unpickler)\b"), "loads objects that can run code"),
    (re.compile(r"types\.(FunctionType|CodeType|LambdaType)\b"), "builds functions from code"),
    (re.compile(r"IPython\.(?!display\b)|IPython$"), "reaches the kernel")]
FILE_CALLS = {"open", "Path", "PurePath", "read_text", "read_bytes", "glob", "iglob", "listdir",
               "scandir", "walk", "copy", "copyfile", "copy2", "load", "run_path"}
SOURCE_PATH = re.compile(r"\.(py|pyc|ipynb|pth)\b|course_lib|/proc\b|ipynb_checkpoints")
# magics whose argument or body is Python, read like the cell; others run what cannot be read
CODE_MAGICS = {"time", "timeit", "capture", "distributed"}
MAGIC_CONSTRUCTS = ("the IPython magic", "the shell line")
_HARMLESS_MAGICS = {"matplotlib", "pwd", "who", "whos", "who_ls", "pinfo", "pinfo2", "lsmagic",
                    "magic", "precision", "psearch"}


def construct_findings(cell, course) -> list:
    """Item 2: each way around a static reading the cell uses and an honest answer does not."""
    allowed = course.allowed_constructs(cell)
    found = []
    for construct, line, why in construct_list(cell.parsed, cell.resolve):
        if construct not in allowed:
            found.append(Finding(cell.exercise, cell.index,
                                 f"line {line}: {construct} {why}: a reading of the code "
                                 f"cannot follow it, and an honest answer does not need it"))
    return found


def construct_list(parsed, resolve) -> list:
    """(construct, line, why) for each way around a static reading in a parsed cell."""
    found = [(what, line, "reaches code, frames or files the grader cannot read")
             for what, line in parsed.syntax]
    for path, _, line, _ in parsed.imports:
        module = path.lstrip(".").split(".")[0]
        if module in _MODULES:
            found.append((f"import of {module}", line, f"({_MODULES[module]})"))
        for pattern, why in _QUALIFIED:
            if pattern.match(path):
                found.append((path, line, f"({why})"))
    for use in parsed.uses:
        qualified = resolve(use)
        if qualified is None:
            continue
        module = qualified.split(".")[0]
        if module in _MODULES and "." in qualified:
            found.append((f"{module}.{qualified.split('.')[1]}", use.line, f"({_MODULES[module]})"))
        if qualified in _DYNAMIC_BUILTINS:
            found.append((f"{qualified}()", use.line, f"({_DYNAMIC_BUILTINS[qualified]})"))
        for pattern, why in _QUALIFIED:
            if pattern.match(qualified):
                found.append((qualified, use.line, f"({why})"))
        if qualified in _NAME_BY_STRING:
            found += _by_string(qualified, use)
    for name, argument, line in parsed.magics:
        if name in CODE_MAGICS or name in _HARMLESS_MAGICS:
            continue
        what = f"!{argument[:40]}" if name == "!" else f"%{name} {argument[:40]}".strip()
        found.append((f"{MAGIC_CONSTRUCTS[name == '!']} {what}", line,
                      "(runs code or commands the grader cannot read)"))
    return found


def _by_string(function, use) -> list:
    position = _NAME_BY_STRING[function]
    if use.args is None:
        return [(f"{function} passed around", use.line, "(looks names up by string)")]
    if len(use.args) <= position:
        return []
    name = use.args[position]
    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
        return [(f"{function}() with a computed name", use.line, "(looks names up by string)")]
    if name.value.startswith("__") and name.value.endswith("__") or name.value in \
            REACHING_ATTRIBUTES:
        return [(f"{function}(..., {name.value!r})", use.line, "(reaches into code or frames)")]
    return []
