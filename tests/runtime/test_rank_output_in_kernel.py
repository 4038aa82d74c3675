"""What a forked rank's output does in a real Jupyter kernel: it never reaches the kernel's ZMQ sockets,
rank 0's progress bar is one display updated in place, and a failure's traceback is the learner's line."""
import re

import nbformat
import pytest
from nbclient import NotebookClient

from scripts import REPO

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # Jupyter kernels

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _execute(*sources):
    """Each cell's outputs (nbformat nodes), errors allowed; the kernel's iopub messages, in order."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    client = NotebookClient(notebook, timeout=180, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": REPO}})
    messages = []
    process = client.process_message

    def record(msg, cell, cell_index):
        messages.append((cell_index, msg["msg_type"], msg["content"]))
        return process(msg, cell, cell_index)

    client.process_message = record
    client.execute()
    return [cell.outputs for cell in notebook.cells], messages


def test_ranks_never_send_to_the_kernel_and_their_output_arrives_labelled():
    outputs, messages = _execute(
        "import sys, ipywidgets\nfrom IPython.display import display\nfrom tqdm.auto import tqdm\n"
        "from course_lib import launch\nkernel_stdout = sys.stdout",
        "def work():\n"
        "    import torch.distributed as dist\n"
        "    print('through the kernel stdout', file=kernel_stdout)  # a stream saved in the notebook\n"
        "    display('a display')                                   # IPython's display()\n"
        "    display(ipywidgets.IntSlider())                        # a widget: only the kernel can\n"
        "    for _ in tqdm(range(5), disable=dist.get_rank() != 0):   # the notebook's tqdm.auto class\n"
        "        pass\n"
        "    return 'done'\n"
        "print(launch(work, nprocs=2, timeout=120))",
    )
    launched = [(kind, content) for cell, kind, content in messages if cell == 1]
    assert not [kind for kind, _ in launched if kind.startswith("comm")], launched  # no widget, no comm
    stream = "".join(content["text"] for kind, content in launched if kind == "stream")
    lines = [line for line in stream.splitlines() if line]
    assert all(line.startswith(("launch:", "[rank0] ", "[rank1] ", "['done', 'done']")) for line in lines), lines
    for rank in (0, 1):
        assert f"[rank{rank}] through the kernel stdout" in lines
        assert f"[rank{rank}] a display" in lines  # display() prints in a rank
    assert "a rank cannot send widgets" in stream
    bars = [content["data"]["text/plain"] for kind, content in launched
            if kind in ("display_data", "update_display_data")]
    assert bars and all(bar.startswith("[rank0] ") and "%|" in bar for bar in bars), bars
    assert "100%" in bars[-1]
    assert [o.output_type for o in outputs[1]].count("display_data") == 1  # one line, updated in place


def test_a_failure_shows_the_learners_line_and_not_the_launchers_frames():
    outputs, _ = _execute(
        "from course_lib import launch, spawn, DistributedSession\n%load_ext course_lib",
        "def fail():\n    raise ValueError('bad shape')\nlaunch(fail, nprocs=2, timeout=60, output='none')",
        "spawn(lambda rank: 1 / 0, nprocs=2, timeout=60, output='none')",
        "%%distributed -n 2 --output none\nraise ValueError('in a cell')",
        "with DistributedSession(nprocs=2, output='none') as session:\n    session.run('1 / 0')",
    )
    for index in (1, 2, 3, 4):  # launch, spawn, %%distributed, DistributedSession.run
        [error] = [o for o in outputs[index] if o.output_type == "error"]
        assert error.ename == "DistributedRunError"
        frames = [line for line in ANSI.sub("", "\n".join(error.traceback)).splitlines()
                  if line.startswith(("File ", "Cell In["))]
        # The learner's line, then the message: none of the launcher's frames.
        assert len(frames) == 1 and frames[0].startswith(f"Cell In[{index + 1}]"), frames
        assert "course_lib" not in ANSI.sub("", "\n".join(error.traceback)).split("DistributedRunError:")[0]
