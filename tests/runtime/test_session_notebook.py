"""%%distributed in a real Jupyter kernel: cells on every rank, interrupts, kernel shutdown."""
import time

import pytest
from jupyter_client.manager import start_new_kernel

from scripts import REPO, process_is_gone

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # Jupyter kernels


class Kernel:
    def __init__(self):
        self.manager, self.client = start_new_kernel(kernel_name="python3", cwd=REPO)

    def execute(self, code, interrupt_when=None, timeout=60):
        """(status, stdout text, error name); `interrupt_when(text)` true -> interrupt the kernel."""
        # stop_on_error=False: an interrupted cell must not make the kernel abort the next request
        msg_id = self.client.execute(code, stop_on_error=False)
        text, error, interrupted = "", None, False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.client.get_iopub_msg(timeout=timeout)
            if message["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream":
                text += content["text"]
                if interrupt_when and not interrupted and interrupt_when(text):
                    self.manager.interrupt_kernel()
                    interrupted = True
            elif kind == "error":
                error = content["ename"]
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = self.client.get_shell_msg(timeout=timeout)
        while reply["parent_header"].get("msg_id") != msg_id:  # a late reply to start_new_kernel's kernel_info
            reply = self.client.get_shell_msg(timeout=timeout)
        if reply["content"]["status"] != "ok":
            text += f"\n[reply] {reply['content']}"
        return reply["content"]["status"], text, error

    def close(self, now=False):
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=now)


@pytest.fixture
def kernel():
    k = Kernel()
    yield k
    k.close()


def _pids(text):
    return [int(line.split()[-1]) for line in text.splitlines() if "] pid " in line]


def test_cells_run_on_every_rank_and_an_interrupt_reaches_them_all(kernel):
    status, text, _ = kernel.execute("%load_ext course_lib")
    assert status == "ok", text
    status, text, _ = kernel.execute("%%distributed -n 2\nimport os, time\nkept = rank\nprint('pid', os.getpid())")
    pids = _pids(text)
    assert status == "ok" and len(pids) == 2, text
    status, text, error = kernel.execute("%%distributed\nprint('sleeping', flush=True)\ntime.sleep(60)",
                                         interrupt_when=lambda t: t.count("sleeping") == 2)
    assert error == "KeyboardInterrupt", text
    status, text, _ = kernel.execute("%%distributed\nkept * 10")
    assert status == "ok" and "[rank0] 0" in text and "[rank1] 10" in text, text
    assert not any(process_is_gone(pid) for pid in pids)  # the same ranks, interrupted not restarted


@pytest.mark.parametrize("killed", [False, True], ids=["shutdown", "killed"])
def test_closing_the_kernel_leaves_no_rank_behind(killed):
    kernel = Kernel()
    try:
        kernel.execute("%load_ext course_lib")
        _, text, _ = kernel.execute("%%distributed -n 2\nimport os\nprint('pid', os.getpid())")
        pids = _pids(text)
        assert len(pids) == 2, text
    finally:
        kernel.close(now=killed)
    deadline = time.monotonic() + 15
    while not all(process_is_gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(process_is_gone(pid) for pid in pids)
