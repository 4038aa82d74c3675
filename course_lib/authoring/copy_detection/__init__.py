"""A submission that reaches or copies the course's own reference answers, found by reading it.

    findings(notebook, solution) -> list[Finding]

`notebook` is the learner's nbformat notebook, `solution` the course's solution notebook of the
same lesson: it says which cells are exercises (a `### BEGIN SOLUTION` region, matched to the
learner's cell by cell id, else by the check cell under it), what the lesson itself imports, and
what an honest answer uses. Nothing is run: the source text is read (IPython syntax through
IPython's own transformer). Each Finding names the exercise (the grader its check cell calls,
e.g. 'check_train_with_accumulation'; None for a cell outside any exercise), the learner's cell
index, and a one-line reason. An empty list: nothing found.

What is read, in the learner's cells that are not the course's own (a cell whose text is a
lesson cell's, a check cell that grading restores, are the course's):

1. course internals: an import from course_lib that the lesson does not import; in an exercise
   cell, any course_lib name the solution's own exercise cell does not use (the lesson's
   demonstrations may use reference answers, an exercise may not), directly, through a helper
   defined in another cell, or by binding the exercise's own name to it;
2. ways around a static reading (exec, importlib, frames, dunders, magics, shell, pickle...),
   except those the solution's exercise cells use (and, in an edited course cell, those the
   course cell had);
3. copied text: the cell's tokens (no comments, every string one token, every name but
   builtins, keywords and attributes one placeholder: renaming changes nothing) in 8-token grams,
   against every function and class of course_lib's topics, checks, training and examples. Only
   a unit's grams that the lesson's solution notebook does not hold count (what the lesson
   writes or shows with inspect.getsource is not a copy; where the course's answer is its
   reference, only the reference's other text can tell them apart), each weighted
   1 / (units holding it), so common idioms weigh little. A cell that holds COPY_THRESHOLD (0.6)
   of a unit's weight, in 8 or more grams, of a unit with 20 or more, is a copy (a unit of a line
   or two, `grad = grad.clone(); dist.all_reduce(grad); return grad`, is an idiom, not evidence).
   Measured on tests/checks/answers: correct alternatives score at most 0.51, the course's own
   functions given as wrong answers 0.71 to 1.0, a renamed paste of accumulate_with_no_sync and
   its helper 0.88. Docstring and comment sentences of the course's code, word for word, too.
"""
from .constructs import construct_findings
from .finding import Finding
from .internals import helper_findings, internal_findings
from .notebook import lesson_of, read_notebook
from .reading import parse_cell
from .similarity import COPY_THRESHOLD, cell_grams, copy_findings, course_corpus, unit_scores

__all__ = ["Finding", "findings", "copy_scores", "COPY_THRESHOLD"]


def findings(notebook, solution) -> list:
    """What in `notebook` reaches or copies the course's reference code (see the module doc)."""
    course = lesson_of(solution)
    cells = read_notebook(notebook, course)
    found = []
    for cell in cells:
        if cell.role in ("course", "check"):
            continue
        found += internal_findings(cell, course)
        found += construct_findings(cell, course)
        found += copy_findings(cell, course)
    found += helper_findings(cells, course)
    unique = list(dict.fromkeys(found))
    return sorted(unique, key=lambda finding: finding.cell_index)


def copy_scores(source: str, solution) -> list:
    """[(score, 'file:name')] best first: how much of each course unit's distinctive text the
    code `source` holds, for `solution`'s lesson (what the threshold is calibrated on)."""
    course, corpus = lesson_of(solution), course_corpus()
    scores = [(score, f"{corpus.units[unit].file}:{corpus.units[unit].name}")
              for score, unit in unit_scores(cell_grams(parse_cell(source)), course)]
    return sorted(scores, reverse=True)
