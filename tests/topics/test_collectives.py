"""course_lib.topics.collectives: the reference all-reduces, the traffic counter, the cost model,
and the watcher of DataParallel's copies (course_lib.topics.traffic)."""
import math

import pytest
import torch
import torch.distributed as dist

from torch.nn.parallel import comm as data_parallel_comm

from course_lib import launch, make_model
from course_lib.checks.lesson03 import check_ring_all_reduce
from course_lib.topics.collectives import (algorithm_bandwidth, bus_bandwidth, count_traffic,
                                    fit_alpha_beta, measure_all_reduce, naive_all_reduce,
                                    naive_all_reduce_time, ring_all_reduce, ring_all_reduce_time,
                                    ring_chunks, tree_all_reduce_time)
from course_lib.topics.cost_model import (data_parallel_device0_bytes, ring_all_reduce_bytes,
                                          ring_broadcast_bytes)
from course_lib.topics.traffic import CommCall, watch_data_parallel_comm

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
    from torch.distributed import irecv, isend  # names bound before the block are counted too

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
        dist.all_gather_into_tensor(torch.empty(20), tensor)
        if rank == 0:
            isend(torch.ones(3, dtype=torch.float64), peer).wait()    # 24 bytes
        else:
            irecv(torch.empty(3, dtype=torch.float64)).wait()          # from any rank
    return traffic


def test_counter_sees_collectives_and_every_way_of_sending():
    rank0, rank1 = launch(traffic_of_direct_calls, nprocs=2, backend="gloo", timeout=LAUNCH_TIMEOUT)
    # all_gather_object counts as the all_gathers it makes (its object-size exchange included),
    # and all_gather_into_tensor as an all_gather, on every torch version.
    assert rank0.collectives[:2] == ["all_reduce", "barrier"]
    assert len(rank0.collectives) >= 4 and set(rank0.collectives[2:]) == {"all_gather"}
    assert rank0.collectives == rank1.collectives
    assert rank0.bytes_sent_to == {1: 40 + 40 + 24} and rank0.bytes_received_from == {1: 40}
    assert rank1.bytes_sent_to == {0: 40} and rank1.bytes_received_from == {0: 40 + 40, "any": 24}


def send_within_a_subgroup():
    """Global ranks 1 and 2 talk in the group [1, 2, 3], where they are ranks 0 and 1."""
    group = dist.new_group([1, 2, 3])
    rank, tensor = dist.get_rank(), torch.ones(5)  # 20 bytes
    with count_traffic() as traffic:
        if rank == 1:
            dist.send(tensor, dst=2, group=group)  # torch.distributed takes global ranks here
        elif rank == 2:
            dist.recv(tensor, src=1, group=group)
    return traffic


def test_counter_names_peers_by_their_global_rank_in_a_subgroup():
    traffics = launch(send_within_a_subgroup, nprocs=4, backend="gloo", timeout=LAUNCH_TIMEOUT)
    assert traffics[1].bytes_sent_to == {2: 20} and traffics[2].bytes_received_from == {1: 20}
    assert traffics[0].bytes_sent == traffics[3].bytes_sent == 0


def ddp_steps_counted(steps):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
    with count_traffic() as traffic:
        for _ in range(steps):
            model(torch.randn(8, 4)).sum().backward()
    return traffic


def test_counter_sees_the_all_reduces_ddp_starts_from_cpp():
    traffic, _ = launch(ddp_steps_counted, 3, nprocs=2, backend="gloo", timeout=LAUNCH_TIMEOUT)
    # one bucket, so one all-reduce per backward (and DDP's own broadcasts after the first step)
    assert traffic.collectives.count("all_reduce") == 3
    assert set(traffic.collectives) <= {"all_reduce", "broadcast"}


