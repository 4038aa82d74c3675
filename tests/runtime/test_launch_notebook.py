"""course_lib.runtime.launcher.launch inside a real Jupyter kernel: output in the cell, captures, interrupts."""
import time

import pytest
from jupyter_client.manager import start_new_kernel

from scripts import REPO, process_is_gone, run_cells

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # Jupyter kernels


def test_a_cell_defined_function_runs_and_every_rank_prints_into_the_cell():
    outputs = run_cells(
        "import torch, torch.distributed as dist\nfrom course_lib import launch\n"
        "x = torch.randn(300, 300, requires_grad=True); (x @ x).sum().backward()",
        "def work(n):\n    print(f'hello from rank {dist.get_rank()}')\n"
        "    t = torch.ones(n) * dist.get_rank()\n    dist.all_reduce(t)\n    return t.sum().item()\n"
        "print(launch(work, 4, nprocs=2, timeout=60))",
        "from IPython.utils.capture import capture_output\n"
        "with capture_output() as captured:\n    launch(work, 1, nprocs=2, timeout=60)\n"
        "print('captured:', sorted(l for l in captured.stdout.splitlines() if l.startswith('[rank')))",
    )
    assert "[rank0] hello from rank 0" in outputs[1] and "[rank1] hello from rank 1" in outputs[1]
    assert "[4.0, 4.0]" in outputs[1]
    assert "captured: ['[rank0] hello from rank 0', '[rank1] hello from rank 1']" in outputs[2]


def test_interrupting_the_kernel_stops_every_rank_and_the_kernel_lives_on():
    manager, client = start_new_kernel(kernel_name="python3", cwd=REPO)
    try:
        # stop_on_error=False: after the interrupt, the kernel must not abort the next request
        msg_id = client.execute("import os, time\nfrom course_lib import launch\n"
                                "def sleep_forever():\n    print('pid', os.getpid(), flush=True)\n"
                                "    time.sleep(300)\nlaunch(sleep_forever, nprocs=2)", stop_on_error=False)
        pids, error = [], None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and error is None:
            message = client.get_iopub_msg(timeout=60)
            content = message["content"]
            if message["msg_type"] == "stream":
                pids += [int(line.split()[-1]) for line in content["text"].splitlines() if "] pid " in line]
                if len(pids) == 2:
                    manager.interrupt_kernel()
            elif message["msg_type"] == "error":
                error = content["ename"], content["evalue"]
        # a KeyboardInterrupt that says where each rank was (sleep_forever), every rank stopped
        assert error[0] == "DistributedRunInterrupted" and len(pids) == 2
        assert "interrupted: the 2 ranks were stopped" in error[1] and "sleep_forever" in error[1]
        assert all(process_is_gone(pid) for pid in pids)
        reply = client.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:  # a late reply to start_new_kernel's kernel_info
            reply = client.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error"  # the interrupted cell
        reply = client.execute_interactive("print(launch(lambda: 7, nprocs=2, timeout=60, output='none'))",
                                           timeout=60)
        assert reply["content"]["status"] == "ok"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
