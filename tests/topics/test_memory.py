"""course_lib.topics.memory: the per-rank estimator, and its measured counterpart on real steps."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from course_lib import launch
from course_lib.training.data import make_dataset
from course_lib.topics.memory import (GiB, ESTIMATED_OPTIMIZERS, PRECISIONS, MemoryBreakdown, SavedActivations,
                               bytes_per_parameter, distinct_bytes, estimate_memory,
                               measure_model_state, measure_training_step, read_oom_message,
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


@pytest.mark.parametrize("optimizer", ESTIMATED_OPTIMIZERS)
def test_fsdp_mixed_precision_keeps_fp32_shards_and_no_master_copy(optimizer):
    # FSDP2's MixedPrecisionPolicy: the fp32 sharded parameter is the optimizer's, its gradient
    # fp32; ZeRO's layout puts the same 4 bytes of fp32 weights in the optimizer state instead
    fsdp = bytes_per_parameter(optimizer, "bf16-mixed", "fsdp")
    zero = bytes_per_parameter(optimizer, "bf16-mixed", "zero3")
    assert (fsdp["parameters"], fsdp["gradients"]) == (4, 4)
    assert fsdp["optimizer_state"] == zero["optimizer_state"] - 4
    assert sum(fsdp.values()) == sum(zero.values())
    for precision in ("fp32", "bf16"):  # no master copy to move: the same layout
        assert bytes_per_parameter(optimizer, precision, "fsdp") == bytes_per_parameter(optimizer, precision)


def test_bad_recipes_say_what_to_use():
    with pytest.raises(ValueError, match="precision='fp16'"):
        bytes_per_parameter("adam", "fp16")
    with pytest.raises(ValueError, match="optimizer='lion'"):
        estimate_memory(10, optimizer="lion")
    with pytest.raises(ValueError, match="strategy='zero4'"):
        estimate_memory(10, strategy="zero4")
    with pytest.raises(ValueError, match="world_size=0"):
        estimate_memory(10, strategy="zero3", world_size=0)
    with pytest.raises(ValueError, match="strategy='fsdp1'"):
        bytes_per_parameter("adam", "bf16-mixed", "fsdp1")


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
    # the published formula, sbh(34 + 5as/h) per layer, for lesson 11's 8.4 B model: ~121 GiB
    published = transformer_activation_bytes(1, 4096, 4096, 40, 32, flash_attention=False)
    assert published == 40 * 4096 * 4096 * (34 + 5 * 32 * 4096 // 4096)
    assert round(published / GiB) == 121
    assert round(transformer_activation_bytes(1, 4096, 4096, 40, 32) / GiB, 1) == 21.2
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


def fsdp_step(X, y, mp_policy):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    fsdp_model = make_model(seed=0, hidden=HIDDEN)
    for layer in fsdp_model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=mp_policy)
    fully_shard(fsdp_model, mesh=mesh, mp_policy=mp_policy)
    fsdp_optimizer = torch.optim.Adam(fsdp_model.parameters())
    F.cross_entropy(fsdp_model(X), y).backward()
    fsdp_optimizer.step()
    return measure_model_state(fsdp_model, fsdp_optimizer)


def sharded_state_on_each_rank():
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    X, y = make_dataset(16, seed=dist.get_rank()).tensors
    fsdp = fsdp_step(X, y, MixedPrecisionPolicy())
    fsdp_bf16 = fsdp_step(X, y, MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    zero1_model = DDP(make_model(seed=0, hidden=HIDDEN))
    zero1_optimizer = ZeroRedundancyOptimizer(zero1_model.parameters(),
                                              optimizer_class=torch.optim.Adam)
    F.cross_entropy(zero1_model(X), y).backward()
    zero1_optimizer.step()
    return fsdp, measure_model_state(zero1_model, zero1_optimizer), fsdp_bf16


@pytest.mark.timeout(LAUNCH_TIMEOUT + 30)
def test_fsdp_and_zero1_shards_are_counted_per_rank():
    per_rank = launch(sharded_state_on_each_rank, nprocs=2, backend="gloo",
                      timeout=LAUNCH_TIMEOUT, output="none")
    estimate = estimate_memory(N_PARAMETERS, "adam", "fp32", "fsdp", world_size=2)
    mixed = estimate_memory(N_PARAMETERS, "adam", "bf16-mixed", "fsdp", world_size=2)
    for fsdp, zero1, fsdp_bf16 in per_rank:
        assert (fsdp.parameters, fsdp.gradients) == (estimate.parameters, estimate.gradients)
        assert fsdp.optimizer_state == estimate.optimizer_state + 4 * 4  # + Adam's step counters
        assert zero1.parameters == zero1.gradients == 4 * N_PARAMETERS  # replicated
        # bf16 compute, but what stays between steps is fp32 and sharded, as FSDP's docstring says
        assert (fsdp_bf16.parameters, fsdp_bf16.gradients) == (mixed.parameters, mixed.gradients)
        assert fsdp_bf16.optimizer_state == mixed.optimizer_state + 4 * 4
    # ZeroRedundancyOptimizer splits whole tensors: together the ranks hold Adam's state once
    state_values = sum(zero1.optimizer_state for _, zero1, _ in per_rank) - 4 * 4
    assert state_values == 8 * N_PARAMETERS


def test_read_oom_message_reads_the_allocators_sizes_and_points_to_the_cause():
    # the sentences of c10/cuda/CUDACachingAllocator.cpp's message, sizes as its format_size writes them
    def message(requested, free, process, allocated, unallocated, others=""):
        return (f"CUDA out of memory. Tried to allocate {requested}. GPU 0 has a total capacity of "
                f"79.19 GiB of which {free} is free. {others}Including non-PyTorch memory, this process "
                f"has {process} memory in use. Of the allocated memory {allocated} is allocated "
                f"by PyTorch, and {unallocated} is reserved by PyTorch but unallocated. If "
                f"reserved but unallocated memory is large try setting "
                f"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")

    report = read_oom_message(message("2.00 GiB", "1.06 GiB", "78.12 GiB", "71.50 GiB", "5.97 GiB"))
    assert report.requested == 2 * GiB and report.reserved_unallocated == round(5.97 * GiB)
    assert report.this_process == round(78.12 * GiB)
    assert "fragmentation" in report.diagnosis
    assert "fill the GPU" in read_oom_message(
        message("2.00 GiB", "1.06 GiB", "78.12 GiB", "77.30 GiB", "176.00 MiB")).diagnosis
    others = "Process 4242 has 30.00 GiB memory in use. Process 4343 has 8.00 GiB memory in use. "
    crowded = read_oom_message(message("2.00 GiB", "1.06 GiB", "40.00 GiB", "39.30 GiB",
                                       "176.00 MiB", others))
    assert crowded.other_processes == 38 * GiB and "other processes" in crowded.diagnosis
    assert "may be this process" not in crowded.diagnosis
    in_a_container = read_oom_message(  # NVML's host PIDs: this process is one of the "Process N"
        message("2.00 GiB", "1.06 GiB", "1", "39.30 GiB", "176.00 MiB", others).replace(
            "Including non-PyTorch memory, this process has 1 memory in use. ", ""))
    assert in_a_container.this_process is None and "may be this process" in in_a_container.diagnosis
    assert "larger than the whole GPU" in read_oom_message(
        message("120.00 GiB", "70.00 GiB", "9.00 GiB", "8.50 GiB", "0 bytes")).diagnosis
    without_nvml = message("2.00 GiB", "1.06 GiB", "1", "71.50 GiB", "5.97 GiB").replace(
        "Including non-PyTorch memory, this process has 1 memory in use. ", "")
    assert read_oom_message(without_nvml).this_process is None
    with pytest.raises(ValueError, match="not a CUDA out-of-memory message"):
        read_oom_message("RuntimeError: CUDA error: an illegal memory access was encountered")
