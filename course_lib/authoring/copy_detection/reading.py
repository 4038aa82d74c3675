"""A cell read, never run: IPython's syntax to Python (magics' code included), the global names
it uses with their attribute chains, its imports, its top-level bindings, and its magics.
"""
import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache

from .constructs import CODE_MAGICS, FILE_CALLS, REACHING_ATTRIBUTES, REACHING_NAMES, SOURCE_PATH


@dataclass
class Use:
    root: str  # a global name
    attrs: tuple  # the attribute chain after it
    line: int
    args: list | None = None  # the call's arguments when the chain is called
    local_path: str | None = None  # a name a function imported for itself: what it imported


@dataclass
class Parsed:
    uses: list = field(default_factory=list)
    imports: list = field(default_factory=list)  # (path, top-level name or None, line, its path)
    syntax: list = field(default_factory=list)  # (construct, line) found without resolving names
    magics: list = field(default_factory=list)  # (name, argument, line)
    statements: list = field(default_factory=list)  # (names bound at top level, uses)
    own: set = field(default_factory=set)  # names this cell binds at top level, not by import
    python: str = ""  # the cell as Python, magics' code included


@lru_cache(maxsize=1)
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager()


@lru_cache(maxsize=4096)
def parse_cell(source: str) -> Parsed:
    """The cell read (cached: a class's notebooks share most of their cells; never mutated)."""
    parsed = Parsed()
    _parse_into(source, parsed, 0, depth=0)
    if re.search(r"\bget_ipython\b", source):
        parsed.syntax.append(("get_ipython()", 1))
    return parsed


_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def _parse_into(source, parsed, offset, depth):
    try:  # plain Python runs as it reads; IPython's syntax (magics, !, ?) is never valid Python
        python, tree = source, compile(source, "<cell>", "exec", _FLAGS)
    except (SyntaxError, ValueError):
        try:
            python = _transformer().transform_cell(source)
            tree = compile(python, "<cell>", "exec", _FLAGS)
        except (SyntaxError, ValueError):
            return  # a cell that does not parse does not run either
    ast.increment_lineno(tree, offset)
    parsed.python += python + "\n"
    reader = _Reader(parsed)
    reader.visit(tree)
    for name, argument, body, line in reader.magics:
        parsed.magics.append((name, argument, line))
        code = body if body is not None else (argument if name in ("time", "timeit") else None)
        if code and name in CODE_MAGICS and depth < 3:
            _parse_into(code, parsed, line, depth + 1)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


class _Reader(ast.NodeVisitor):
    """Collects uses of global names (with their attribute chains), imports, top-level bindings,
    magics, and the constructs that are found from the syntax alone."""

    def __init__(self, parsed):
        self.parsed, self.scopes, self.magics = parsed, [], []

    def visit_Module(self, node):
        for statement in node.body:
            before = len(self.parsed.uses)
            self.visit(statement)
            bound = _bound_names(statement, declared_globals=True)
            self.parsed.statements.append((bound, self.parsed.uses[before:], statement))
            if not isinstance(statement, (ast.Import, ast.ImportFrom)):
                self.parsed.own |= bound

    def _scoped(self, node, body):
        self.scopes.append(dict.fromkeys(_local_names(node)) | _local_imports(body))
        for child in body:
            self.visit(child)
        self.scopes.pop()

    def visit_FunctionDef(self, node):
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.visit(node.args)
        if node.name in ("__reduce__", "__reduce_ex__"):
            self.parsed.syntax.append((f"a {node.name} method", node.lineno))
        self._scoped(node, node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node):
        self.visit(node.args)
        self._scoped(node, [node.body])

    def _comprehension(self, node):
        self.visit(node.generators[0].iter)
        self.scopes.append(dict.fromkeys(_local_names(node)))
        for number, generator in enumerate(node.generators):
            if number:
                self.visit(generator.iter)
            for condition in generator.ifs:
                self.visit(condition)
        for part in ("elt", "key", "value"):
            if hasattr(node, part):
                self.visit(getattr(node, part))
        self.scopes.pop()

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_Import(self, node):
        for alias in node.names:
            bound = alias.asname or alias.name.split(".")[0]
            path = alias.name if alias.asname else alias.name.split(".")[0]
            self._import(alias.name, bound, path, node.lineno)

    def visit_ImportFrom(self, node):
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            self._import(f"{module}.{alias.name}", alias.asname or alias.name,
                         f"{module}.{alias.name}", node.lineno)

    def _import(self, path, bound, bound_path, line):
        top_level = not self.scopes and not path.endswith(".*")
        self.parsed.imports.append((path, bound if top_level else None, line, bound_path))

    def visit_Attribute(self, node):
        for part in _attributes(node):
            if part in REACHING_ATTRIBUTES:
                self.parsed.syntax.append((f".{part}", node.lineno))
        chain = name_chain(node)
        if chain and self._use(chain, node.lineno):
            return
        self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in REACHING_NAMES:
            self.parsed.syntax.append((node.id, node.lineno))
        if isinstance(node.ctx, ast.Load):
            self._use([node.id], node.lineno)

    def visit_Call(self, node):
        magic = _magic(node)
        if magic:
            self.magics.append((*magic, node.lineno))
            return
        chain = name_chain(node.func)
        if chain and self._use(chain, node.lineno, node.args):
            for part in _attributes(node.func):
                if part in REACHING_ATTRIBUTES:
                    self.parsed.syntax.append((f".{part}", node.lineno))
        else:
            self.visit(node.func)
        for argument in [*node.args, *node.keywords]:
            self.visit(argument)
        if chain and chain[-1] in FILE_CALLS or (chain and chain[0] in FILE_CALLS):
            for constant in ast.walk(node):
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str) \
                        and SOURCE_PATH.search(constant.value):
                    self.parsed.syntax.append((f"a file named {constant.value!r}", node.lineno))

    def _use(self, chain, line, args=None) -> bool:
        """Record a use of a global name, or of a name a function imported for itself."""
        for scope in reversed(self.scopes):
            if chain[0] in scope:
                if scope[chain[0]] is None:
                    return False
                self.parsed.uses.append(Use(chain[0], tuple(chain[1:]), line, args,
                                             scope[chain[0]]))
                return True
        self.parsed.uses.append(Use(chain[0], tuple(chain[1:]), line, args))
        return True


