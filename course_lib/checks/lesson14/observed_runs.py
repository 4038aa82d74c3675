"""Where the capstone's grader meets the learner's script (engine/boundary.py): what crosses.

Two kinds of crossing, each returning plain data: `script_crossing` reads train_ddp.py (its
resolved path, as the script's own tracebacks name it, and its text), and `runs_crossing` runs the
script (script_probe.run_together) and reads back everything the verdicts need: the probe's
records, what each process printed, the stacks of a hung run, and the checkpoint as
torch.load(weights_only=True) reads it (its keys, or the error). Nothing is judged there: the
grader rebuilds each Run from that data (`from_plain`) and applies the rules in its own process.

A run's inputs (the data, the model, the epochs split 2 + 1) are train.py's own constants, which
the script hard-codes and the oracle mirrors: no grading-time seed reaches them.
"""
import dataclasses
import os
import shutil
from pathlib import Path

from ..engine.boundary import crossing
from .script_probe import Process, Run, Script, install_probe, read, run_together

TEXT_LIMIT = 1_000_000  # characters kept of one output (its head and its tail)


def script_crossing(path) -> Script:
    """The learner's file, read on the learner's side; None when there is no such file."""
    def read_script():
        script = Path(os.fspath(path)).resolve()
        if not script.is_file():
            return None
        return {"path": str(script), "text": script.read_text(errors="replace")}

    found = crossing("check_capstone: train_ddp.py", read_script)
    return Script(**found) if found is not None else None


def runs_crossing(key: str, script: Script, runs: list, scratch: Path, timeout: float,
                  checkpoint_from: Run = None) -> list:
    """Run `runs` of the script together (each resuming from a copy of `checkpoint_from`'s
    checkpoint, when given) and return them rebuilt from what crossed."""
    def run_and_observe():
        site = scratch / "probe"
        if not site.exists():
            install_probe(scratch)
        for run in runs:
            if checkpoint_from is not None:
                run.folder.mkdir(parents=True)
                shutil.copy(Path(checkpoint_from.folder) / "checkpoint.pt",
                            run.folder / "checkpoint.pt")
        run_together(Path(script.path), runs, site, timeout)
        return [to_plain(run) for run in runs]

    return [from_plain(data) for data in crossing(key, run_and_observe)]


def to_plain(run: Run) -> dict:
    """A run of the script, observed on the learner's side, as plain data."""
    folder = run.folder
    if run.distributed:
        outputs = [read(log) for log in sorted((folder / "logs").glob("*/attempt_0/*/stderr.log"))]
    else:
        outputs = [read(folder / "stderr.txt")]
    return {
        "what": run.what, "args": list(run.args), "folder": str(folder.resolve()),
        "ranks": run.ranks, "returncode": run.returncode, "timed_out": run.timed_out,
        "processes": [{name: _capped(value) for name, value in dataclasses.asdict(process).items()}
                      for process in run.processes.values()],
        "saves": [[rank, paths] for rank, paths in run.saves.items()],
        "outputs": [_capped(text) for text in outputs],
        "agent_output": _capped(read(folder / "stderr.txt") + read(folder / "stdout.txt")),
        "stacks": {stack.name: _capped(read(stack))
                   for stack in sorted((folder / "probe").glob("stack.*.txt"))},
        "checkpoint": _checkpoint(folder / "checkpoint.pt"),
    }


def from_plain(data: dict) -> Run:
    """The Run the verdicts read, rebuilt in the grader from `to_plain`'s data."""
    run = Run(data["what"], data["args"], Path(data["folder"]), data["ranks"], data["returncode"],
              data["timed_out"])
    run.processes = {process["rank"]: Process(**process) for process in data["processes"]}
    run.saves = {rank: paths for rank, paths in data["saves"]}
    run.outputs, run.agent_output = data["outputs"], data["agent_output"]
    run.stacks, run.checkpoint = data["stacks"], data["checkpoint"]
    return run


def _checkpoint(path: Path) -> dict:
    """What the grader needs of the checkpoint: where it is, whether it is there, and its keys as
    torch.load(..., weights_only=True) reads it, or that load's error."""
    import torch

    found = {"path": os.path.realpath(path), "exists": path.exists(), "keys": None, "error": None}
    if found["exists"]:
        try:
            found["keys"] = list(_keys(torch.load(path, map_location="cpu", weights_only=True)))
        except Exception as error:  # noqa: BLE001 - a torn or foreign file, or what weights_only refuses
            found["error"] = f"{type(error).__name__}: {error}"[:300]
    return found


def _keys(value):
    for key, inner in value.items() if isinstance(value, dict) else ():
        yield from ([key] if isinstance(key, str) else [])
        yield from _keys(inner)


def _capped(value):
    """A long text as its head and tail (a script that prints without end); other values as they are."""
    if isinstance(value, str) and len(value) > TEXT_LIMIT:
        return value[:TEXT_LIMIT // 2] + "\n[...]\n" + value[-TEXT_LIMIT // 2:]
    return value
