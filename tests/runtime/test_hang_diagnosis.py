"""A hang names its cause: real ranks that part ways, each diagnosed within its timeout + 5 s.

The same programs run in this process (as a script would call launch) and, in the slow tier, from
a Jupyter kernel and from a plain script; an interrupted run gets the same diagnosis.
"""
import textwrap
import time

import pytest

from course_lib import DistributedRunError, launch
from course_lib.runtime.launcher.diagnosis import RankState, diagnose
from scripts import run_cells, run_script

TIMEOUT_S = 6

# name: (the function every rank runs, the phrases its diagnosis must hold)
PROGRAMS = {
    "different_collective": ("""
        def work():
            dist.all_reduce(torch.ones(4))
            if dist.get_rank() == 0:
                dist.all_reduce(torch.ones(4))
            else:
                dist.broadcast(torch.zeros(10), src=0)
        """, ["collective #2 differs", "rank 0 all_reduce float32[4]", "rank 1 broadcast float32[10]",
              "#1 all_reduce float32[4]"]),
    "different_shapes": ("""
        def work():
            dist.all_reduce(torch.ones(4))
            dist.all_reduce(torch.ones(4 if dist.get_rank() == 0 else 10))
        """, ["during collective #2", "in all_reduce", "size doesn't match",
              "waited in its 2nd (all_reduce float32[",
              # both ranks' tensors, whichever rank gloo aborted: the aborted one's too
              "killed by SIGABRT in all_reduce float32[", "float32[10]"]),
    "barrier_on_one_rank": ("""
        def work():
            dist.all_reduce(torch.ones(4))
            if dist.get_rank() == 0:
                dist.barrier()
        """, ["rank 1 finished after 1 collective", "rank 0 waited in its 2nd (barrier"]),
    "busy_rank": ("""
        def work():
            dist.all_reduce(torch.ones(4))
            if dist.get_rank() == 1:
                while True:
                    time.sleep(0.01)
            dist.all_reduce(torch.ones(4))
        """, ["rank 1 is in no collective: it runs your code in ", "after 1 collective",
              "rank 0 waits in its 2nd (all_reduce float32[4]"]),
    "both_receive_first": ("""
        def work():
            peer = 1 - dist.get_rank()
            buffer = torch.zeros(3)
            dist.recv(buffer, src=peer)
            dist.send(buffer, dst=peer)
        """, ["ranks 0 and 1 both wait in recv", "no rank is sending"]),
    "one_rank_fails": ("""
        def work():
            dist.all_reduce(torch.ones(4))
            if dist.get_rank() == 1:
                raise ValueError("bad batch")
            dist.all_reduce(torch.ones(4))
        """, ["rank 1 failed after 1 collective (ValueError: bad batch)",
              "rank 0 waited in its 2nd (all_reduce float32[4]"]),
    "ddp_extra_step": ("""
        def work():
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
            steps = 3 if dist.get_rank() == 0 else 2
            for _ in range(steps):
                model(torch.randn(8, 4)).sum().backward()
        """, ["rank 1 finished after", "rank 0 wait", "all_reduce float32[10]"]),
    "ddp_rank_stops_mid_step": ("""
        def work():
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(10):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                if dist.get_rank() == 1 and step == 1:
                    time.sleep(60)  # rank 1 stops in the middle of a step: sleeping, or waiting on input
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
        """, ["rank 1 is in no collective: it runs your code in work (ddp_rank_stops_mid_step.py:11), "
              "after 6 collectives", "rank 0 waits in its 7th (all_reduce float32[10] in backward() at "
              "ddp_rank_stops_mid_step.py, line 12)"]),
}
HEADER = "import time\nimport torch\nimport torch.distributed as dist\n"


def _define(name: str) -> dict:
    namespace = {}
    exec(compile(HEADER + textwrap.dedent(PROGRAMS[name][0]), f"{name}.py", "exec"), namespace)
    return namespace


def _assert_holds(text: str, name: str) -> None:
    for phrase in PROGRAMS[name][1]:
        assert phrase in text, f"{name}: {phrase!r} not in:\n{text}"


@pytest.mark.slow  # seven launches that each wait out their timeout; the fast tier keeps one, below
@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_hang_is_diagnosed_within_its_timeout_and_5_s(name):
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as caught:
        launch(_define(name)["work"], nprocs=2, timeout=TIMEOUT_S, output="none")
    assert time.monotonic() - start < TIMEOUT_S + 5
    _assert_holds(caught.value.diagnosis, name)
    assert str(caught.value).splitlines()[1] == "Diagnosis: " + caught.value.diagnosis.splitlines()[0]


