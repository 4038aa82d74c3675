"""spawn, mp.spawn's drop-in, and code that sets up its own process group under launch or spawn.

Each pattern is how a tutorial, a forum answer or a lab's script does it; all run on 2 real ranks.
"""
import os
import socket
import time

import pytest
import torch
import torch.distributed as dist

from course_lib import DistributedRunError, launch, spawn
from course_lib.topics.cluster import free_port
from scripts import process_is_gone

pytestmark = pytest.mark.timeout(120)


def _sum_of_rank_plus_one(rank):
    """Every rank contributes rank + 1 and sees the total; then the group is taken down."""
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return total.item()


def test_spawn_calls_fn_with_the_rank_first_and_returns_each_ranks_result():
    offset = 100  # a closure: torch.multiprocessing.spawn could not pickle this function

    def tutorial_fn(rank, world_size, scale):
        return offset + rank * scale, world_size, int(os.environ["RANK"])

    results = spawn(tutorial_fn, args=(2, 10), nprocs=2, timeout=60, output="none")
    assert results == [(100, 2, 0), (110, 2, 1)]


def test_the_ddp_tutorials_setup_with_its_own_fixed_port_runs_and_runs_again():
    port = free_port()

    def setup_and_sum(rank, world_size):  # the DDP tutorial's setup(rank, world_size)
        os.environ["MASTER_ADDR"] = "localhost"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        return _sum_of_rank_plus_one(rank)

    for _ in range(2):  # re-running the cell reuses the port its last run just freed
        assert spawn(setup_and_sum, args=(2,), nprocs=2, timeout=60, output="none") == [3.0, 3.0]


def test_the_distributed_tutorials_init_process_runs_in_freshly_spawned_interpreters():
    port = free_port()

    def init_process(rank, size, fn, backend="gloo"):  # the distributed tutorial's template
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group(backend, rank=rank, world_size=size)
        return fn(rank)

    results = spawn(init_process, args=(2, _sum_of_rank_plus_one), nprocs=2, timeout=60,
                    start_method="spawn", output="none")
    assert results == [3.0, 3.0]


def test_a_tcp_init_method_with_explicit_rank_and_world_size_runs_under_launch():
    port = free_port()

    def tcp_rendezvous():
        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
        return _sum_of_rank_plus_one(rank)

    assert launch(tcp_rendezvous, nprocs=2, init_process_group=False, timeout=60, output="none") == [3.0, 3.0]


def test_env_with_the_launchers_variables_meets_on_a_port_that_changes_every_run():
    def env_rendezvous():
        dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from launch
        return int(os.environ["MASTER_PORT"]), _sum_of_rank_plus_one(dist.get_rank())

    first = launch(env_rendezvous, nprocs=2, init_process_group=False, timeout=60, output="none")
    second = launch(env_rendezvous, nprocs=2, init_process_group=False, timeout=60, output="none")
    assert [total for _, total in first + second] == [3.0] * 4
    assert first[0][0] == first[1][0] != second[0][0]  # one port per run, never a fixed one


def test_a_fixed_port_already_in_use_fails_within_seconds_naming_the_port():
    with socket.socket() as occupant:  # another kernel running the same tutorial holds the port
        occupant.bind(("127.0.0.1", 0))
        occupant.listen()
        port = occupant.getsockname()[1]

        def setup_on_taken_port(rank, world_size):
            print(os.getpid(), flush=True)
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            dist.init_process_group("gloo", rank=rank, world_size=world_size)

        start = time.monotonic()
        with pytest.raises(DistributedRunError) as info:
            spawn(setup_on_taken_port, args=(2,), nprocs=2, timeout=100, output="none")
        elapsed = time.monotonic() - start
    error = info.value
    assert elapsed < 30, f"took {elapsed:.1f} s, not seconds: it waited for the timeout (100 s)?"
    assert error.root_cause.rank == 0 and f"port {port} is in use" in error.root_cause.summary
    assert f"port {port} is in use" in str(error)
    assert all(process_is_gone(int(error.outputs[rank][0])) for rank in (0, 1))  # rank 1 stopped too


def test_a_rendezvous_that_never_completes_says_who_arrived_and_where():
    port = free_port()

    def only_rank_0_joins(rank):
        if rank == 0:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            dist.init_process_group("gloo", rank=rank, world_size=2)
        else:
            time.sleep(300)  # forgot to call init_process_group

    with pytest.raises(DistributedRunError) as info:
        spawn(only_rank_0_joins, nprocs=2, timeout=5, output="none")
    text = str(info.value)
    assert info.value.timed_out and "The rendezvous did not complete" in text
    assert f"rank 0 called init_process_group at env://127.0.0.1:{port}" in text
    assert "rank 1 never called init_process_group" in text


def test_a_failing_rank_raises_one_error_naming_it_as_launch_does():
    def fails_on_rank_1(rank):
        if rank == 1:
            raise ValueError("bad shape on purpose")
        return rank

    with pytest.raises(DistributedRunError) as info:
        spawn(fails_on_rank_1, nprocs=2, timeout=60, output="none")
    assert info.value.failed_ranks == [1]
    assert "Root cause: rank 1 in your function: ValueError: bad shape on purpose" in str(info.value)


def test_requests_spawn_cannot_honour_say_what_to_do_instead():
    with pytest.raises(ValueError, match="join=True"):
        spawn(print, nprocs=2, join=False)
    with pytest.raises(TypeError, match=r"args=\(world_size,\)"):
        spawn(print, args=2, nprocs=2)
