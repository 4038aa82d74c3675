"""What a learner sees in JupyterLab, in a real browser: rank 0's progress bar is one line updating live.

Needs Playwright (the `test` extra) and a Chromium on PATH (`.ci/run` installs Debian's); skips without.
"""
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import nbformat
import pytest

from scripts import REPO

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # JupyterLab in a browser

BAR = re.compile(r"\[rank0\] ddp x2:\s+(\d+)%\|")
COURSE_SETTINGS = os.path.join("jupyter", "course-lib-settings.json")
NEWS_PROMPT = "Would you like to get notified about official Jupyter news?"  # JupyterLab 4's first-run toast
LESSONS_AT_ONCE = 2  # lessons open side by side: one kernel starts while the other imports torch
SLOW_DATA = """\
import time
from torch.utils.data import Dataset
from course_lib import Trainer, TrainConfig, make_dataset, make_model

class SlowData(Dataset):  # 1600 samples, 16 a step on 2 ranks, 0.2 s a step: about 20 s of training
    def __init__(self):
        self.data = make_dataset(1600)
    def __len__(self):
        return len(self.data)
    def __getitem__(self, index):
        time.sleep(0.2 / 8)
        return self.data[index]
"""
SETUP = ("%load_ext course_lib\nimport course_lib\nfrom course_lib import launch\n" + SLOW_DATA +
         "def train(strategy):\n"
         "    config = TrainConfig(strategy=strategy, batch_size=8, epochs=1, shuffle=False)\n"
         "    return round(Trainer(make_model(), SlowData(), config).fit().losses[-1], 4)\n"
         "launch(lambda: None, nprocs=2, output='none')  # the kernel has launched before, as in a lesson\n"
         "print(course_lib.__file__)")
LAUNCH = "print(launch(train, 'ddp', nprocs=2), launch(lambda: course_lib.__file__, nprocs=2, output='none'))"
DISTRIBUTED = ("%%distributed -n 2\n" + SLOW_DATA +
               "config = TrainConfig(strategy='ddp', batch_size=8, epochs=1, shuffle=False)\n"
               "history = Trainer(make_model(), SlowData(), config).fit()\n"
               "print('finished with loss', round(history.losses[-1], 4))")
FAILING = """\
def fail():
    import torch.distributed as dist
    if dist.get_rank() == 1:
        raise ValueError("rank 1 got a bad batch")

launch(fail, nprocs=2, timeout=60)"""
GRADED = """\
from course_lib.checks.lesson00 import check_whoami
check_whoami(lambda: (0, 1))  # a wrong answer: every rank says it is rank 0 of 1"""


def _chromium():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("Playwright is not installed: pip install -e '.[test]'")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("no Chromium on PATH: apt-get install chromium (as .ci/run does)")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    """A JupyterLab server on a free loopback port, serving tmp_path; stopped (with its kernels) after.

    Its default settings are the course's (what `pip install .` puts in JupyterLab's settings folder)."""
    chromium = _chromium()  # skip before starting anything
    settings = tmp_path / "app_settings" / "overrides.d"
    settings.mkdir(parents=True)
    shutil.copy(os.path.join(REPO, COURSE_SETTINGS), settings)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = open(tmp_path / "jupyterlab.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
         "--LabApp.news_url=", f"--LabApp.app_settings_dir={settings.parent}",
         "--ServerApp.port_retries=0", "--allow-root"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp_path), start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError("JupyterLab did not start:\n" + (tmp_path / "jupyterlab.log").read_text())
                time.sleep(0.5)
        yield chromium, base, token, tmp_path
    finally:
        server.send_signal(signal.SIGTERM)  # the server shuts its kernels down, their ranks die with them
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        try:
            os.killpg(server.pid, signal.SIGKILL)  # anything the server started and left behind
        except ProcessLookupError:
            pass
        log.close()


def _write_notebook(folder, *sources) -> str:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(folder / "progress.ipynb"))
    return "progress.ipynb"


def _run_and_watch(page, cell_index: int, finished: str, seconds: float = 100):
    """Run the selected cell, then read its output every 0.1 s until `finished` shows in it.

    Returns [(seconds since the cell started, its output's text)] and the cell."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(cell_index)
    started = time.monotonic()
    page.keyboard.press("Shift+Enter")
    snapshots = []
    while time.monotonic() - started < seconds:
        text = cell.locator(".jp-OutputArea").inner_text()
        snapshots.append((time.monotonic() - started, text))
        if finished in text:
            return snapshots, cell
        time.sleep(0.1)
    raise AssertionError(f"cell {cell_index} did not finish in {seconds} s; its output:\n{snapshots[-1][1]}")


def _assert_live_progress(snapshots, final_text, what):
    """Rank 0's bar: one line, shown within 5 s, changing at least every 2 s until it ends."""
    for _, text in snapshots:
        assert len(BAR.findall(text)) <= 1, f"{what}: more than one progress line:\n{text}"
    states = [(at, BAR.search(text).group(0), text.split("ddp x2:", 1)[1].split("\n", 1)[0])
              for at, text in snapshots if BAR.search(text)]
    assert states, f"{what}: no progress line from rank 0 while it ran:\n{snapshots[-1][1]}"
    first_at = states[0][0]
    changes = [at for (at, _, line), (_, _, before) in zip(states[1:], states) if line != before]
    gaps = [b - a for a, b in zip([first_at] + changes, changes)]
    print(f"{what}: first progress {first_at:.1f} s after the cell started; {len(changes)} updates, "
          f"longest gap {max(gaps, default=0):.1f} s")
    assert first_at <= 5, f"{what}: the first progress line came {first_at:.1f} s after the cell started"
    assert len(changes) >= 5 and max(gaps) <= 2, f"{what}: updates at {changes}"
    assert BAR.findall(final_text) == ["100"], final_text


