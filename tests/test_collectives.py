"""course_lib.topics.collectives: the reference all-reduces, the traffic counter and the cost model."""
import math

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from course_lib import launch
from course_lib.topics.collectives import (algorithm_bandwidth, bus_bandwidth, count_traffic,
                                    fit_alpha_beta, measure_all_reduce, naive_all_reduce,
                                    naive_all_reduce_time, ring_all_reduce, ring_all_reduce_time,
                                    tree_all_reduce_time)
from course_lib.topics.traffic import COLLECTIVES, POINT_TO_POINT

# More ranks than this machine's cores is fine for correctness; the launcher's warning says so.
pytestmark = pytest.mark.filterwarnings(r"ignore:\d+ ranks on \d+ CPU cores:RuntimeWarning")
LAUNCH_TIMEOUT = 60
SHAPES = [(1,), (7,), (3, 5), (1200,)]  # fewer elements than ranks, not divisible, 2-D, divisible


def reduce_every_shape_three_ways(shapes):
    """On each rank: dist.all_reduce, the ring and the naive version of the same random tensors."""
    rank, results = dist.get_rank(), []
    for shape in shapes:
        local = torch.randn(shape, dtype=torch.float64,
                            generator=torch.Generator().manual_seed(100 * rank + len(results)))
        expected, ring, naive = local.clone(), local.clone(), local.clone()
        dist.all_reduce(expected)
        with count_traffic() as ring_traffic:
            ring_all_reduce(ring)
        with count_traffic() as naive_traffic:
            naive_all_reduce(naive)
        results.append((expected, ring, naive, ring_traffic, naive_traffic))
    return results


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_reference_all_reduces_equal_dist_all_reduce(world_size):
    per_rank = launch(reduce_every_shape_three_ways, SHAPES, nprocs=world_size, backend="gloo",
                      timeout=LAUNCH_TIMEOUT)
    for rank, results in enumerate(per_rank):
        for shape, (expected, ring, naive, ring_traffic, naive_traffic) in zip(SHAPES, results):
            torch.testing.assert_close(ring, expected, msg=f"ring, rank {rank}, shape {shape}")
            torch.testing.assert_close(naive, expected, msg=f"naive, rank {rank}, shape {shape}")
            assert ring_traffic.rank == rank
            assert ring_traffic.collectives == [] and naive_traffic.collectives == []

    nbytes = 1200 * 8  # the divisible shape: the ring's traffic is exactly 2 (N - 1) / N * nbytes
    for rank, results in enumerate(per_rank):
        ring_traffic, naive_traffic = results[-1][3], results[-1][4]
        assert ring_traffic.bytes_sent == ring_traffic.bytes_received \
            == 2 * (world_size - 1) * nbytes // world_size
        if world_size > 1:
            assert set(ring_traffic.bytes_sent_to) == {(rank + 1) % world_size}
            assert set(ring_traffic.bytes_received_from) == {(rank - 1) % world_size}
        assert naive_traffic.bytes_sent == (world_size - 1) * nbytes if rank == 0 \
            else naive_traffic.bytes_sent == nbytes


def test_ring_traffic_is_about_two_tensors_per_rank_for_uneven_sizes():
    def ring_traffic_of_seven_elements():
        with count_traffic() as traffic:
            ring_all_reduce(torch.ones(7))
        return traffic.bytes_sent

    sent = launch(ring_traffic_of_seven_elements, nprocs=3, backend="gloo", timeout=LAUNCH_TIMEOUT)
    # Chunks of 3, 2 and 2 float32 elements. Rank r sends every chunk but (r + 1) % 3 in the
    # reduce-scatter, and every chunk but (r + 2) % 3 in the all-gather.
    chunk_sizes = [3, 2, 2]
    assert sent == [4 * (2 * 7 - chunk_sizes[(rank + 1) % 3] - chunk_sizes[(rank + 2) % 3])
                    for rank in range(3)]
    assert sum(sent) / 3 == pytest.approx(2 * (3 - 1) / 3 * 4 * 7)  # 2 (N-1)/N * nbytes on average


def traffic_of_direct_calls():
    """A rank that calls collectives directly and point-to-point in each way a learner might."""
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    tensor = torch.ones(10)  # 40 bytes
    with count_traffic() as traffic:
        dist.all_reduce(tensor)
        dist.barrier()
        if rank == 0:
            torch.distributed.send(tensor, dst=peer)
        else:
            dist.recv(tensor, src=peer)
        operations = [dist.P2POp(dist.isend, tensor, peer),
                      dist.P2POp(dist.irecv, torch.empty(10), peer)]
        for request in dist.batch_isend_irecv(operations):
            request.wait()
        dist.all_gather_object([None, None], rank)
    return traffic


