"""pitfalls.slow_disk: rank 0's torch.save leaves a torn file on disk while it lasts, then a complete
one; the other ranks save as usual. Lesson 08's checkpoint exercise and its grader stand on it."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from course_lib import launch
from course_lib.topics import pitfalls

pytestmark = pytest.mark.timeout(120)


def save_and_peek(folder, seconds):
    rank = dist.get_rank()
    path = os.path.join(folder, f"rank{rank}.pt")
    state = {"weight": torch.arange(10_000.0)}
    with pitfalls.slow_disk(seconds) as saves_ended:
        if rank == 0:
            import threading

            peeked = []
            timer = threading.Timer(seconds / 2, lambda: peeked.append(_loads(path)))
            timer.start()
        started = time.perf_counter()
        torch.save(state, path)
        took = time.perf_counter() - started
        if rank == 0:
            timer.join()
    return took, (peeked[0] if rank == 0 else None), _loads(path), list(saves_ended)


def _loads(path):
    try:
        return torch.equal(torch.load(path)["weight"], torch.arange(10_000.0))
    except Exception:  # noqa: BLE001 - a torn file fails to load, whatever the error
        return False


def test_rank0_saves_slowly_and_torn_while_it_lasts(tmp_path):
    (took0, torn_midway, complete0, ended0), (took1, _, complete1, ended1) = launch(
        save_and_peek, str(tmp_path), 0.6, backend="gloo", timeout=60, output="none")
    assert took0 >= 0.6 and not torn_midway and complete0 and len(ended0) == 1
    assert took1 < 0.3 and complete1 and ended1 == []