@pytest.mark.timeout(60)
def test_the_diagnosis_names_the_learners_file_and_line():
    with pytest.raises(DistributedRunError) as caught:
        launch(_define("different_collective")["work"], nprocs=2, timeout=TIMEOUT_S, output="none")
    assert "rank 0 all_reduce float32[4] at different_collective.py, line 8" in caught.value.diagnosis
    assert "rank 1 broadcast float32[10] at different_collective.py, line 10" in caught.value.diagnosis


@pytest.mark.timeout(60)
def test_recording_is_off_with_one_argument():
    def work():
        import os
        return os.environ["TORCH_FR_BUFFER_SIZE"]

    assert launch(work, nprocs=2, timeout=30, output="none") == ["64", "64"]
    assert launch(work, nprocs=2, timeout=30, output="none", record_collectives=False) == ["0", "0"]
    with pytest.raises(DistributedRunError) as caught:
        launch(_define("different_collective")["work"], nprocs=2, timeout=TIMEOUT_S, output="none",
               record_collectives=False)
    assert caught.value.diagnosis == "" and "Diagnosis" not in str(caught.value)


@pytest.mark.timeout(60)
def test_a_peer_that_lost_its_connection_is_named_as_a_consequence():
    with pytest.raises(DistributedRunError) as caught:
        launch(_define("one_rank_fails")["work"], nprocs=2, timeout=30, output="none")
    message = str(caught.value)
    assert "Root cause: rank 1 in your function: ValueError: bad batch" in message
    assert "rank 0 in your function: lost its connection to rank 1, which had failed" in message
    assert "GLHF" not in message.split("Last output")[0]


def _record(seq, op="all_reduce", shape=(4,), done=True, in_backward=False):
    return {"group": "default_pg", "seq": seq, "op": op, "shapes": [list(shape)], "dtypes": ["float32"],
            "done": done, "where": f"train.py, line {seq}", "in_backward": in_backward}


def test_the_last_matching_collectives_are_listed_before_the_parting():
    same = [_record(seq) for seq in range(1, 6)]
    states = {0: RankState(0, "running", records=same + [_record(6, done=False)],
                           waiting_in="all_reduce (distributed_c10d.py:3252)"),
              1: RankState(1, "running", records=same + [_record(6, "broadcast", (10,), done=False)],
                           waiting_in="broadcast (distributed_c10d.py:3145)")}
    lines = diagnose(states).splitlines()
    assert lines[0] == ("collective #6 differs: rank 0 all_reduce float32[4] at train.py, line 6; "
                        "rank 1 broadcast float32[10] at train.py, line 6")
    assert [line.split()[0] for line in lines[2:]] == ["#3", "#4", "#5"]


def test_three_ranks_are_grouped_by_what_they_called():
    states = {rank: RankState(rank, "running", records=[_record(1, *(("all_reduce", (4,)) if rank < 2
                                                                      else ("all_gather", (4,))), done=False)],
                              waiting_in="x (distributed_c10d.py:1)") for rank in range(3)}
    assert diagnose(states).startswith("collective #1 differs: ranks 0 and 1 all_reduce float32[4] "
                                       "at train.py, line 1; rank 2 all_gather float32[4]")


def test_a_busy_rank_is_named_though_its_last_collective_is_not_yet_marked_done():
    # torch marks a gloo collective's record done a few ms after the call returned (measured: 1 in
    # 4 all_reduces read right after); a rank busy in Python may be asked in that window
    states = {0: RankState(0, "running", records=[_record(1), _record(2, done=False)],
                           waiting_in="all_reduce (distributed_c10d.py:3252)"),
              1: RankState(1, "running", records=[_record(1, done=False)],
                           waiting_in="work (hang.py:12)")}
    assert diagnose(states).startswith("rank 1 is in no collective: it runs your code in work "
                                       "(hang.py:12), after 1 collective; rank 0 waits in its 2nd")


