"""The pitfalls clinic's helpers: SyncBatchNorm's collectives counted on CPU ranks, and the seeds
DataLoader workers start from (equal across ranks unless the loader has a per-rank generator)."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from course_lib import launch, make_dataset
from course_lib.topics import pitfalls
from course_lib.topics.collectives import count_traffic

pytestmark = pytest.mark.timeout(120)
LAUNCH_TIMEOUT = 60


def _model(seed=0, channels=32):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, channels), nn.BatchNorm1d(channels), nn.ReLU(),
                         nn.Linear(channels, 4))


def _sync_batchnorm_step(samples_per_rank):
    rank, world_size = dist.get_rank(), dist.get_world_size()
    model = nn.SyncBatchNorm.convert_sync_batchnorm(_model())
    X, y = make_dataset(n_samples=sum(samples_per_rank)).tensors
    start = sum(samples_per_rank[:rank])
    X, y = X[start:start + samples_per_rank[rank]], y[start:start + samples_per_rank[rank]]
    with pitfalls.sync_batchnorm_on_cpu(), count_traffic() as traffic:
        loss = F.cross_entropy(model(X), y, reduction="sum")
        in_forward = list(traffic.collectives)
        loss.backward()
    return (in_forward, traffic.collectives[len(in_forward):], model[1].running_mean,
            model[1].running_var, model[0].weight.grad, model[1].weight.grad)


@pytest.mark.parametrize("samples_per_rank", [(8, 8), (5, 11)])
def test_sync_batchnorm_on_cpu_matches_one_process_on_the_global_batch(samples_per_rank):
    ranks = launch(_sync_batchnorm_step, samples_per_rank, nprocs=2, backend="gloo",
                   timeout=LAUNCH_TIMEOUT, output="none")
    reference = _model()
    X, y = make_dataset(n_samples=sum(samples_per_rank)).tensors
    F.cross_entropy(reference(X), y, reduction="sum").backward()
    for in_forward, in_backward, running_mean, running_var, _, _ in ranks:
        assert in_forward == ["all_gather"] and in_backward == ["all_reduce"]
        assert torch.allclose(running_mean, reference[1].running_mean, atol=1e-6)
        assert torch.allclose(running_var, reference[1].running_var, atol=1e-6)
    # A summed loss: the global gradient is the sum of the ranks' (what DDP's all-reduce sums).
    for index, parameter in ((4, reference[0].weight), (5, reference[1].weight)):
        assert torch.allclose(sum(rank[index] for rank in ranks), parameter.grad, atol=1e-5)


def test_sync_batchnorm_on_cpu_restores_the_device_check_and_kernels():
    with pitfalls.sync_batchnorm_on_cpu():
        assert torch._C._get_privateuse1_backend_name() == "cpu"
    assert torch._C._get_privateuse1_backend_name() != "cpu"
    with pytest.raises(NotImplementedError):
        torch.batch_norm_stats(torch.randn(4, 3), 1e-5)  # GPU-only again


def _worker_seeds(generator_per_rank):
    torch.manual_seed(0)
    generator = (torch.Generator().manual_seed(dist.get_rank()) if generator_per_rank else None)
    loader = DataLoader(pitfalls.WorkerSeed(4), batch_size=2, num_workers=2, generator=generator)
    return [(worker[0].item(), seed[0].item()) for worker, seed, _ in loader]


@pytest.mark.parametrize("generator_per_rank", [False, True])
def test_worker_seeds_repeat_across_ranks_unless_the_loader_has_a_per_rank_generator(
        generator_per_rank):
    rank0, rank1 = launch(_worker_seeds, generator_per_rank, nprocs=2, backend="gloo",
                          timeout=LAUNCH_TIMEOUT, output="none")
    assert [worker for worker, _ in rank0] == [0, 1]
    assert rank0[1][1] == rank0[0][1] + 1  # base_seed + worker_id within a rank
    assert (rank0 == rank1) is not generator_per_rank


def test_worker_seed_in_the_main_process():
    worker, seed, value = pitfalls.WorkerSeed()[0]
    assert worker == -1 and seed == torch.initial_seed() and 0 <= value < 1