def name_chain(node) -> list | None:
    """['a', 'b', 'c'] for the expression a.b.c; None when it does not start with a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _attributes(node) -> list:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return parts


def _magic(call):
    """(name, argument, body) of an IPython magic or shell line the transformer made a call of:
    get_ipython().run_line_magic('time', 'x = 1'); body is a cell magic's code; None otherwise."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name) and func.value.func.id == "get_ipython"
            and all(isinstance(arg, ast.Constant) for arg in call.args) and call.args):
        return None
    args = [arg.value for arg in call.args]
    if func.attr in ("system", "getoutput"):
        return ("!", args[0], None)
    if func.attr == "run_line_magic" and len(args) == 2:
        return (args[0], args[1], None)
    if func.attr == "run_cell_magic" and len(args) == 3:
        return (args[0], args[1], args[2])
    return None


def _bound_names(statement, declared_globals=False) -> set:
    """The names a statement binds (defs, classes, assignments, imports, loops...); at the top
    level, with `declared_globals`, a def's `global name` too (it binds name when called)."""
    names = set()
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {statement.name} | {name for node in ast.walk(statement) if declared_globals
                                   and isinstance(node, ast.Global) for name in node.names}
    for node in _same_scope(statement):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def _same_scope(node):
    """The nodes of `node`'s own scope: nested functions and lambdas are not entered."""
    yield node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield child
        elif not isinstance(child, _SCOPES):
            yield from _same_scope(child)


def _local_imports(body) -> dict:
    """{name: imported path} for the imports of a function's own scope."""
    found = {}
    for statement in body:
        for node in _same_scope(statement):
            if isinstance(node, ast.Import):
                found |= {alias.asname or alias.name.split(".")[0]:
                          alias.name if alias.asname else alias.name.split(".")[0]
                          for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                found |= {alias.asname or alias.name: f"{node.module}.{alias.name}"
                          for alias in node.names if alias.name != "*"}
    return found


def _local_names(scope) -> set:
    """The names a function, lambda or comprehension binds in its own scope (less `global`s)."""
    if isinstance(scope, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        return {node.id for generator in scope.generators for node in ast.walk(generator.target)
                if isinstance(node, ast.Name)}
    arguments = scope.args
    names = {arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                 arguments.vararg, arguments.kwarg] if arg is not None}
    if isinstance(scope, ast.Lambda):
        return names
    declared = set()
    for statement in scope.body:
        names |= _bound_names(statement)
        for node in _same_scope(statement):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                declared |= set(node.names)
    return names - declared
