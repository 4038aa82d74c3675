"""course_lib.runtime.launcher.launch over many runs: no leaked processes or descriptors, loopback only, no collisions."""
import os

import pytest
import torch.distributed as dist

from course_lib import launch
from scripts import process_is_gone, run_script, start_script

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # hundreds of launches


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_a_hundred_launches_leave_no_process_and_no_descriptor_behind():
    launch(os.getpid, nprocs=2, timeout=60, output="none")  # warm-up: torch's lazy state
    before = _open_fds()
    pids = []
    for _ in range(100):
        pids += launch(os.getpid, nprocs=2, timeout=60, output="none")
    assert _open_fds() == before
    assert len(set(pids)) == 200 and all(process_is_gone(pid) for pid in pids)
    for pid in pids:  # each rank reaped: no longer a child of this process, not even a zombie
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _listening_addresses(port):
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                found.append(local.rsplit(":", 1)[0])
    return found


def test_the_rendezvous_listens_on_loopback_only():
    def where_is_the_store():
        return _listening_addresses(int(os.environ["MASTER_PORT"]))

    addresses = launch(where_is_the_store, nprocs=2, timeout=60, output="none")[0]
    assert addresses == ["0100007F"]  # 127.0.0.1, and nothing on 0.0.0.0 or [::]


def test_two_processes_launching_at_the_same_moment_do_not_collide(tmp_path):
    code = """
        import torch, torch.distributed as dist
        from course_lib import launch
        def total():
            t = torch.ones(1)
            dist.all_reduce(t)
            return t.item()
        for _ in range(15):
            assert launch(total, nprocs=2, timeout=60, output="none") == [2.0, 2.0]
        print("all launches fine")
    """
    procs = [start_script(code, tmp_path, name=f"kernel{i}.py") for i in range(2)]
    outputs = [proc.communicate(timeout=150)[0] for proc in procs]
    assert all(proc.returncode == 0 and "all launches fine" in out for proc, out in zip(procs, outputs)), outputs
