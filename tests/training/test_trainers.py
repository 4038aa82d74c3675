"""The trainer in one process: config errors, single and DP strategies, accumulation, AMP, LR, clipping."""
import pickle
import time

import pytest
import torch

from course_lib.training.amp import Precision, _check_fp16
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model
from course_lib.training.strategies import check_gpus_for_nccl
from course_lib.training.trainers import History, TrainConfig, Trainer, scaled_lr


def train(n_samples=64, dtype=torch.float64, model=None, **config):
    config = {"lr": 0.1, "shuffle": False, "progress": False, **config}
    model = model or make_model(dtype=dtype)
    return Trainer(model, make_dataset(n_samples, dtype=dtype), TrainConfig(**config)).fit()


@pytest.mark.parametrize("field, value, message", [
    ("batch_size", 0, "batch_size=0 must be at least 1"),
    ("grad_accum_steps", 0, "grad_accum_steps=0 must be at least 1"),
    ("strategy", "fsdp", "strategy='fsdp' is not one of"),
    ("amp", "fp8", "amp='fp8' is not one of"),
    ("resume", True, "resume=True needs checkpoint_dir"),
])
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**{field: value})


def test_single_trains_and_measures():
    started = time.perf_counter()
    history = train(n_samples=128, batch_size=16, epochs=3, lr=0.3, dtype=torch.float32)
    wall = time.perf_counter() - started
    assert len(history.losses) == len(history.learning_rates) == len(history.step_times) == 3 * 128 // 16
    assert all(seconds > 0 for seconds in history.step_times) and sum(history.step_times) <= wall
    assert history.losses[-1] < history.losses[0]
    assert history.global_batch_size == 16 and history.world_size == 1
    assert set(history.phase_times) == {"data", "forward", "backward", "optimizer"}
    assert all(seconds >= 0 for seconds in history.phase_times.values())
    assert history.samples_per_second > 0 and history.peak_memory_bytes["cpu"] > 0
    assert len(history.per_rank) == 1 and history.per_rank[0]["samples"] == 3 * 128
    assert isinstance(history.model, torch.nn.Sequential)
    assert isinstance(pickle.loads(pickle.dumps(history)), History)  # launch ships it between processes


def test_max_steps_overrides_epochs():
    assert len(train(batch_size=8, epochs=5, max_steps=3).losses) == 3


def test_accumulation_equals_the_larger_batch():
    big = train(batch_size=8, epochs=2)
    accumulated = train(batch_size=4, grad_accum_steps=2, epochs=2)
    torch.testing.assert_close(accumulated.losses, big.losses, rtol=0, atol=1e-12)
    for a, b in zip(accumulated.model.parameters(), big.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_dp_equals_single():
    single = train(batch_size=8, epochs=2)
    dp = train(strategy="dp", batch_size=4, epochs=2)  # 4 per device, two CPU devices
    assert dp.world_size == 2 and dp.global_batch_size == 8 and list(dp.peak_memory_bytes) == ["cpu"]
    torch.testing.assert_close(dp.losses, single.losses, rtol=0, atol=1e-12)
    for a, b in zip(dp.model.parameters(), single.model.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_dataloader_workers_give_the_same_run():
    in_process = train(batch_size=8, max_steps=4, shuffle=True)
    with_workers = train(batch_size=8, max_steps=4, shuffle=True, num_workers=2)
    assert with_workers.losses == in_process.losses
    tuned = train(batch_size=8, epochs=2, shuffle=True, num_workers=2, prefetch_factor=4,
                  persistent_workers=True)
    assert tuned.losses[:4] == in_process.losses


def test_loader_options_need_workers():
    with pytest.raises(ValueError, match="set num_workers to 1 or more"):
        TrainConfig(persistent_workers=True)
    with pytest.raises(ValueError, match="set num_workers to 1 or more"):
        TrainConfig(prefetch_factor=4)


def test_ddp_without_a_process_group_says_how_to_launch():
    with pytest.raises(RuntimeError, match="torchrun --nproc_per_node=2"):
        train(strategy="ddp", batch_size=8)


def test_too_little_data_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than one batch for every rank"):
        train(n_samples=6, batch_size=8)


def test_bf16_autocast_trains_on_cpu():
    history = train(n_samples=128, batch_size=16, epochs=3, lr=0.3, amp="bf16", dtype=torch.float32)
    assert history.losses[-1] < history.losses[0] and history.skipped_steps == 0


def test_fp16_on_cpu_is_a_clear_error():
    with pytest.raises(ValueError, match="amp='fp16' needs a CUDA device.*use amp='bf16'"):
        Precision("fp16", torch.device("cpu"), make_model())


def test_gradscaler_with_bf16_parameters_is_a_clear_error():
    with pytest.raises(ValueError, match="cannot unscale torch.bfloat16 gradients"):
        _check_fp16(torch.device("cuda"), make_model(dtype=torch.bfloat16))


def test_lr_scaling_and_warmup():
    config = TrainConfig(lr=0.1, batch_size=8, lr_scaling="linear")
    assert scaled_lr(config, 32) == pytest.approx(0.4)
    config = TrainConfig(lr=0.1, batch_size=8, lr_scaling="sqrt", base_global_batch_size=16)
    assert scaled_lr(config, 64) == pytest.approx(0.2)
    history = train(batch_size=8, grad_accum_steps=2, lr=0.1, lr_scaling="linear", warmup_steps=2, epochs=2)
    assert history.learning_rates[:3] == pytest.approx([0.1, 0.2, 0.2])


def test_gradient_clipping_bounds_each_update():
    model = make_model(dtype=torch.float64)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).clone()
    history = train(model=model, batch_size=8, max_steps=1, lr=1.0, grad_clip_norm=1e-3)
    after = torch.nn.utils.parameters_to_vector(history.model.parameters())
    assert (after - before).norm() <= 1e-3 + 1e-12


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs NCCL needs")
def test_nccl_without_gpus_says_what_to_do():
    with pytest.raises(RuntimeError, match="needs 2 GPUs, found .*use backend='gloo'"):
        check_gpus_for_nccl(2)
