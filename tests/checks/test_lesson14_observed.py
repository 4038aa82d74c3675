"""The capstone grader's crossing (course_lib/checks/lesson14/observed_runs.py), without torchrun: a
run folder as the probe leaves it is read on the learner's side into plain data, and the Run the
rules judge is rebuilt from that data alone, with nothing read from the folder again.
"""
import json
import shutil

import pytest
import torch

from course_lib.checks.engine import GradingError, boundary
from course_lib.checks.lesson14 import checkpoint_rules, crashes
from course_lib.checks.lesson14.observed_runs import from_plain, to_plain
from course_lib.checks.lesson14.script_probe import Run, Script, _collect, _saves

SCRIPT = Script("/learner/train_ddp.py",
                "import torch\n\nfor step in range(3):\n    dist.all_reduce(x)\n")


def _finished_run(folder, checkpoint):
    """A 2-rank run as the probe leaves it: records, save logs, torchrun's logs, one stack."""
    run = Run("under torchrun (2 ranks, --epochs 2)", ["--epochs", "2"], folder, 2, returncode=1)
    probe = folder / "probe"
    probe.mkdir(parents=True)
    for rank in (0, 1):
        record = {"rank": rank, "events": [["forward", True], ["step"]], "autocast": {"cpu:off": 4},
                  "group_alive_at_exit": False, "probe_error": None}
        (probe / f"record.rank{rank}.{100 + rank}.json").write_text(json.dumps(record))
        log = folder / "logs" / "none_x" / "attempt_0" / str(rank)
        log.mkdir(parents=True)
        (log / "stdout.log").write_text(f"epoch 0 step 0 loss 1.{rank}\n")
        (log / "stderr.log").write_text(f"RuntimeError: rank {rank} failed\n")
    (probe / "saves.rank0.100.txt").write_text(str(folder / "checkpoint.pt") + "\n")
    (probe / "stack.rank1.101.txt").write_text(
        f'  File "{SCRIPT.path}", line 4 in main\n')
    (folder / "stderr.txt").write_text("exitcode  : 1 (pid: 101)\n")
    torch.save(checkpoint, folder / "checkpoint.pt")
    run.processes, run.saves = _collect(run), _saves(run)
    return run


def test_a_run_crosses_as_plain_data_and_is_judged_from_it_alone(tmp_path):
    run = _finished_run(tmp_path / "first", {"model": {"module.weight": torch.ones(2)}, "epoch": 1})
    data = to_plain(run)
    assert boundary.plain(data) is data
    shutil.rmtree(tmp_path / "first")  # the judge never reads the folder
    again = from_plain(data)
    assert again.processes.keys() == {0, 1} and again.processes[1].stdout == "epoch 0 step 0 loss 1.1\n"
    assert again.saves == {0: [str(tmp_path / "first" / "checkpoint.pt")]}
    assert crashes.failed_outputs(again) == ["RuntimeError: rank 0 failed\n",
                                             "RuntimeError: rank 1 failed\n"]
    assert crashes.where_it_waits(again, SCRIPT) == ["rank 1 waits at line 4 (dist.all_reduce(x))"]
    assert crashes.agent_summary(again) == "exitcode  : 1 (pid: 101)"
    assert again.checkpoint["exists"] and again.checkpoint["keys"] == ["model", "module.weight", "epoch"]
    with pytest.raises(GradingError, match="keys start with 'module.'"):
        checkpoint_rules.expect_plain_checkpoint(again)


def test_a_checkpoint_weights_only_refuses_crosses_as_its_error(tmp_path):
    run = _finished_run(tmp_path / "first", {"model": {}, "sampler": object()})
    again = from_plain(to_plain(run))
    assert again.checkpoint["keys"] is None and "weights_only" in again.checkpoint["error"].lower()
    with pytest.raises(GradingError, match="weights_only=True\\) can read"):
        checkpoint_rules.expect_plain_checkpoint(again)


def test_a_record_the_script_spoiled_is_a_verdict_not_a_crash(tmp_path):
    run = _finished_run(tmp_path / "first", {})
    (tmp_path / "first" / "probe" / "record.rank1.101.json").write_text("{not json")
    with pytest.raises(GradingError, match="record.rank1.101.json cannot be read"):
        _collect(run)
