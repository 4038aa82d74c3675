"""course_lib.runtime.launcher.launch: results, functions of every kind, torchrun's environment, output relay."""
import contextlib
import io
import os
import re

import pytest
import torch
import torch.distributed as dist

from course_lib import launch
from scripts import run_script

pytestmark = pytest.mark.timeout(120)


class Point:  # a user class, returned across processes
    def __init__(self, x):
        self.x = x


def all_reduce_rank(scale):
    t = torch.full((3,), float(dist.get_rank() + 1)) * scale
    dist.all_reduce(t)
    return t


def test_results_arrive_in_rank_order_from_a_module_function():
    results = launch(all_reduce_rank, 2.0, nprocs=2, timeout=60, output="none")
    assert [r.tolist() for r in results] == [[6.0] * 3, [6.0] * 3]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_closures_and_lambdas_run(start_method):
    offset = 10

    def closure(extra, *, more):
        return dist.get_rank() + offset + extra + more

    assert launch(closure, 1, more=100, nprocs=2, timeout=90, output="none",
                  start_method=start_method) == [111, 112]
    assert launch(lambda: dist.get_world_size() * 2, nprocs=3, timeout=90, output="none",
                  start_method=start_method) == [6, 6, 6]


def test_any_picklable_value_comes_back():
    def values():
        rank = dist.get_rank()
        return {"rank": rank, "none": None, "point": Point(rank), "nested": [(rank, "x")],
                "grad": torch.ones(2, requires_grad=True)}

    results = launch(values, nprocs=2, timeout=60, output="none")
    assert [r["rank"] for r in results] == [0, 1]
    assert results[1]["point"].x == 1 and results[0]["nested"] == [(0, "x")]
    assert results[0]["grad"].requires_grad and results[0]["grad"].device.type == "cpu"


def test_a_100_megabyte_return_value_arrives():
    results = launch(lambda: torch.full((25_000_000,), float(dist.get_rank())), nprocs=2,
                     timeout=120, output="none")
    assert results[0].numel() == 25_000_000 and results[1][-1].item() == 1.0


def test_a_function_defined_in_a_script_main_runs_under_spawn_and_fork(tmp_path):
    code, out = run_script("""
        import torch.distributed as dist
        from course_lib import launch

        def work(x):
            return x * (dist.get_rank() + 1)

        print("fork", launch(work, 3, nprocs=2, timeout=60, output="none", start_method="fork"))
        print("spawn", launch(work, 3, nprocs=2, timeout=60, output="none", start_method="spawn"))
    """, tmp_path, timeout=120)
    assert code == 0, out
    assert "fork [3, 6]" in out and "spawn [3, 6]" in out


def test_ranks_see_torchruns_environment_and_a_ready_process_group():
    def environment():
        keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        return {key: os.environ[key] for key in keys}, dist.is_initialized(), dist.get_backend()

    results = launch(environment, nprocs=2, timeout=60, output="none")
    for rank, (env, initialised, backend) in enumerate(results):
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "2" and env["MASTER_ADDR"] == "127.0.0.1"
        assert initialised and backend == "gloo"
    assert results[0][0]["MASTER_PORT"] == results[1][0]["MASTER_PORT"]


def test_a_torchrun_script_that_initialises_the_group_itself_runs_unchanged():
    def torchrun_style_main():
        assert not dist.is_initialized()
        dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
        t = torch.ones(1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return t.item()

    assert launch(torchrun_style_main, nprocs=2, timeout=60, init_process_group=False,
                  output="none") == [2.0, 2.0]


def test_forked_ranks_do_not_hang_after_the_parent_used_openmp():
    torch.set_num_threads(2)
    x = torch.randn(512, 512, requires_grad=True)
    (x @ x).sum().backward()  # the parent's OpenMP pool now exists

    def compute():
        y = torch.randn(512, 512, requires_grad=True)
        (y @ y).relu().sum().backward()
        return torch.get_num_threads()

    assert launch(compute, nprocs=2, timeout=60, output="none") == [1, 1]


def _capture(fn, **kwargs):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        results = launch(fn, nprocs=2, timeout=60, **kwargs)
    return results, out.getvalue(), err.getvalue()


def test_each_line_reaches_the_callers_current_streams_whole_and_labelled():
    def chatty():
        import sys

        rank = dist.get_rank()
        for i in range(200):
            print(f"line {i} of rank {rank}")
        print(f"warning from rank {rank}", file=sys.stderr)
        return rank

    _, out, err = _capture(chatty)
    lines = [line for line in out.splitlines() if line.startswith("[rank")]
    assert len(lines) == 400
    assert all(re.fullmatch(r"\[rank([01])\] line \d+ of rank \1", line) for line in lines), lines[:5]
    assert "[rank0] warning from rank 0" in err and "[rank1] warning from rank 1" in err
    assert "backend gloo" in out.splitlines()[0]  # the one line saying what launch chose


def test_output_modes_filter_ranks_but_errors_keep_everything():
    def hello():
        print(f"hello from {dist.get_rank()}")

    _, out, _ = _capture(hello, output="rank0")
    assert "[rank0] hello from 0" in out and "rank1" not in out
    _, out, err = _capture(hello, output="none")
    assert out == "" and err == ""
    with pytest.raises(ValueError, match="output="):
        launch(hello, output="some")


def test_progress_bar_redraws_stay_readable():
    def progress():
        import sys

        for percent in (10, 50, 100):
            sys.stdout.write(f"\rtraining {percent}%")
            sys.stdout.flush()
        sys.stdout.write("\n")

    _, out, _ = _capture(progress)
    assert "\r" not in out
    assert "[rank0] training 100%" in out and "[rank1] training 100%" in out
