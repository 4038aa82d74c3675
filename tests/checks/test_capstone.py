"""Lesson 14's capstone grader, through real torchrun processes: each wrong conversion of train.py
is rejected with its own message, correct conversions written differently are accepted, and no
process outlives a grade.

Wrong conversions are the reference answer (course_lib/examples/capstone_ddp.py) with one
mistake; the correct ones are that file, and tests/checks/answers/lesson14.py's alternatives (one
rewritten nanoGPT-style with course_lib's helpers, one with other APIs for the same steps).
"""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from answers.edited_scripts import (EVERY_RANK_SAVES, LOSS_ALL_REDUCE, NCCL_ON_THE_CPU,
                                    NO_PROCESS_GROUP, NO_SYNC, RENAMES_UNSYNCED, SAVES_IN_PLACE,
                                    write_edited_reference)
from answers.lesson14 import ALTERNATIVE_CONVERSIONS
from course_lib.authoring.cells import is_solution_only
from course_lib.checks import lesson14
from course_lib.checks.engine import GradingError, passed_line
from course_lib.checks.lesson14 import check_capstone
from course_lib.checks.lesson14.oracle import EPOCHS, STEPS_PER_EPOCH, oracle
from course_lib.examples import capstone_ddp
from course_lib.topics.cluster import _descendants

pytestmark = pytest.mark.slow

GRADE_TIMEOUT_S = 900  # three runs of up to RUN_TIMEOUT_S each (two of them side by side)
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "course_lib" / "examples"

SAVE_WRAPPED = ("unwrapped = model.module if distributed else model", "unwrapped = model")

WRONG_CONVERSIONS = {  # name: (edits to the reference, what the message must say)
    "rank 1 saves too": ([EVERY_RANK_SAVES], r"rank 1 also wrote the checkpoint"),
    "no set_epoch": ([("            sampler.set_epoch(epoch)  # this epoch's order, the same on "
                       "every rank\n", "            pass\n")],
                     r"the sampler gives rank 0 in epoch 1 the same indices, in the same order, "
                     r"as in epoch 0[\s\S]*until the loop tells it"),
    "no DistributedSampler": (
        [("sampler = (DistributedSampler(dataset, seed=SEED) if distributed\n"
          "               else RandomSampler(dataset, generator=order))",
          "sampler = RandomSampler(dataset, generator=order)"),
         ("        if distributed:\n            sampler.set_epoch(epoch)", "        if False:\n"
                                                                            "            pass")],
        r"the sampler gives both ranks the same indices[\s\S]*1/world_size"),
    "no DDP wrapper": (
        [("        model = DDP(model, device_ids=[device.index] if device.type == \"cuda\" else None)",
          "        pass"), (NO_SYNC, "with nullcontext():"), SAVE_WRAPPED],
        r"rank 0's model is not wrapped in DDP"),
    "no no_sync": ([(NO_SYNC, "with nullcontext():")],
                   r"DDP all-reduced rank 0's gradients 2 times in one step[\s\S]*no_sync"),
    "grad_accum_steps ignores world_size": (
        [("grad_accum_steps = GLOBAL_BATCH_SIZE // (MICRO_BATCH_SIZE * world_size)",
          "grad_accum_steps = GLOBAL_BATCH_SIZE // MICRO_BATCH_SIZE")],
        r"rank 0 took 8 optimizer steps[\s\S]*must count the ranks"),
    "rank 0 logs its own loss": ([(LOSS_ALL_REDUCE, "")],
                                 r"rank 0 printed the loss of its own share[\s\S]*takes every "
                                 r"rank's"),
    "every rank prints": ([("                if rank == 0:\n                    print(",
                            "                if True:\n                    print(")],
                          r"rank 1 also printed the losses"),
    "saves the DDP wrapper's state_dict": ([SAVE_WRAPPED], r"keys start with 'module\.'"),
    "no plain-python fallback": (
        [('    if "RANK" not in os.environ:\n        return False, 0, 1, torch.device("cuda" if '
          'torch.cuda.is_available() else "cpu")\n', "")],
        r"with plain python[\s\S]*KeyError: 'LOCAL_RANK'[\s\S]*torchrun's variables are not set"),
    "train.py's fp16-on-CUDA autocast kept": (
        [("with torch.autocast(device.type, dtype=amp_dtype, enabled=args.amp):",
          'with torch.autocast("cuda", dtype=torch.float16, enabled=args.amp and '
          'device.type == "cuda"):')],
        r"with --amp on the CPU, bf16 autocast[\s\S]*no autocast on the CPU"),
    "no destroy_process_group": (
        [("            dist.destroy_process_group()\n", "")],
        r"exited with its process group still alive|died while Python shut down"),
    "resumes on rank 0 only": (
        [("    if os.path.exists(args.checkpoint):",
          '    if os.path.exists(args.checkpoint) and os.environ.get("RANK", "0") == "0":')],
        r"rank 0 started at epoch 2, rank 1 started at epoch 0[\s\S]*every rank must load"),
    "DDP without a process group": ([NO_PROCESS_GROUP], r"Default process group has not been "
                                                        r"initialized[\s\S]*never made"),
    "NCCL on the CPU": ([NCCL_ON_THE_CPU], r"NCCL[\s\S]*without asking whether each rank has"),
    "rank 0 saves in place": ([SAVES_IN_PLACE], r"rank 0 wrote checkpoint.pt in place"),
    "renamed before fsync": (RENAMES_UNSYNCED, r"renamed checkpoint.pt.tmp onto checkpoint.pt "
                                               r"before its bytes were on disk"),
}