def collectives_of_known_sizes():
    """Each kind of collective once, with tensors whose bytes the test knows."""
    rank = dist.get_rank()
    with count_traffic() as traffic:
        dist.all_reduce(torch.ones(10))                                # 40 bytes, in place
        dist.broadcast(torch.ones(3, dtype=torch.float64), src=0)      # 24 bytes, on every rank
        dist.all_gather_into_tensor(torch.empty(20), torch.ones(10))   # hands in its 40 bytes
        dist.all_gather([torch.empty(5), torch.empty(5)], torch.ones(5))  # 20 bytes
        dist.reduce_scatter(torch.empty(4), [torch.ones(4), torch.ones(4)])  # 32 bytes in
        dist.barrier()                                                 # no payload
        dist.scatter(torch.empty(2), [torch.ones(2), torch.ones(2)] if rank == 0 else None, src=0)
    return traffic


def test_counter_adds_up_the_bytes_handed_to_each_collective():
    rank0, rank1 = launch(collectives_of_known_sizes, nprocs=2, backend="gloo",
                          timeout=LAUNCH_TIMEOUT)
    common = {"all_reduce": 40, "broadcast": 24, "all_gather": 40 + 20, "reduce_scatter": 32}
    assert rank0.collective_bytes == {**common, "scatter": 16}  # the root hands in both chunks
    assert rank1.collective_bytes == {**common, "scatter": 0}
    assert "barrier" in rank0.collectives and "barrier" not in rank0.collective_bytes
    assert rank0.bytes_sent == rank0.bytes_received == 0  # collectives are not point-to-point