def test_a_learner_sees_live_progress_rank_labels_and_errors_in_jupyterlab(jupyterlab):
    from playwright.sync_api import sync_playwright

    chromium, base, token, folder = jupyterlab
    name = _write_notebook(folder, SETUP, LAUNCH, DISTRIBUTED, FAILING, GRADED)
    screenshot = folder / "jupyterlab.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 2400})
        try:
            page.goto(f"{base}/lab/tree/{name}?token={token}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=60_000)
            page.get_by_text(re.compile(r"\| Idle$")).wait_for(timeout=60_000)  # the kernel, in the status bar
            page.locator(".jp-Notebook .jp-Cell").first.click()

            snapshots, _ = _run_and_watch(page, 0, "__init__.py")
            assert os.path.join(REPO, "course_lib", "__init__.py") in snapshots[-1][1]  # this checkout

            snapshots, cell = _run_and_watch(page, 1, "__init__.py']")
            final = cell.locator(".jp-OutputArea").inner_text()
            _assert_live_progress(snapshots, final, "launch")
            assert repr([os.path.join(REPO, "course_lib", "__init__.py")] * 2) in final  # the ranks' too
            assert cell.locator(".jupyter-widgets, .widget-hprogress").count() == 0  # text, not a rank's widget

            snapshots, cell = _run_and_watch(page, 2, "[rank1] finished with loss")
            page.wait_for_timeout(500)
            final = cell.locator(".jp-OutputArea").inner_text()
            _assert_live_progress(snapshots, final, "%%distributed")
            assert "[rank0] finished with loss" in final
            assert cell.locator(".jupyter-widgets, .widget-hprogress").count() == 0

            snapshots, cell = _run_and_watch(page, 3, "DistributedRunError", seconds=60)
            page.wait_for_timeout(500)
            final = cell.locator(".jp-OutputArea").inner_text()
            assert "rank 1 in your function: ValueError: rank 1 got a bad batch" in final, final
            assert "Cell In[4], line 4" in final, final  # the line that raised, on the rank
            assert final.index("Cell In[4], line 6") < final.index("DistributedRunError:"), final
            assert "course_lib" not in final.split("DistributedRunError:")[0], final  # no launcher frames

            snapshots, cell = _run_and_watch(page, 4, "hint:", seconds=60)
            page.wait_for_timeout(500)
            final = cell.locator(".jp-OutputArea").inner_text()
            assert final.startswith("✗ who am I: launch(whoami, nprocs=2) is not right yet."), final
            assert "expected: [(0, 2), (1, 2)]" in final, final
            assert "course_lib" not in final and "Traceback" not in final, final  # the verdict alone
        finally:
            page.screenshot(path=str(screenshot), full_page=True)
            print(f"screenshot: {screenshot}")
            browser.close()


def test_every_lesson_opens_with_its_kernel_and_its_first_cell_runs(jupyterlab):
    """As a learner opens a lesson: no dialog to answer, the kernel starts, the imports run.

    Two lessons at a time (a page each), so that one kernel starts while the other imports torch."""
    from playwright.sync_api import sync_playwright

    chromium, base, token, folder = jupyterlab
    lessons = [name for name in sorted(os.listdir(os.path.join(REPO, "lessons"))) if name.endswith(".ipynb")]
    shutil.copytree(os.path.join(REPO, "lessons"), folder / "lessons")  # JupyterLab may write to what it opens
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for pair in (lessons[i:i + LESSONS_AT_ONCE] for i in range(0, len(lessons), LESSONS_AT_ONCE)):
                pages = {lesson: browser.new_page(viewport={"width": 1400, "height": 1000}) for lesson in pair}
                try:
                    for lesson, page in pages.items():
                        # A workspace of its own: JupyterLab would otherwise reopen the lessons before it.
                        page.goto(f"{base}/lab/workspaces/{lesson[:2]}/tree/lessons/{lesson}?token={token}")
                    for lesson, page in pages.items():
                        page.get_by_text(re.compile(r"\| Idle$")).wait_for(timeout=60_000)
                        assert page.locator(".jp-Dialog").count() == 0, f"{lesson}: a dialog asks something"
                        assert page.get_by_text(NEWS_PROMPT).count() == 0, f"{lesson}: JupyterLab asks about news"
                        page.locator(".jp-Notebook .jp-CodeCell").first.click()
                        page.keyboard.press("Shift+Enter")
                    for lesson, page in pages.items():
                        first = page.locator(".jp-Notebook .jp-CodeCell").first
                        first.locator(".jp-InputPrompt", has_text="[1]:").wait_for(timeout=60_000)
                        errors = first.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
                        assert "Error" not in " ".join(errors.all_inner_texts()), f"{lesson}: {errors.all_inner_texts()}"
                finally:
                    for lesson, page in pages.items():
                        page.screenshot(path=str(folder / f"{lesson}.png"))
                        page.close()
                    _shut_down_kernels(base, token)
        finally:
            browser.close()
    print(f"screenshots: {folder}/*.ipynb.png")


def _shut_down_kernels(base: str, token: str) -> None:
    request = urllib.request.Request(f"{base}/api/sessions?token={token}")
    for session in json.load(urllib.request.urlopen(request, timeout=10)):
        urllib.request.urlopen(urllib.request.Request(f"{base}/api/sessions/{session['id']}?token={token}",
                                                      method="DELETE"), timeout=30)