def _command_lines(pids) -> dict:
    lines = {}
    for pid in sorted(pids):
        try:
            lines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            lines[pid] = "(gone)"
    return lines


def graded(path) -> str:
    """The grader's verdict on `path`: '' when it passed, else its message; no process is left."""
    before = set(_descendants(os.getpid()))
    try:
        check_capstone(path)
        verdict = ""
    except GradingError as error:
        verdict = str(error)
    left = set(_descendants(os.getpid())) - before
    deadline = time.monotonic() + 10  # one still on its way out (being reaped) is not left behind
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left &= set(_descendants(os.getpid()))
    assert not left, f"processes left after grading: {_command_lines(left)}"
    return verdict


@pytest.mark.timeout(GRADE_TIMEOUT_S)
@pytest.mark.parametrize("name", WRONG_CONVERSIONS)
def test_a_wrong_conversion_is_rejected_with_its_own_message(name, tmp_path, capsys):
    edits, message = WRONG_CONVERSIONS[name]
    verdict = graded(write_edited_reference(tmp_path / "train_ddp.py", edits))
    assert verdict, f"the grader accepted a conversion with this mistake: {name}"
    assert re.search(message, verdict), f"{name}: the message does not say {message!r}:\n{verdict}"
    assert capsys.readouterr().out == ""


# Rank 1 saves a copy, then rank 0 crashes: torchrun kills rank 1 before its exit handlers run,
# so only what the probe wrote at the save itself can tell that rank 1 wrote
KILLED_WRITER = [("import gc\n", "import gc\nimport time\n"),
                 ("        if rank == 0:\n            unwrapped",
                  "        if rank == 1:\n"
                  "            torch.save(model.module.state_dict(), 'copy.pt')\n"
                  "            open('saved', 'w').close()\n"
                  "            time.sleep(120)\n"
                  "        while not os.path.exists('saved'):\n"
                  "            time.sleep(0.05)\n"
                  "        raise RuntimeError('rank 0 stops once rank 1 saved')\n"
                  "        if rank == 0:\n            unwrapped")]


@pytest.mark.timeout(GRADE_TIMEOUT_S)
def test_a_writer_that_torchrun_killed_is_still_named(tmp_path):
    verdict = graded(write_edited_reference(tmp_path / "train_ddp.py", KILLED_WRITER))
    assert re.search(r"rank 1 also wrote the checkpoint \(torch.save 1 times, to copy.pt\)", verdict), verdict


def test_every_wrong_conversion_gets_a_message_of_its_own():
    patterns = [message for _, message in WRONG_CONVERSIONS.values()]
    assert len(set(patterns)) == len(patterns) >= 6


@pytest.mark.timeout(GRADE_TIMEOUT_S)
@pytest.mark.parametrize("answer", ["the reference", *ALTERNATIVE_CONVERSIONS])
def test_a_correct_conversion_is_accepted(answer, capsys):
    path = ALTERNATIVE_CONVERSIONS.get(answer, EXAMPLES / "capstone_ddp.py")
    assert graded(path) == ""
    assert capsys.readouterr().out == passed_line(check_capstone.exercise) + "\n"


@pytest.mark.timeout(GRADE_TIMEOUT_S)
def test_the_unconverted_script_is_rejected(tmp_path):
    path = tmp_path / "train_ddp.py"
    path.write_text((EXAMPLES / "capstone_single.py").read_text())
    assert "rank 0's model is not wrapped in DDP" in graded(path)


