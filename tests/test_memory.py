"""course_lib.topics.memory: the per-rank estimator, and its measured counterpart on real steps."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from course_lib import launch
from course_lib.training.data import make_dataset
from course_lib.topics.memory import (GiB, OPTIMIZERS, PRECISIONS, MemoryBreakdown, SavedActivations,
                               bytes_per_parameter, distinct_bytes, estimate_memory,
                               measure_model_state, measure_training_step,
                               transformer_activation_bytes)
from course_lib.training.models import make_model

LAUNCH_TIMEOUT = 90
HIDDEN = 256
N_PARAMETERS = 16 * HIDDEN + HIDDEN + HIDDEN * 4 + 4  # make_model(hidden=256)


@pytest.mark.parametrize("optimizer, precision, expected", [
    ("sgd", "fp32", (4, 4, 0)),
    ("sgd-momentum", "fp32", (4, 4, 4)),
    ("adam", "fp32", (4, 4, 8)),
    ("adamw", "bf16-mixed", (2, 2, 12)),  # fp32 master copy + two fp32 values
    ("sgd", "bf16-mixed", (2, 2, 4)),  # the master copy alone
    ("adam-8bit", "bf16-mixed", (2, 2, 6)),
    ("adam", "bf16", (2, 2, 4)),
    ("adam-8bit", "bf16", (2, 2, 2)),
    ("adam-8bit", "fp32", (4, 4, 2)),
])
def test_bytes_per_parameter(optimizer, precision, expected):
    per_parameter = bytes_per_parameter(optimizer, precision)
    assert (per_parameter["parameters"], per_parameter["gradients"],
            per_parameter["optimizer_state"]) == expected


def test_bad_recipes_say_what_to_use():
    with pytest.raises(ValueError, match="precision='fp16'"):
        bytes_per_parameter("adam", "fp16")
    with pytest.raises(ValueError, match="optimizer='lion'"):
        estimate_memory(10, optimizer="lion")
    with pytest.raises(ValueError, match="strategy='zero4'"):
        estimate_memory(10, strategy="zero4")
    with pytest.raises(ValueError, match="world_size=0"):
        estimate_memory(10, strategy="zero3", world_size=0)


@pytest.mark.parametrize("strategy, per_rank_bytes", [
    ("ddp", 16 * 1000), ("zero1", 4 * 1000 + 12 * 250), ("zero2", 2 * 1000 + 14 * 250),
    ("zero3", 16 * 250), ("fsdp", 16 * 250),
])
def test_strategies_shard_what_zero_says(strategy, per_rank_bytes):
    estimate = estimate_memory(1000, "adam", "bf16-mixed", strategy, world_size=4,
                               activation_bytes=123)
    assert estimate.total == per_rank_bytes + 123
    assert estimate.activations == 123  # never sharded


def test_shards_round_up_and_world_size_one_shards_nothing():
    assert estimate_memory(10, "adam", "fp32", "zero3", world_size=4).parameters == 3 * 4
    for strategy in ("ddp", "zero1", "zero2", "zero3"):
        assert estimate_memory(999, "adam", "fp32", strategy, 1).total == 16 * 999


def test_breakdown_total_parts_fits_and_describe():
    breakdown = MemoryBreakdown(parameters=1, gradients=2, optimizer_state=3, activations=4)
    assert breakdown.total == 10
    assert list(breakdown.parts()) == ["parameters", "gradients", "optimizer state", "activations"]
    assert breakdown.fits(10) and not breakdown.fits(9)
    assert breakdown.describe(unit=1, unit_name="B").splitlines()[-1].split() == ["total", "10.00", "B"]
    big = estimate_memory(8_400_000_000, "adam-8bit", "bf16")
    assert big.total == 6 * 8_400_000_000 and big.fits(48 * GiB)
    assert not estimate_memory(8_400_000_000, "adam-8bit", "bf16", activation_bytes=2 * GiB).fits(48 * GiB)


def test_transformer_activations_grow_with_the_batch_and_shrink_with_checkpointing():
    shape = dict(seq_len=2048, hidden=4096, n_layers=32, n_heads=32)
    one = transformer_activation_bytes(batch_size=1, **shape)
    assert transformer_activation_bytes(batch_size=4, **shape) == 4 * one
    assert one == 32 * 2048 * 4096 * 34
    assert transformer_activation_bytes(1, flash_attention=False, **shape) > one
    assert transformer_activation_bytes(1, checkpointing=True, **shape) < one / 5


def test_distinct_bytes_counts_shared_memory_once_and_views_by_what_they_cover():
    weight = torch.zeros(10, 10)
    assert distinct_bytes([weight, weight.t(), weight[2:5], weight[:, 1]]) == 400
    assert distinct_bytes([weight[:3], weight[5:]]) == 320
    assert distinct_bytes([torch.zeros(3, dtype=torch.bfloat16), torch.zeros(2)]) == 14
    assert distinct_bytes([]) == 0


@pytest.mark.parametrize("name, make_optimizer, state_bytes", [
    ("sgd", lambda params: torch.optim.SGD(params, lr=0.1), 0),
    ("sgd-momentum", lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9), 4 * N_PARAMETERS),
    ("adam", lambda params: torch.optim.Adam(params), 8 * N_PARAMETERS + 4 * 4),  # + step counters
])
def test_measured_step_matches_the_estimate(name, make_optimizer, state_bytes):
    model = make_model(seed=0, hidden=HIDDEN)
    X, y = make_dataset(512).tensors
    measured = measure_training_step(model, make_optimizer(model.parameters()), X[:64], y[:64])
    estimated = estimate_memory(N_PARAMETERS, name, "fp32")
    assert (measured.parameters, measured.gradients) == (estimated.parameters, estimated.gradients)
    assert measured.optimizer_state == state_bytes
    # input 16, ReLU output 256, log-probabilities 4 (fp32), label 8 (int64); one loss scalar
    assert measured.activations == 64 * (4 * (16 + HIDDEN + 4) + 8) + 4
    assert measured.peak is None


def test_a_bf16_model_measures_as_pure_bf16():
    model = make_model(seed=0, hidden=HIDDEN, dtype=torch.bfloat16)
    X, y = make_dataset(32, dtype=torch.bfloat16).tensors
    measured = measure_training_step(model, torch.optim.AdamW(model.parameters()), X, y)
    estimated = estimate_memory(N_PARAMETERS, "adamw", "bf16")
    assert measured.parameters == estimated.parameters == 2 * N_PARAMETERS
    assert measured.optimizer_state - 4 * 4 == estimated.optimizer_state


def test_saved_activations_see_checkpointing_drop_the_insides():
    blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(),
                                                     torch.nn.Linear(128, 32)) for _ in range(4))
    X = torch.randn(64, 32)

    def saved_bytes(use_checkpoint):
        with SavedActivations(blocks) as saved:
            h = X
            for block in blocks:
                h = checkpoint(block, h, use_reentrant=False) if use_checkpoint else block(h)
            loss = h.square().mean()
        kept = saved.bytes
        loss.backward()
        assert saved.bytes == 0  # backward freed them
        return kept

    plain, checkpointed = saved_bytes(False), saved_bytes(True)
    # plain: each block's input, the first Linear's output and the GELU's output (32 + 128 + 128)
    assert plain == 4 * 64 * 4 * (32 + 128 + 128) + 4 * 64 * 32  # + the output, kept by square
    assert checkpointed == 4 * 64 * 4 * 32 + 4 * 64 * 32  # the blocks' inputs only


def sharded_state_on_each_rank():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    X, y = make_dataset(16, seed=dist.get_rank()).tensors
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fsdp_model = make_model(seed=0, hidden=HIDDEN)
    for layer in fsdp_model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(fsdp_model, mesh=mesh)
    fsdp_optimizer = torch.optim.Adam(fsdp_model.parameters())
    F.cross_entropy(fsdp_model(X), y).backward()
    fsdp_optimizer.step()
    zero1_model = DDP(make_model(seed=0, hidden=HIDDEN))
    zero1_optimizer = ZeroRedundancyOptimizer(zero1_model.parameters(),
                                              optimizer_class=torch.optim.Adam)
    F.cross_entropy(zero1_model(X), y).backward()
    zero1_optimizer.step()
    return (measure_model_state(fsdp_model, fsdp_optimizer),
            measure_model_state(zero1_model, zero1_optimizer))


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_fsdp_and_zero1_shards_are_counted_per_rank():
    per_rank = launch(sharded_state_on_each_rank, nprocs=2, backend="gloo",
                      timeout=LAUNCH_TIMEOUT, output="none")
    estimate = estimate_memory(N_PARAMETERS, "adam", "fp32", "fsdp", world_size=2)
    for fsdp, zero1 in per_rank:
        assert (fsdp.parameters, fsdp.gradients) == (estimate.parameters, estimate.gradients)
        assert fsdp.optimizer_state == estimate.optimizer_state + 4 * 4  # + Adam's step counters
        assert zero1.parameters == zero1.gradients == 4 * N_PARAMETERS  # replicated
    # ZeroRedundancyOptimizer splits whole tensors: together the ranks hold Adam's state once
    state_values = sum(zero1.optimizer_state for _, zero1 in per_rank) - 4 * 4
    assert state_values == 8 * N_PARAMETERS
