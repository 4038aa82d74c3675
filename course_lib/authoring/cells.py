"""The roles a notebook cell plays in the course: exercise, check, solution-only, or plain.

The markers are nbgrader's and nbval's, so both tools read our notebooks as they are.
"""
import re

BEGIN_SOLUTION = "### BEGIN SOLUTION"
END_SOLUTION = "### END SOLUTION"
CHECK_MARKER = "# NBVAL_CHECK_OUTPUT"
IGNORE_MARKER = "# NBVAL_IGNORE_OUTPUT"
SOLUTION_TAG = "solution"
STUB = 'raise NotImplementedError("Exercise: write this part, then run the check cell below")'
SKELETON_STEP = "# Step "  # a comment in a solution region that the lesson's stub keeps, in order
GRADER_CALL = re.compile(r"\b(check_\w+)\s*\(")


def is_code(cell) -> bool:
    return cell.cell_type == "code"


def is_check_cell(cell) -> bool:
    """A check cell starts with `# NBVAL_CHECK_OUTPUT` and calls a grader."""
    return is_code(cell) and cell.source.lstrip().startswith(CHECK_MARKER)


def is_exercise_cell(cell) -> bool:
    """An exercise cell holds a `### BEGIN SOLUTION` region (solutions) or its stub (lessons)."""
    return is_code(cell) and (BEGIN_SOLUTION in cell.source or STUB in cell.source)


def is_solution_only(cell) -> bool:
    """Cells tagged `solution` exist in solutions/ only."""
    return SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def exercise_name(cell) -> str:
    """The grader a check cell calls (e.g. 'check_ring_allreduce'), else its first real line."""
    found = GRADER_CALL.search(cell.source)
    if found:
        return found.group(1)
    lines = [line.strip() for line in cell.source.splitlines()]
    return next((line for line in lines if line and not line.startswith("# NBVAL")), "check")
