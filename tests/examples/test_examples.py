"""course_lib.examples: the scripts the lessons run under torchrun, and how they shut down."""
import os
import subprocess
import sys

import pytest

from course_lib.topics.cluster import stop_processes
from scripts import REPO

pytestmark = pytest.mark.slow  # scripts under torchrun

TIMEOUT = 180

# Run in each rank after a script's main() returned: which of gloo's threads still run? A group
# that destroy_process_group() did not free keeps them into the interpreter's exit, where one
# that releases a tensor aborts the process ("terminate called without an active exception").
AFTER_MAIN = """
import gc
import os
import sys

gc.disable()  # the worst case: no automatic collection between the training and the shutdown
{run_main}
threads = [open(f"/proc/self/task/{{task}}/comm").read().strip() for task in os.listdir("/proc/self/task")]
line = (f"rank {{os.environ['RANK']}}: main() returned {{code}}; gloo threads left: "
        f"{{sorted(name for name in threads if 'gloo' in name)}}")
with open(f"after_main.{{os.environ['RANK']}}.txt", "w") as file:  # ranks printing at once interleave
    file.write(line)
"""


def run_under_torchrun(tmp_path, run_main: str):
    """Each rank's line from AFTER_MAIN, sorted by rank; fails the test when torchrun fails."""
    script = tmp_path / "after_main.py"
    script.write_text(AFTER_MAIN.format(run_main=run_main))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                "--nproc_per_node=2", str(script)], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not finish within {TIMEOUT} s")
    finally:
        stop_processes([process])  # and its workers, in sessions of their own
    assert process.returncode == 0, output
    return [(tmp_path / f"after_main.{rank}.txt").read_text() for rank in (0, 1)]


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="reads the process's thread names from /proc (Linux)")


@needs_proc
def test_ddp_train_ends_glooS_threads_before_python_exits(tmp_path):
    lines = run_under_torchrun(tmp_path, "from course_lib.examples import ddp_train\n"
                                         "code = ddp_train.main(['--epochs', '1'])")
    assert lines == [f"rank {rank}: main() returned 0; gloo threads left: []" for rank in (0, 1)], (
        "destroy_process_group() left the group alive: free the DDP wrapper (gc.collect()) and "
        "import torch.distributed.nn before init_process_group")


@needs_proc
def test_the_train_cli_under_torchrun_ends_glooS_threads_before_python_exits(tmp_path):
    lines = run_under_torchrun(tmp_path, "from course_lib.training.train_cli import main\n"
                                         "code = main(['--samples', '64', '--epochs', '1', "
                                         "'--batch-size', '8', '--no-progress'])")
    assert lines == [f"rank {rank}: main() returned 0; gloo threads left: []" for rank in (0, 1)]


def uninterrupted_losses():
    from course_lib import TrainConfig, Trainer, make_dataset, make_model

    config = TrainConfig(strategy="ddp", batch_size=16, max_steps=10, progress=False, seed=0)
    return Trainer(make_model(seed=0), make_dataset(512), config).fit().losses


@pytest.mark.timeout(TIMEOUT + 60)
def test_elastic_train_crashes_once_restarts_and_resumes_to_the_same_losses(tmp_path):
    # lesson 12, section 5, on one node: rank 1 dies in step 7, torchrun restarts both ranks,
    # which resume from the step-4 checkpoint and end with the losses of a run without a crash
    import json

    from course_lib import launch
    from course_lib.topics.cluster import free_port, run_nodes, torchrun_command

    command = torchrun_command(["-m", "course_lib.examples.elastic_train"], nproc_per_node=2,
                               rdzv="c10d", endpoint=f"127.0.0.1:{free_port()}", max_restarts=1)
    (run,) = run_nodes([command], timeout=TIMEOUT, cwd=tmp_path,
                       env={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                            "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))})
    assert run.returncode == 0, run.output[-3000:]
    assert "[rank 1] crashing in step 7" in run.output and (tmp_path / "crashed_once").exists()
    assert sorted(run.lines("[rank 0] starting")) == ["[rank 0] starting at step 0",
                                                      "[rank 0] starting at step 4"]
    restarted = json.loads((tmp_path / "losses.json").read_text())
    expected = launch(uninterrupted_losses, nprocs=2, backend="gloo", timeout=120, output="none")[0]
    assert restarted == expected
