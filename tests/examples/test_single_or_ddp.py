"""course_lib.examples.single_or_ddp: one script, one process without torchrun, DDP under it,
and the same losses both ways (lesson 04, section 6)."""
import json
import os
import subprocess
import sys

import pytest

from course_lib.examples import single_or_ddp
from course_lib.topics.cluster import stop_processes
from scripts import REPO

pytestmark = pytest.mark.slow  # a script under torchrun

TIMEOUT = 180


def test_without_torchrun_it_trains_on_one_process(tmp_path, monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert single_or_ddp.main(["--losses-json", str(tmp_path / "single.json")]) == 0
    assert capsys.readouterr().out.startswith("1 process(es) on ")
    losses = json.loads((tmp_path / "single.json").read_text())
    assert len(losses) == 16 and losses[-1] < losses[0]


def test_under_torchrun_it_trains_the_same_model_with_ddp(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    single_or_ddp.main(["--losses-json", str(tmp_path / "single.json")])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    process = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
         "course_lib.examples.single_or_ddp", "--losses-json", str(tmp_path / "ddp.json")],
        cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun did not finish within {TIMEOUT} s")
    finally:
        stop_processes([process])
    assert process.returncode == 0, output
    assert "2 process(es) on " in output
    single = json.loads((tmp_path / "single.json").read_text())
    ddp = json.loads((tmp_path / "ddp.json").read_text())
    assert ddp == pytest.approx(single, abs=1e-5)
