"""Checkpoints: atomic writes, crashes and truncated files, and resuming exactly (1 process and 2 ranks)."""
import subprocess
import sys
import textwrap

import pytest
import torch

from course_lib import launch
from course_lib.training.checkpoint import (CheckpointError, list_checkpoints, load_checkpoint,
                                   load_latest_checkpoint, save_checkpoint)
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model
from course_lib.training.trainers import TrainConfig, Trainer


def test_save_is_atomic_and_keeps_the_last_n(tmp_path):
    for step in range(1, 5):
        save_checkpoint({"step": step, "weights": torch.full((3,), float(step))}, tmp_path, step, keep_last=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003.pt", "step_00000004.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000003.pt", "step_00000004.pt"]  # no temp files
    state, path = load_latest_checkpoint(tmp_path)
    assert state["step"] == 4 and path.name == "step_00000004.pt"


def test_a_crash_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path):
    # A child process saves step 1, then dies (os._exit) half way through writing step 2.
    child = textwrap.dedent(f"""
        import os, torch
        from course_lib.training import checkpoint
        state = {{"weights": torch.arange(100_000.0)}}
        checkpoint.save_checkpoint(state, {str(tmp_path)!r}, 1)
        real_save = torch.save
        def crash_half_way(obj, file):
            real_save(obj, "/dev/null")
            file.write(b"PK" + b"x" * 1000)
            file.flush()
            os._exit(3)
        torch.save = crash_half_way
        checkpoint.save_checkpoint(state, {str(tmp_path)!r}, 2)
    """)
    result = subprocess.run([sys.executable, "-c", child], timeout=120, capture_output=True, text=True)
    assert result.returncode == 3, result.stderr
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001.pt"]
    state, path = load_latest_checkpoint(tmp_path)
    assert torch.equal(state["weights"], torch.arange(100_000.0))


def test_a_truncated_file_is_a_clear_error_and_the_previous_one_is_used(tmp_path):
    for step in (1, 2):
        save_checkpoint({"step": step, "weights": torch.zeros(1000)}, tmp_path, step)
    newest = list_checkpoints(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:500])
    with pytest.raises(CheckpointError, match="truncated or corrupt.*Delete it"):
        load_checkpoint(newest)
    with pytest.warns(UserWarning, match="using the previous checkpoint"):
        state, path = load_latest_checkpoint(tmp_path)
    assert state["step"] == 1


def test_loading_refuses_arbitrary_objects(tmp_path):
    torch.save({"not_data": CheckpointError("x")}, tmp_path / "step_00000001.pt")
    with pytest.raises(CheckpointError, match="weights_only=True refuses"):
        load_checkpoint(tmp_path / "step_00000001.pt")


def train(checkpoint_dir=None, strategy="single", **config):
    """AdamW, warmup, dropout, shuffling and accumulation: every piece of state resume must restore."""
    config = TrainConfig(strategy=strategy, batch_size=4, grad_accum_steps=2, epochs=3, optimizer="adamw",
                         lr=0.01, warmup_steps=3, shuffle=True, progress=False,
                         checkpoint_dir=checkpoint_dir and str(checkpoint_dir), **config)
    history = Trainer(make_model(dropout=0.3), make_dataset(64), config).fit()
    return history.losses, list(history.model.parameters()), history.resumed_from


def assert_identical(resumed, uninterrupted):
    assert resumed[0] == uninterrupted[0]  # bit for bit, not approximately
    for got, expected in zip(resumed[1], uninterrupted[1]):
        assert torch.equal(got, expected)


def test_resume_mid_epoch_is_exact(tmp_path):
    uninterrupted = train()
    stopped = train(tmp_path, max_steps=11, checkpoint_every=4)  # stops inside epoch 2 (8 steps each)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000008.pt", "step_00000011.pt"]
    assert stopped[0] == uninterrupted[0][:11]
    resumed = train(tmp_path, resume=True)
    assert resumed[2].endswith("step_00000011.pt")
    assert_identical(resumed, uninterrupted)


def test_resume_falls_back_past_a_truncated_checkpoint_and_stays_exact(tmp_path):
    uninterrupted = train()
    train(tmp_path, max_steps=11, checkpoint_every=5, keep_last=3)
    newest = list_checkpoints(tmp_path)[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.warns(UserWarning, match="using the previous checkpoint"):
        resumed = train(tmp_path, resume=True)
    assert resumed[2].endswith("step_00000010.pt")
    assert_identical(resumed, uninterrupted)


def test_resume_on_2_ranks_is_exact(tmp_path):
    # Each rank seeds seed + rank, so dropout differs per rank: every rank's RNG state must come back.
    uninterrupted = launch(train, strategy="ddp", nprocs=2, timeout=120)
    launch(train, tmp_path, strategy="ddp", max_steps=5, nprocs=2, timeout=120)
    resumed = launch(train, tmp_path, strategy="ddp", resume=True, nprocs=2, timeout=120)
    for rank in range(2):
        assert_identical(resumed[rank], uninterrupted[rank])