def test_a_ddp_all_reduce_that_reads_done_though_a_peer_never_issued_it_is_still_waited_in():
    # gloo ends a collective that outlives the group's timeout (launch's own) and torch then retires
    # its record: it reads done while the rank's main thread still waits in autograd's backward
    same = [_record(seq, in_backward=seq > 2) for seq in range(1, 5)]
    states = {0: RankState(0, "running", records=same + [_record(5, shape=(10,), in_backward=True)],
                           waiting_in="_engine_run_backward (graph.py:979)"),
              1: RankState(1, "running", records=same, waiting_in="work (train.py:10)"),
              2: RankState(2, "running", records=same + [_record(5, shape=(10,), done=False, in_backward=True)],
                           waiting_in="_engine_run_backward (graph.py:979)")}
    assert diagnose(states).splitlines()[0] == (
        "rank 1 is in no collective: it runs your code in work (train.py:10), after 4 collectives; "
        "rank 0 waits in its 5th (all_reduce float32[10] in backward() at train.py, line 5); "
        "rank 2 waits in its 5th (all_reduce float32[10] in backward() at train.py, line 5)")
    for state in states.values():  # every rank issued it: it completed, and no rank is blamed
        state.records = same + [_record(5, shape=(10,), in_backward=True)]
    assert diagnose(states) == ""


@pytest.mark.timeout(90)
@pytest.mark.filterwarnings("ignore:3 ranks on 2 CPU cores")
@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_rank_that_stops_mid_step_in_ddp_training_is_named_with_the_ranks_waiting_in_backward(nprocs):
    """Rank 1 sleeps between forward and backward; the others wait in DDP's gradient all-reduce."""
    start = time.monotonic()
    with pytest.raises(DistributedRunError) as caught:
        launch(_define("ddp_rank_stops_mid_step")["work"], nprocs=nprocs, timeout=4, output="none")
    assert time.monotonic() - start < 4 + 5
    _assert_holds(caught.value.diagnosis, "ddp_rank_stops_mid_step")
    if nprocs == 3:
        assert "; rank 2 waits in its 7th (all_reduce float32[10] in backward()" in caught.value.diagnosis


def test_ranks_that_agree_and_all_wait_are_not_blamed_on_a_mismatch():
    states = {rank: RankState(rank, "running", records=[_record(1), _record(2, done=False)],
                              waiting_in="all_reduce (distributed_c10d.py:3252)") for rank in range(2)}
    assert diagnose(states).startswith("every rank waits in collective #2")
    assert diagnose({}) == "" and diagnose({0: RankState(0, "returned", records=[])}) == ""


# -- the same programs from a kernel and from a script (slow tier) -----------------------------------
KERNEL_NAMES = ["different_collective", "barrier_on_one_rank", "busy_rank", "both_receive_first",
                "one_rank_fails", "different_shapes"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_hangs_are_diagnosed_from_a_jupyter_kernel():
    cells = [HEADER + "from course_lib import launch, DistributedRunError\n"]
    for name in KERNEL_NAMES:
        cells.append(textwrap.dedent(PROGRAMS[name][0]) + textwrap.dedent(f"""
            start = time.monotonic()
            try:
                launch(work, nprocs=2, timeout={TIMEOUT_S}, output="none")
            except DistributedRunError as error:
                print(error.diagnosis)
            print("seconds", round(time.monotonic() - start, 1))
            """))
    outputs = run_cells(*cells, timeout=120)
    for name, output in zip(KERNEL_NAMES, outputs[1:]):
        _assert_holds(output, name)
        assert float(output.split("seconds")[-1]) < TIMEOUT_S + 5, output
    assert "at Cell In[" in outputs[1], outputs[1]  # the learner's cell, as their tracebacks name it


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_hangs_are_diagnosed_from_a_plain_script(tmp_path):
    body = HEADER + "from course_lib import launch, DistributedRunError\n"
    for name in KERNEL_NAMES:
        body += textwrap.dedent(PROGRAMS[name][0]).replace("def work", f"def {name}") + "\n"
    body += textwrap.dedent(f"""
        if __name__ == "__main__":
            for fn in {KERNEL_NAMES}:
                start = time.monotonic()
                try:
                    launch(globals()[fn], nprocs=2, timeout={TIMEOUT_S}, output="none")
                except DistributedRunError as error:
                    print("====", fn, round(time.monotonic() - start, 1))
                    print(error.diagnosis, flush=True)
        """)
    code, output = run_script(body, tmp_path, timeout=240, name="hangs.py")
    assert code == 0, output
    blocks = {block.split()[0]: block for block in output.split("==== ")[1:]}
    for name in KERNEL_NAMES:
        _assert_holds(blocks[name], name)
        assert float(blocks[name].split()[1]) < TIMEOUT_S + 5, blocks[name]
    assert "at hangs.py, line" in blocks["different_collective"]


@pytest.mark.timeout(60)
def test_an_interrupt_stops_the_ranks_and_says_where_they_parted(tmp_path):
    """The stop button (SIGINT in the kernel) raises the diagnosis, still a KeyboardInterrupt."""
    import os
    import signal
    import threading

    import torch
    import torch.distributed as dist

    folder = str(tmp_path)

    def work():  # the ranks part at their 2nd collective; each marks that it is about to
        dist.all_reduce(torch.ones(4))
        open(os.path.join(folder, f"rank{dist.get_rank()}"), "w").close()
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(4))
        else:
            dist.broadcast(torch.zeros(10), src=0)

    def interrupt_once_started():
        deadline = time.monotonic() + 30
        while len(os.listdir(folder)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # both ranks are in their 2nd collective by now
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt) as caught:
        launch(work, nprocs=2, output="none")  # no timeout
    error = caught.value
    assert isinstance(error, DistributedRunError)
    assert str(error).startswith("interrupted: the 2 ranks were stopped")
    _assert_holds(error.diagnosis, "different_collective")
    assert "rank 0: interrupted after" in str(error) and "waiting in all_reduce" in str(error)


