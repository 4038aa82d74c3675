"""Notebooks under nbval, two at a time: a notebook's run keeps less than one of two cores busy
(its kernel, pytest and its ranks start, import and wait on each other), so the next selected
notebook starts while a test waits for its own. Each runs on a copy in a folder of its own, so a
solution and its lesson running side by side never share a file they write. A notebook whose cells
measure speed (a performance lesson) runs with nothing beside it.
"""
import shutil
import tempfile
import threading
from pathlib import Path

from course_lib.authoring.grading import run_nbval


class NotebookRuns:
    """Runs the notebooks of `order` (the tests' order), at most two at once; `results(path)`
    starts that notebook and the next one if neither must run alone, and waits for its own."""

    def __init__(self, order, run_alone, timeout_s, sanitize_file):
        self.order, self.run_alone = list(order), run_alone
        self.timeout_s, self.sanitize_file = timeout_s, sanitize_file
        self.runs = {}  # path -> (thread, outcome: {"results": [...]} or {"error": exception})

    def results(self, notebook: Path) -> list:
        """The notebook's CellResults, as run_nbval returns them (its errors raised here)."""
        position = self.order.index(notebook)
        if self.run_alone(notebook):
            self.wait_all()
        self._start(notebook)
        following = self.order[position + 1:position + 2]
        if following and not self.run_alone(notebook) and not self.run_alone(following[0]):
            self._start(following[0])
        thread, outcome = self.runs[notebook]
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["results"]

    def wait_all(self) -> None:
        """Wait for every notebook started (a test stopped early leaves one running)."""
        for thread, _ in self.runs.values():
            thread.join()

    def _start(self, notebook: Path) -> None:
        if notebook in self.runs:
            return
        outcome = {}
        thread = threading.Thread(target=self._run, args=(notebook, outcome), daemon=True)
        self.runs[notebook] = (thread, outcome)
        thread.start()

    def _run(self, notebook: Path, outcome: dict) -> None:
        try:
            with tempfile.TemporaryDirectory(prefix=f"course-{notebook.stem}-") as folder:
                copy = Path(folder) / notebook.name
                shutil.copy(notebook, copy)
                outcome["results"] = run_nbval(copy, self.timeout_s, self.sanitize_file)
        except BaseException as error:  # raised again in the test that waits for it
            outcome["error"] = error
