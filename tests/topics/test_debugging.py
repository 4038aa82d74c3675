"""course_lib.topics.debugging: lesson 13 shows the broken runs the graders reject, and reads torch's
flight recorder from inside the ranks as NCCL's watchdog would dump it."""
import inspect
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import pytest
import torch
import torch.distributed as dist

from course_lib import DistributedRunError, launch
from course_lib.topics import debugging

pytestmark = pytest.mark.timeout(120)

SOLUTION = Path(__file__).resolve().parents[2] / "solutions" / "13_find_the_bug.ipynb"
BROKEN = [debugging.end_of_epoch_broken, debugging.load_data_broken,
          debugging.step_and_loss_broken, debugging.hand_ddp_step_broken,
          debugging.add_noise_broken, debugging.make_loader_broken,
          debugging.wrap_for_ddp_broken]


@pytest.mark.parametrize("broken", BROKEN, ids=lambda fn: fn.__name__)
def test_the_lesson_shows_the_broken_run_its_grader_rejects(broken):
    # the graders' WRONG_ANSWERS hold the module's function: the notebook's cell must be that code
    cells = [cell.source for cell in nbformat.read(SOLUTION, as_version=4).cells
             if cell.cell_type == "code"]
    assert inspect.getsource(broken).rstrip("\n") in cells, (
        f"solutions/13_find_the_bug.ipynb has no cell with course_lib.topics.debugging."
        f"{broken.__name__} as it is; copy the function into its cell")


def _mismatched_after_a_dump(folder):
    def issued_and_first_marked_done():
        recorded = debugging.collectives_recorded_here()
        return len(recorded) == 2 and recorded[0][4] == "completed"

    def dump_once_both_are_issued():  # no fixed delay: on a loaded machine a rank may be slow,
        deadline = time.monotonic() + 8  # and gloo marks a collective done after it returned
        while not issued_and_first_marked_done() and time.monotonic() < deadline:
            time.sleep(0.05)
        debugging.dump_collectives_after(0.0, folder)

    threading.Thread(target=dump_once_both_are_issued, daemon=True).start()
    dist.all_reduce(torch.ones(3))
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(2))
    else:
        dist.broadcast(torch.ones(2), src=0)


@pytest.mark.slow  # a hang, then torchfrtrace in a new process
def test_the_dumps_read_like_nccls_and_torchfrtrace_names_the_mismatch():
    with tempfile.TemporaryDirectory() as folder:
        with pytest.raises(DistributedRunError):
            launch(_mismatched_after_a_dump, folder, backend="gloo", timeout=12, output="none")
        recorded = debugging.recorded_collectives(folder)
        assert [[(seq, op) for seq, op, *_ in entries] for _, entries in sorted(recorded.items())] == [
            [(1, "gloo:all_reduce"), (2, "gloo:all_reduce")],
            [(1, "gloo:all_reduce"), (2, "gloo:broadcast")]]
        assert recorded[0][0][4] == "completed" and recorded[0][1][4] != "completed"
        report = debugging.torchfrtrace(folder)
    assert "Collective sequence number: 2 has errors" in report
    assert "COLLECTIVE_TYPE_MISMATCH" in report


FORKED_AFTER_A_GROUP = '''
import sys, tempfile
import torch
import torch.distributed as dist
sys.path.insert(0, {tests!r})
from course_lib import DistributedRunError, launch
from course_lib.topics import debugging
from topics.test_debugging import _mismatched_after_a_dump

if __name__ == "__main__":
    # as a notebook that ran a one-process group before it launched: the forked ranks inherit
    # this process's flight recorder, its 3 all_reduces and a group config with no ranks
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    for _ in range(3):
        dist.all_reduce(torch.ones(5))
    dist.destroy_process_group()
    with tempfile.TemporaryDirectory() as folder:
        try:
            launch(_mismatched_after_a_dump, folder, backend="gloo", timeout=12, output="none",
                   start_method="fork")
        except DistributedRunError as error:
            print("DIAGNOSIS", error.diagnosis.splitlines()[0])
        recorded = debugging.recorded_collectives(folder)
        print("RECORDED", [[(seq, op) for seq, op, *_ in entries] for _, entries in sorted(recorded.items())])
        print(debugging.torchfrtrace(folder))
'''


@pytest.mark.slow  # a hang, then torchfrtrace in a new process, from a script of its own
def test_ranks_forked_from_a_process_that_had_a_group_read_only_their_own_records(tmp_path):
    from scripts import run_script

    tests = str(Path(__file__).resolve().parents[1])
    code, output = run_script(FORKED_AFTER_A_GROUP.format(tests=tests), tmp_path, timeout=150)
    assert code == 0, output
    assert "DIAGNOSIS collective #2 differs" in output, output
    assert ("RECORDED [[(1, 'gloo:all_reduce'), (2, 'gloo:all_reduce')], "
            "[(1, 'gloo:all_reduce'), (2, 'gloo:broadcast')]]") in output, output
    assert "Collective sequence number: 2 has errors" in output, output
    assert "COLLECTIVE_TYPE_MISMATCH" in output, output
