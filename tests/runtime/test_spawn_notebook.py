"""Tutorial code pasted into a real Jupyter kernel (nbclient): spawn and its own rendezvous, on 2 ranks."""
import pytest

from scripts import run_cells

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]  # Jupyter kernels

PASTED_CODE = '''\
import os, socket, time
import torch, torch.distributed as dist
from course_lib import DistributedRunError, launch, spawn
from course_lib.topics.cluster import free_port

def total(rank):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()

def init_process(rank, size, port):                    # the distributed tutorial's template
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    return total(rank)

def tcp_init(port):                                     # a tcp:// init method
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    return total(rank)

def setup(rank, world_size, port):                      # the DDP tutorial's setup, on CPU
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    return total(rank)
'''


def test_tutorial_patterns_give_the_right_sums_from_a_notebook_kernel():
    outputs = run_cells(
        PASTED_CODE,
        "print('own env:', spawn(init_process, args=(2, free_port()), nprocs=2, timeout=60, "
        "output='none'))",
        "print('tcp:', launch(tcp_init, free_port(), nprocs=2, init_process_group=False, timeout=60, "
        "output='none'))",
        "print('ddp setup:', spawn(setup, args=(2, free_port()), nprocs=2, timeout=60, "
        "start_method='spawn', output='none'))",
        "print('rank first:', spawn(lambda rank, scale: rank * scale, args=(10,), nprocs=2, "
        "timeout=60, output='none'))",
    )
    assert "own env: [3.0, 3.0]" in outputs[1]
    assert "tcp: [3.0, 3.0]" in outputs[2]
    assert "ddp setup: [3.0, 3.0]" in outputs[3]
    assert "rank first: [0, 10]" in outputs[4]


def test_an_occupied_fixed_port_fails_in_seconds_from_a_notebook_kernel():
    outputs = run_cells(
        PASTED_CODE,
        "occupant = socket.socket(); occupant.bind(('127.0.0.1', 0)); occupant.listen()\n"
        "port = occupant.getsockname()[1]\n"
        "start = time.monotonic()\n"
        "try:\n"
        "    spawn(setup, args=(2, port), nprocs=2, timeout=100, output='none')\n"
        "except DistributedRunError as error:\n"
        "    print('seconds:', time.monotonic() - start)\n"
        "    print('named:', f'port {port} is in use' in str(error))\n"
        "occupant.close()",
    )
    seconds = float(outputs[1].split("seconds:")[1].split()[0])
    assert seconds < 30 and "named: True" in outputs[1]  # seconds, far below its timeout of 100 s
