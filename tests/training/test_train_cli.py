"""`python -m course_lib train`: as is, with --nprocs 2, under torchrun, and on two simulated nodes."""
import json
import subprocess
import sys

import pytest

from course_lib.topics.cluster import free_port, stop_processes
from course_lib.training.train_cli import main

TIMEOUT = 180
SMALL_RUN = ["--samples", "256", "--epochs", "1", "--no-progress"]


def start(args):
    # Own session: on a timeout we kill the whole process group this test started, by its pid.
    return subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def finish(*processes):
    """Wait for every process; kill all of them if one overruns. Returns their (returncode, output)."""
    results = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=TIMEOUT)
            results.append((process.returncode, output))
    except subprocess.TimeoutExpired:
        stop_processes(processes)  # torchrun's workers too: they run in sessions of their own
        pytest.fail(f"the run did not finish within {TIMEOUT}s")
    finally:
        stop_processes(processes)
    return results


def losses(path):
    with open(path) as file:
        return json.load(file)["losses"]


def test_runs_as_is_in_one_process(capsys, tmp_path):
    assert main([*SMALL_RUN, "--batch-size", "16", "--history-json", str(tmp_path / "h.json")]) == 0
    assert "trained strategy=single on 1 rank(s): 16 steps of global batch 16" in capsys.readouterr().out
    assert len(losses(tmp_path / "h.json")) == 16


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "0"], "batch_size=0 must be at least 1"),
    (["--nprocs", "2", "--strategy", "single"], "use --strategy ddp"),
    (["--strategy", "ddp"], "needs a process group"),
])
def test_bad_flags_say_what_to_do(capsys, flags, message):
    assert main([*SMALL_RUN, *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_nprocs_and_torchrun_match_one_process_with_the_global_batch(tmp_path):
    assert main([*SMALL_RUN, "--batch-size", "16", "--history-json", str(tmp_path / "single.json")]) == 0
    nprocs = start(["-m", "course_lib", "train", *SMALL_RUN, "--batch-size", "8", "--nprocs", "2",
                    "--timeout", str(TIMEOUT), "--history-json", str(tmp_path / "nprocs.json")])
    # --standalone: torchrun binds a free port itself (no port picked here that another can take)
    torchrun = start(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                      "-m", "course_lib", "train", *SMALL_RUN,
                      "--batch-size", "8", "--history-json", str(tmp_path / "torchrun.json")])
    for returncode, output in finish(nprocs, torchrun):
        assert returncode == 0, output
        assert "trained strategy=ddp on 2 rank(s): 16 steps of global batch 16" in output
    single = losses(tmp_path / "single.json")
    for name in ("nprocs", "torchrun"):
        assert losses(tmp_path / f"{name}.json") == pytest.approx(single, abs=1e-5)


@pytest.mark.slow
def test_two_simulated_nodes_on_loopback():
    port = free_port()
    nodes = [start(["-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node_rank}",
                    "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}",
                    "-m", "course_lib", "train", *SMALL_RUN]) for node_rank in (0, 1)]
    (rc0, output0), (rc1, output1) = finish(*nodes)
    assert rc0 == 0 and rc1 == 0, output0 + output1
    assert "trained strategy=ddp on 2 rank(s)" in output0  # only global rank 0 reports
