"""Item 3: copied text. A cell's normalised token grams against every function and class of the
course's reference code, less what the lesson writes or shows; docstring sentences word for word.
"""
import ast
import builtins
import keyword
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .finding import Finding

PACKAGE = Path(__file__).resolve().parents[2]  # course_lib/
CORPUS = ("topics", "checks", "training", "examples")  # where the course's reference code lives
GRAM = 8  # tokens per gram
COPY_THRESHOLD = 0.6  # weighted share of a course unit's distinctive grams in one learner cell
MIN_DISTINCTIVE = 20  # a unit with fewer distinctive grams (a line or two) is an idiom
MIN_MATCHED = 8  # fewer grams in common than this (a statement or so): a shape, not a copy
MIN_COMMENT = 30  # characters of a docstring or comment line copied word for word


_KEEP = set(dir(builtins)) | set(keyword.kwlist) | {"self", "cls"}
LEXEME = re.compile(r"""(?P<string>[rRbBuUfF]{0,2}(?:'{3}[\s\S]*?'{3}|"{3}[\s\S]*?"{3}"""
                     r"""|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))|(?P<comment>#[^\n]*)|(?P<name>[A-Za-z_]\w*)"""
                     r"""|(?P<number>\d[\w.]*)|(?P<other>[^\s\w])""")


def _tokens(text: str) -> list:
    """The normalised tokens of Python text: no comments, every string `s`, every name `v` but
    builtins, keywords and attributes (after a dot: an API's names, which a copy keeps)."""
    tokens = []
    for match in LEXEME.finditer(text):
        kind, value = match.lastgroup, match.group()
        if kind == "comment":
            continue
        if kind == "string":
            value = "s"
        elif kind == "name" and value not in _KEEP and (not tokens or tokens[-1] != "."):
            value = "v"
        tokens.append(value)
    return tokens


def _grams(tokens) -> set:
    return {" ".join(tokens[start:start + GRAM]) for start in range(len(tokens) - GRAM + 1)}


def cell_grams(parsed) -> set:
    return _python_grams(parsed.python)


@lru_cache(maxsize=4096)
def _python_grams(python: str) -> frozenset:
    return frozenset(_grams(_tokens(python)))


def text_lines(source: str) -> set:
    """The sentences of a text's comments and strings (docstrings, messages), lower case, as
    compared word for word: an honest answer shares code lines with the course, not sentences."""
    found = set()
    for match in LEXEME.finditer(source):
        if match.lastgroup in ("comment", "string"):
            for line in match.group().splitlines():
                words = " ".join(line.strip().lstrip("#rRbBuUfF").strip("\"' ").split()).lower()
                if len(words) >= MIN_COMMENT:
                    found.add(words)
    return found


@dataclass
class _Unit:
    file: str
    name: str
    grams: frozenset
    lines: frozenset


@dataclass
class _Corpus:
    units: list
    by_gram: dict  # gram -> indexes of the units that hold it
    by_line: dict  # docstring or comment line -> indexes of the units that hold it
    by_name: dict  # (module, qualified name) -> unit index


@lru_cache(maxsize=1)
def course_corpus() -> _Corpus:
    """Every function and class of course_lib's reference code, tokenised once per process."""
    corpus = _Corpus([], {}, {}, {})
    for folder in CORPUS:
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            _add_module(corpus, path)
    return corpus


def _add_module(corpus, path):
    source = path.read_text()
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    module = module.removesuffix(".__init__")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return
    lines = source.splitlines()
    nested = [(node, node.name) for node in tree.body if isinstance(node, _DEFINITIONS)]
    while nested:
        node, name = nested.pop()
        nested += [(child, f"{name}.{child.name}") for child in node.body
                   if isinstance(child, _DEFINITIONS)]
        text = "\n".join(lines[node.lineno - 1:node.end_lineno])
        unit = _Unit(str(path.relative_to(PACKAGE.parent)), name, frozenset(_grams(_tokens(text))),
                     frozenset(text_lines(text)))
        corpus.by_name[(module, name)] = len(corpus.units)
        for gram in unit.grams:
            corpus.by_gram.setdefault(gram, []).append(len(corpus.units))
        for line in unit.lines:
            corpus.by_line.setdefault(line, []).append(len(corpus.units))
        corpus.units.append(unit)


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def distinctive_sizes(solution_grams) -> tuple:
    """For each unit: how many of its grams the lesson's solution notebook does not hold, and
    their weight (a gram that many units share, a common idiom, weighs less: 1 / units)."""
    corpus = course_corpus()
    sizes = [len(unit.grams) for unit in corpus.units]
    weights = [sum(_weight(gram) for gram in unit.grams) for unit in corpus.units]
    for gram in solution_grams:
        for unit in corpus.by_gram.get(gram, ()):
            sizes[unit] -= 1
            weights[unit] -= _weight(gram)
    return sizes, weights