@pytest.mark.timeout(GRADE_TIMEOUT_S)
def test_the_unconverted_script_is_told_about_ddp_when_its_ranks_crash_over_one_file(tmp_path):
    """Unconverted, both ranks write checkpoint.pt; one rank started late (a slow import) can load
    it half-written and crash. Here rank 1 crashes that way on every run: the message still names
    the cause, the missing DDP, and not the crash it leads to."""
    path = tmp_path / "train_ddp.py"
    text = (EXAMPLES / "capstone_single.py").read_text()
    assert text.endswith("    main()\n")
    path.write_text(text + '    if os.environ.get("RANK") == "1":  # the other rank\'s half-written '
                    'file, read\n        raise RuntimeError("PytorchStreamReader failed reading '
                    'zip archive: failed finding central directory")\n')
    assert "rank 0's model is not wrapped in DDP" in graded(path)


def test_the_stub_is_rejected_at_once_with_the_usual_advice(tmp_path):
    path = tmp_path / "train_ddp.py"
    path.write_text('# YOUR CODE HERE\nraise NotImplementedError("Exercise: write this part, then '
                    'run the check cell below")\n')
    with pytest.raises(GradingError, match="replace the `raise NotImplementedError"):
        check_capstone(path)
    with pytest.raises(GradingError, match="no such file"):
        check_capstone(tmp_path / "missing.py")


def code_cells(folder):
    notebook = nbformat.read(ROOT / folder / "14_capstone.ipynb", as_version=4)
    return [cell for cell in notebook.cells if cell.cell_type == "code"]


def test_the_notebook_writes_the_exercise_file_and_its_solution_is_the_reference(tmp_path,
                                                                                  monkeypatch):
    # the notebook's own cells, run here: the one that writes train_ddp.py beside the notebook,
    # then the solution-only one that puts the reference conversion in its place
    [write_exercise] = [cell.source for cell in code_cells("solutions")
                        if "train_ddp_path = " in cell.source]
    [write_answer] = [cell.source for cell in code_cells("solutions") if is_solution_only(cell)
                      and "capstone_ddp.__file__, train_ddp_path" in cell.source]
    monkeypatch.chdir(tmp_path)  # the notebook's scratch folder, where it copied train.py
    train_py = (EXAMPLES / "capstone_single.py").read_text()
    (tmp_path / "train.py").write_text(train_py)
    notebook_folder = tmp_path / "lessons"
    notebook_folder.mkdir()
    namespace = {"os": os, "shutil": shutil, "capstone_ddp": capstone_ddp,
                 "notebook_folder": str(notebook_folder)}
    exec(write_exercise, namespace)
    exercise_path = notebook_folder / "train_ddp.py"
    exercise, reference = exercise_path.read_text(), (EXAMPLES / "capstone_ddp.py").read_text()
    steps = [line.strip() for line in reference.splitlines() if line.strip().startswith("# Step ")]
    listed = [line for line in exercise.splitlines() if line.startswith("# Step ")]
    assert len(steps) == 13 and listed == steps  # the table's steps, as the answer numbers them
    assert lesson14.STUB in exercise and exercise.endswith(train_py)
    with pytest.raises(GradingError, match="replace the `raise NotImplementedError"):
        check_capstone(exercise_path)  # at once, before any run
    exercise_path.write_text("# my conversion, half done\n")
    exec(write_exercise, namespace)  # run again, the cell keeps the learner's file
    assert exercise_path.read_text() == "# my conversion, half done\n"
    exec(write_answer, namespace)
    assert exercise_path.read_text() == reference, (
        "solutions/14_capstone.ipynb's answer and course_lib/examples/capstone_ddp.py differ")
    assert not any("capstone_ddp.__file__, train_ddp_path" in cell.source
                   for cell in code_cells("lessons")), "the lesson must not hold the answer"


@pytest.mark.timeout(300)
def test_the_oracle_is_what_train_py_prints_on_one_device(tmp_path):
    # the grader's reference is not a second implementation to trust: train.py, run as given
    script = tmp_path / "train.py"
    script.write_text((EXAMPLES / "capstone_single.py").read_text())
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr
    printed = [float(match[1]) for match in re.finditer(r"loss (\S+)", done.stdout)]
    losses, shares = oracle()
    expected = [loss for epoch in sorted(losses) for loss in losses[epoch]]
    assert len(printed) == len(expected) == EPOCHS * STEPS_PER_EPOCH
    assert max(abs(a - b) for a, b in zip(printed, expected)) < lesson14.LOSS_ATOL
    assert shares[0][0][0] != losses[0][0]  # a rank's share of a batch is not the whole batch