def ddp_then_zero1_payloads(world_size_check=2):
    """The bytes one steady step hands to collectives: DDP with Adam, then DDP with ZeRO-1."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    assert dist.get_world_size() == world_size_check
    payloads = {}
    for use_zero in (False, True):
        model = torch.nn.parallel.DistributedDataParallel(make_model(seed=0, hidden=32))
        optimizer = (ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam)
                     if use_zero else torch.optim.Adam(model.parameters()))
        for _ in range(3):  # the second step's forward also broadcasts DDP's rebuilt buckets
            with count_traffic() as traffic:
                model(torch.randn(8, 16)).sum().backward()
                optimizer.step()
        payloads[use_zero] = dict(traffic.collective_bytes)
    return payloads


def test_zero1_under_ddp_all_reduces_every_gradient_and_broadcasts_every_parameter():
    payloads = launch(ddp_then_zero1_payloads, nprocs=2, backend="gloo", timeout=LAUNCH_TIMEOUT)[0]
    parameter_bytes = 4 * sum(p.numel() for p in make_model(seed=0, hidden=32).parameters())
    assert payloads[False] == {"all_reduce": parameter_bytes}
    assert payloads[True] == {"all_reduce": parameter_bytes, "broadcast": parameter_bytes}


def ring_on_imported_names(tensor):
    """A learner's ring on names bound before the check: `from torch.distributed import isend`."""
    from torch.distributed import irecv, isend

    rank, world_size = dist.get_rank(), dist.get_world_size()
    chunks = ring_chunks(tensor, world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    for step in range(2 * (world_size - 1)):
        gathering = step >= world_size - 1  # the second half passes on the summed chunks
        send_index, receive_index = (rank - step) % world_size, (rank - step - 1) % world_size
        incoming = torch.empty_like(chunks[receive_index])
        requests = [isend(chunks[send_index], right)] if chunks[send_index].numel() else []
        requests += [irecv(incoming, left)] if incoming.numel() else []
        for request in requests:
            request.wait()
        if gathering:
            chunks[receive_index].copy_(incoming)
        else:
            chunks[receive_index] += incoming
    return tensor


def test_the_ring_grader_counts_a_ring_built_on_names_imported_before_the_check(capsys):
    check_ring_all_reduce(ring_on_imported_names)
    assert "ring all-reduce" in capsys.readouterr().out


def test_counter_stops_counting_when_the_block_ends_even_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with count_traffic() as traffic:
            torch.ones(2).add_(1)
            1 / 0
    with count_traffic() as second:  # a new block opens: the first one was closed
        pass
    assert traffic.collectives == second.collectives == []
    torch.ones(2).add_(1)  # runs without any mode left behind


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


def test_data_parallel_and_ring_bytes_per_step():
    parameter_bytes = 1000
    # With NCCL, device 0 is the root of one broadcast and one reduce: P each way, whatever N.
    assert [data_parallel_device0_bytes(parameter_bytes, n) for n in (2, 4, 16)] == [1000] * 3
    # Without NCCL, one copy per other device each way: a star.
    assert data_parallel_device0_bytes(parameter_bytes, 4, nccl=False) == 3000
    assert data_parallel_device0_bytes(parameter_bytes, 1) == 0  # one device: nothing is copied
    with pytest.raises(ValueError, match="at least one device"):
        data_parallel_device0_bytes(parameter_bytes, 0)
    assert ring_all_reduce_bytes(parameter_bytes, 4) == pytest.approx(1500)
    assert ring_all_reduce_bytes(parameter_bytes, 1) == 0
    # A ring broadcast: N - 1 of the N ranks forward the tensor once.
    assert ring_broadcast_bytes(parameter_bytes, 4) == pytest.approx(750)
    assert ring_broadcast_bytes(parameter_bytes, 1) == 0
    # ZeRO-1 as torch runs it: DDP's all-reduce plus a broadcast of every parameter, 1.5x DDP.
    for world_size in (2, 8, 64):
        zero1 = ring_all_reduce_bytes(parameter_bytes, world_size) + ring_broadcast_bytes(
            parameter_bytes, world_size)
        assert zero1 == pytest.approx(1.5 * ring_all_reduce_bytes(parameter_bytes, world_size))


def test_watching_data_parallel_runs_torch_replicate_and_records_broadcast_then_one_reduce():
    model = make_model(seed=0).to("meta")
    parameter_bytes = 4 * sum(parameter.numel() for parameter in model.parameters())
    X, y = torch.empty(6, 16, device="meta"), torch.zeros(6, dtype=torch.long, device="meta")
    with watch_data_parallel_comm() as calls:
        replicas = torch.nn.parallel.replicate(model, [0, 1, 2])
        for index, replica in enumerate(replicas):
            replica[0].weight.register_hook(lambda grad, index=index: calls.append(index))
        logits = torch.cat([replica(chunk) for replica, chunk in zip(replicas, X.chunk(3))])
        torch.nn.functional.cross_entropy(logits, y).backward()
    broadcast, *gradients_ready, reduce = calls
    assert isinstance(broadcast, CommCall) and broadcast.name == "broadcast_coalesced"
    assert (broadcast.tensors, broadcast.nbytes) == (4, parameter_bytes)
    assert broadcast.devices == [0, 1, 2]
    assert sorted(gradients_ready) == [0, 1, 2]  # every replica's backward, before the one reduce
    assert reduce.name == "reduce_add_coalesced" and reduce.nbytes == parameter_bytes
    assert len(reduce.devices) == 3 and "3 replicas" in str(reduce) and "[1, 2]" in str(broadcast)
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_data_parallel_stand_ins_compute_what_torch_returns_and_are_removed_after_the_block():
    originals = (data_parallel_comm.broadcast_coalesced, data_parallel_comm.reduce_add_coalesced)
    first, second = [torch.ones(2), torch.arange(3.0)], [torch.ones(2), torch.ones(3)]
    with pytest.raises(RuntimeError, match="inside"):
        with watch_data_parallel_comm():
            copies = data_parallel_comm.broadcast_coalesced(first, [0, 1])
            assert copies[0][0] is first[0] and torch.equal(copies[1][1], first[1])
            assert copies[1][1] is not first[1]
            sums = data_parallel_comm.reduce_add_coalesced([first, second], 0)
            assert torch.equal(sums[0], torch.full((2,), 2.0))
            assert torch.equal(sums[1], torch.tensor([1.0, 2.0, 3.0]))
            assert torch.equal(first[0], torch.ones(2))  # the inputs are left as they were
            raise RuntimeError("an error inside the block")
    assert (data_parallel_comm.broadcast_coalesced,
            data_parallel_comm.reduce_add_coalesced) == originals