def _weight(gram) -> float:
    return 1 / len(course_corpus().by_gram.get(gram, (0,)))


def unit_scores(grams, course) -> list:
    """[(score, unit)] for the units whose distinctive grams `grams` holds MIN_MATCHED or more
    of: the weighted share of the unit's distinctive text that the code holds."""
    corpus, hits, counts = course_corpus(), {}, {}
    sizes, weights = course.distinctive
    for gram in grams - course.solution_grams:
        for unit in corpus.by_gram.get(gram, ()):
            hits[unit] = hits.get(unit, 0) + _weight(gram)
            counts[unit] = counts.get(unit, 0) + 1
    return [(weight / weights[unit], unit) for unit, weight in hits.items()
            if sizes[unit] >= MIN_DISTINCTIVE and counts[unit] >= MIN_MATCHED]


def units_of(path: str) -> set:
    """The units a dotted name stands for: a function, a class and its methods, a module."""
    corpus = course_corpus()
    parts = path.split(".")
    if len(parts) == 2 and parts[0] == "course_lib" and parts[1] in facade():
        parts = [*facade()[parts[1]].split("."), parts[1]]
    for split in range(len(parts), 0, -1):
        module, name = ".".join(parts[:split]), ".".join(parts[split:])
        found = {unit for (unit_module, unit_name), unit in corpus.by_name.items()
                 if unit_module == module and (not name or unit_name == name
                                               or unit_name.startswith(name + "."))}
        if found:
            return found
    return set()


@lru_cache(maxsize=None)
def module_constants(module: str) -> frozenset:
    """The names a course module binds at its top level to a literal or a product of literals
    (GiB = 2**30, PRECISIONS = {...}): data, not code."""
    path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
    if not module.startswith("course_lib.") or not path.exists():
        return frozenset()
    names = set()
    for node in ast.parse(path.read_text()).body:
        value = getattr(node, "value", None)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and value is not None and not any(
                isinstance(part, (ast.Call, ast.Lambda, ast.Name)) for part in ast.walk(value)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
    return frozenset(names)


@lru_cache(maxsize=1)
def facade() -> dict:
    """course_lib's lazy facade, {name: module}, read from its _EXPORTS without importing it."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_EXPORTS":
            return ast.literal_eval(node.value)
    return {}


def copy_findings(cell, course) -> list:
    """The course unit whose distinctive text this cell holds the most of, past the threshold;
    and docstring or comment lines of the course's code copied word for word."""
    corpus, scores = course_corpus(), unit_scores(cell_grams(cell.parsed), course)
    found = []
    if scores and max(scores)[0] >= COPY_THRESHOLD:
        score, unit = max(scores)
        found.append(Finding(cell.exercise, cell.index, _copied(corpus.units[unit], score)))
    for line in sorted(text_lines(cell.source) - course.solution_lines):
        for unit in corpus.by_line.get(line, ())[:1]:
            found.append(Finding(cell.exercise, cell.index, f"the line {line[:50]!r}... is "
                                 f"{corpus.units[unit].file}'s {corpus.units[unit].name}, word for "
                                 f"word: the course's own code, copied"))
    return found


def _copied(unit, score) -> str:
    return (f"its code is {unit.file}'s {unit.name}, renamed or not ({score:.0%} of the text "
            f"that reference has and the lesson does not show): the course's own code, copied; "
            f"write the answer yourself")