def test_a_rank_gloo_killed_while_its_peer_went_on_is_named_with_what_both_called():
    dump = ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
            "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 20 vs 12. "
            "Received data size doesn't match expected size.",
            "Fatal Python error: Aborted",
            'File "/site-packages/torch/distributed/distributed_c10d.py", line 4263 in all_gather',
            'File "/site-packages/torch/distributed/c10d_logger.py", line 83 in wrapper',
            'File "/home/me/eval.py", line 6 in gather_predictions']
    states = {0: RankState(0, "returned", records=[_record(1, "all_gather", (5,))]),
              1: RankState(1, "exited", records=None, summary="killed by SIGABRT", last_output=dump)}
    assert diagnose(states) == (
        "rank 1 killed by SIGABRT in all_gather at eval.py, line 6 (gloo: op.preamble.length <= "
        "op.nbytes. 20 vs 12. Received data size doesn't match expected size.); rank 0's last "
        "collective was #1 (all_gather float32[5] at train.py, line 1) and it finished")


def test_the_rank_gloo_killed_is_named_with_the_tensor_it_entered_the_collective_with():
    dump = ["  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 8 vs 4.",
            'File "/site-packages/torch/distributed/distributed_c10d.py", line 3245 in all_reduce',
            'File "/home/me/train.py", line 7 in step']
    states = {0: RankState(0, "failed", gave_up="gloo lost the connection",
                           records=[_record(1, "all_reduce", (5,))], summary="RuntimeError: Connection reset"),
              1: RankState(1, "exited", records=None, summary="killed by SIGABRT", last_output=dump,
                           last_call="all_reduce float32[4]")}
    assert diagnose(states).startswith("rank 1 killed by SIGABRT in all_reduce float32[4] at train.py, line 7")
    states[1].last_call = "broadcast float32[4]"  # an earlier call's record: not the one it died in
    assert diagnose(states).startswith("rank 1 killed by SIGABRT in all_reduce at train.py, line 7")


@pytest.mark.timeout(60)
def test_a_size_mismatch_names_both_ranks_tensors():
    with pytest.raises(DistributedRunError) as caught:
        launch(_define("different_shapes")["work"], nprocs=2, timeout=30, output="none")
    _assert_holds(caught.value.diagnosis, "different_shapes")


@pytest.mark.timeout(90)
def test_a_session_cell_that_hangs_is_diagnosed_and_the_session_goes_on():
    from course_lib import DistributedSession

    with DistributedSession(nprocs=2, timeout=TIMEOUT_S, output="none") as session:
        session.run("x = torch.ones(4); dist.all_reduce(x)")
        with pytest.raises(DistributedRunError) as caught:
            session.run("if rank == 0:\n    dist.all_reduce(torch.ones(4))\n"
                        "else:\n    dist.broadcast(torch.zeros(10), src=0)")
        assert caught.value.diagnosis.startswith(
            "collective #2 differs: rank 0 all_reduce float32[4] at <distributed cell 2>, line 2; "
            "rank 1 broadcast float32[10] at <distributed cell 2>, line 4")
        assert "#1 all_reduce float32[4] at <distributed cell 1>, line 1" in caught.value.diagnosis
        assert session.run("rank") == [0, 1]
