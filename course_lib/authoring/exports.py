"""The gradebook's files: a CSV for a spreadsheet, JSON, and the CSVs that Canvas and Gradescope
import as they are. No text cell starts with a character a spreadsheet would run as a formula.
"""
import csv
import json
from dataclasses import asdict
from pathlib import Path

# OWASP, "CSV Injection": a cell starting with = + - @ tab or carriage return is a formula to Excel,
# LibreOffice and Google Sheets; a leading ' makes them show it as text.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def safe_cell(value):
    """`value` as a spreadsheet shows it, never runs it: numbers as they are, risky text behind '."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return int(value) if float(value).is_integer() else round(value, 4)
    text = "" if value is None else str(value)
    return "'" + text if text.lstrip(" ").startswith(FORMULA_STARTS) else text


def _write(path: Path, header, rows, encoding="utf-8") -> None:
    with open(path, "w", newline="", encoding=encoding) as file:
        writer = csv.writer(file)
        writer.writerow([safe_cell(cell) for cell in header])
        writer.writerows([safe_cell(cell) for cell in row] for row in rows)


def gradebook_header(exercises) -> list:
    return (["learner", "name", "email", "lesson", "status", *exercises, "total", "maximum"]
            + [f"{name} feedback" for name in exercises]
            + ["notes", "graded at", "seconds", "sealed", "submission"])


def write_gradebook_csv(rows, path: Path, exercises) -> None:
    """A row per learner: points per exercise, total, maximum, feedback per exercise, notes, when,
    sealed or not, and the file graded. UTF-8 with a BOM, so Excel shows names as they are."""
    _write(path, gradebook_header(exercises), (
        [row.learner, row.name, row.email, row.lesson, row.status,
         *(row.points[name] for name in exercises), row.total, row.maximum,
         *(row.feedback.get(name, "") for name in exercises),
         "\n".join(row.notes), row.graded_at, row.seconds, row.sealed, row.submission]
        for row in rows), encoding="utf-8-sig")


def write_json(rows, path: Path, lesson: str, points: dict) -> None:
    Path(path).write_text(json.dumps(
        {"lesson": lesson, "exercises": [{"name": name, "points": value} for name, value in points.items()],
         "maximum": sum(points.values()), "learners": [asdict(row) for row in rows]},
        indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# Canvas, Grades > Import: the columns of Canvas's own export, "Student, ID, SIS User ID, SIS Login
# ID, Section", then a column per assignment named "Title (assignment id)" (a new title makes a new
# assignment), and the export's second row, "Points Possible". Canvas finds a student by ID (the
# Canvas user id), SIS User ID or SIS Login ID, so those come from the roster: a Canvas export used
# as the roster carries all three. Sources: "Import a CSV file to Carmen Grades" (Ohio State,
# teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-grades/
# import-csv-file-carmen-grades: Student Name or ID or SIS User ID, SIS Login ID, Section, then the
# assignment); "Detailed Canvas Export Info" (nemogb-dev.github.io/nemogb-r/articles/
# detailed-canvas-export-info.html: ID is the Canvas id, assignment columns like "Quiz 1 (87568490)").
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
CANVAS_POINTS_POSSIBLE = "    Points Possible"


def write_canvas(rows, path: Path, assignment: str) -> None:
    """A Canvas gradebook import: one assignment column (the total), a roster learner per row."""
    rows = [row for row in rows if row.in_roster]
    maximum = rows[0].maximum if rows else 0
    _write(path, CANVAS_COLUMNS + [assignment],
           [[CANVAS_POINTS_POSSIBLE, "", "", "", "", maximum]]
           + [[row.name or row.learner, _canvas_id(row), row.roster.get("sis user id", ""),
               row.roster.get("sis login id", row.learner), row.roster.get("section", ""), row.total]
              for row in rows])


def _canvas_id(row) -> str:
    """The Canvas user id: a "canvas id" column, or "id" when the roster's learner id is another."""
    if "canvas id" in row.roster:
        return row.roster["canvas id"]
    return row.roster.get("id", "") if row.roster.get("id") != row.learner else ""


# Gradescope matches a learner by Email (a roster's required column besides Name; SID optional:
# "Adding Students and Staff", guides.gradescope.com/hc/en-us/articles/21926598776333). Scores go in
# a column per question as Gradescope's own grade export names them ("<question> (<n> pts)"), with
# "Total Score" and "Max Points" as in that export ("Download Grades").
GRADESCOPE_COLUMNS = ["Name", "SID", "Email"]


def write_gradescope(rows, path: Path, points: dict) -> list:
    """A Gradescope score import: Name, SID, Email, a column per exercise, Total Score, Max Points.
    Returns the roster learners it has no email for (Gradescope cannot match them)."""
    rows = [row for row in rows if row.in_roster]
    questions = [f"{number}: {name} ({value:g} pts)"
                 for number, (name, value) in enumerate(points.items(), start=1)]
    _write(path, GRADESCOPE_COLUMNS + questions + ["Total Score", "Max Points"],
           [[row.name or row.learner, row.roster.get("sid", row.roster.get("sis user id", "")),
             _email(row), *(row.points[name] for name in points), row.total, row.maximum]
            for row in rows])
    return [row.learner for row in rows if not _email(row)]


def _email(row) -> str:
    return row.email or (row.learner if "@" in row.learner else "")
