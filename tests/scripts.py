"""Run a small Python script in its own process, as a learner's script or kernel would."""
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cells(*sources, timeout: float = 120) -> list:
    """Run each source as a cell of a new notebook in a fresh kernel; each cell's text output."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": REPO}}).execute()
    return ["".join(o.get("text", "") for o in cell.outputs) for cell in notebook.cells]


def start_script(code: str, tmp_path, name: str = "script.py") -> subprocess.Popen:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    return subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=str(tmp_path))


def run_script(code: str, tmp_path, timeout: float = 60, name: str = "script.py"):
    """(returncode, output); the process is killed if it outlives `timeout`."""
    proc = start_script(code, tmp_path, name)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"script did not finish within {timeout} s; output:\n{out}")
    return proc.returncode, out


def process_is_gone(pid: int) -> bool:
    """True when pid no longer runs (gone, or a zombie waiting for a parent that is not us)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