def test_counter_sees_collectives_and_every_way_of_sending():
    rank0, rank1 = launch(traffic_of_direct_calls, nprocs=2, backend="gloo", timeout=LAUNCH_TIMEOUT)
    # all_gather_object counts as the all_gather it makes (its object-size exchange included).
    assert rank0.collectives[:2] == ["all_reduce", "barrier"]
    assert set(rank0.collectives[2:]) == {"all_gather"}
    assert rank0.bytes_sent_to == {1: 40 + 40} and rank0.bytes_received_from == {1: 40}
    assert rank1.bytes_sent_to == {0: 40} and rank1.bytes_received_from == {0: 40 + 40}


def test_counter_restores_the_originals_even_after_an_exception():
    originals = {name: getattr(dist, name) for name in POINT_TO_POINT + COLLECTIVES}
    with pytest.raises(ZeroDivisionError):
        with count_traffic():
            assert dist.send is not originals["send"] and c10d.isend is not originals["isend"]
            1 / 0
    assert {name: getattr(dist, name) for name in originals} == originals
    assert all(getattr(c10d, name) is function for name, function in originals.items())


def test_counter_blocks_cannot_be_nested():
    with count_traffic():
        with pytest.raises(RuntimeError, match="already counting"):
            with count_traffic():
                pass


def test_measure_all_reduce_returns_one_median_per_size_equal_on_all_ranks():
    measured = launch(measure_all_reduce, [4, 4000], repeats=3, warmup=1, nprocs=2,
                      backend="gloo", timeout=LAUNCH_TIMEOUT)
    assert measured[0] == measured[1]
    assert [nbytes for nbytes, _ in measured[0]] == [4, 4000]
    assert all(seconds > 0 for _, seconds in measured[0])


ALPHA, BETA = 5e-6, 1 / 20e9  # 5 microseconds, 20 GB/s
SIZES = [2 ** k for k in range(10, 31, 2)]


def test_cost_model_formulas():
    assert ring_all_reduce_time(1e9, 4, ALPHA, BETA) == pytest.approx(6 * ALPHA + 1.5e9 * BETA)
    assert naive_all_reduce_time(1e9, 4, ALPHA, BETA) == pytest.approx(6 * (ALPHA + 1e9 * BETA))
    assert tree_all_reduce_time(1e9, 5, ALPHA, BETA) == pytest.approx(6 * (ALPHA + 1e9 * BETA))
    for model in (ring_all_reduce_time, naive_all_reduce_time, tree_all_reduce_time):
        assert model(1e9, 1, ALPHA, BETA) == 0  # one rank sends nothing
    # For large tensors the ring's time barely grows with N; the naive one grows linearly.
    assert ring_all_reduce_time(1e9, 64, ALPHA, BETA) < 1.01 * 2 * 1e9 * BETA


@pytest.mark.parametrize("world_size", [None, 2, 8])
def test_fit_recovers_alpha_and_beta_from_synthetic_times(world_size):
    if world_size is None:
        times = [ALPHA + n * BETA for n in SIZES]
    else:
        times = [ring_all_reduce_time(n, world_size, ALPHA, BETA) for n in SIZES]
    alpha, beta = fit_alpha_beta(SIZES, times, world_size=world_size)
    assert alpha == pytest.approx(ALPHA, rel=1e-6) and beta == pytest.approx(BETA, rel=1e-6)


def test_fit_tolerates_noise_and_keeps_the_latency_of_small_messages():
    noise = 1 + 0.02 * torch.randn(len(SIZES), generator=torch.Generator().manual_seed(0))
    times = [ring_all_reduce_time(n, 4, ALPHA, BETA) * float(e) for n, e in zip(SIZES, noise)]
    alpha, beta = fit_alpha_beta(SIZES, times, world_size=4)
    assert alpha == pytest.approx(ALPHA, rel=0.1) and beta == pytest.approx(BETA, rel=0.1)


@pytest.mark.parametrize("sizes, times, message", [([1, 1], [1.0, 2.0], "two different"),
                                                   ([1, 2], [1.0], "one time per size"),
                                                   ([1, 2], [1.0, 0.0], "must be positive")])
def test_fit_rejects_data_it_cannot_fit(sizes, times, message):
    with pytest.raises(ValueError, match=message):
        fit_alpha_beta(sizes, times)


def test_bus_bandwidth_is_nccl_tests_definition():
    assert algorithm_bandwidth(1e9, 0.1) == pytest.approx(1e10)
    assert bus_bandwidth(1e9, 0.1, world_size=4) == pytest.approx(1e10 * 2 * 3 / 4)
    assert bus_bandwidth(1e9, 0.1, world_size=1) == 0
    # Bus bandwidth of the ideal ring is 1 / beta at any world size: that is why it is reported.
    for world_size in (2, 8, 64):
        seconds = ring_all_reduce_time(2 ** 30, world_size, 0.0, BETA)
        assert bus_bandwidth(2 ** 30, seconds, world_size) == pytest.approx(1 / BETA)
    assert math.isclose(bus_bandwidth(8, 1.0, 2), 8.0)
