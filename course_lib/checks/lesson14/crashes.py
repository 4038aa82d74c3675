"""What a failed run of the capstone's script tells the learner: where each process of a hung run
waits, and for a crash the most telling error of its processes, the line of the script that raised
it, and a hint at the mistake behind it.
"""
import re

from .oracle import EPOCHS, SAMPLES, rank_share
from .script_probe import Run, Script

CRASH_HINTS = [  # (pattern in the error, what it says about the script)
    ("Default process group has not been initialized",
     "under torchrun, DDP, DistributedSampler and every collective need the process group, "
     "which this run never made; with plain python (RANK not set) none of them belong"),
    ("environment variable RANK expected", "with plain python RANK is not set, and nothing that "
     "needs it may run: one process trains as train.py did"),
    ("KeyError: '(LOCAL_)?RANK'|KeyError: '(LOCAL_)?WORLD_SIZE'",
     "with plain python torchrun's variables are not set: the script read one anyway"),
    ("NCCL|CUDA|cuda", "the grader hides the GPUs, as a laptop has none: the script chose a GPU "
     "or NCCL without asking whether each rank has a GPU"),
    ("Unexpected key.*module\\.|Missing key", "the checkpoint's keys and the model's differ by "
     "DDP's 'module.' prefix: one side was saved or loaded through the wrapper"),
    ("source state dict is empty", "the checkpoint's GradScaler state is empty, and the loading "
     "side's scaler is enabled: bf16 needs no scaler, so one side enabled it where it is not used"),
    ("Connection closed by peer|Connection reset by peer|Broken pipe",
     "a rank left while another still waited in a collective: the ranks did not run the same "
     "steps and the same collectives"),
    ("terminate called without an active exception|SIGABRT|Signals.SIGABRT",
     "the process died while Python shut down, after your script ended: the process group and "
     "the DDP wrapper were left for Python's shutdown to clean up (lesson 04, section 6)"),
]
UNKNOWN_CRASH = ("the error is raised in your script (its traceback is in the message above): fix "
                 "it, save the file, then run this check again; to see it yourself, run "
                 "`torchrun --standalone --nproc_per_node=2 train_ddp.py` in a terminal")


def crash_message(run: Run, script: Script) -> tuple:
    """(what went wrong, hint) for a run that exited with an error."""
    error, where = root_error(failed_outputs(run), script)
    if not error and run.distributed:
        error = agent_summary(run)
    text = error + where  # not the whole output: a warning may name CUDA, say
    hint = next((hint for pattern, hint in CRASH_HINTS if re.search(pattern, text)), UNKNOWN_CRASH)
    if run.distributed and "Connection" in text and len(run.processes) == run.ranks:
        starts = start_epochs(run)
        if len(set(starts.values())) > 1:
            error = ", ".join(f"rank {rank} started at epoch {epoch}" for rank, epoch in
                              sorted(starts.items())) + f"; then {error}"
            hint = ("the ranks started at different epochs: a rank that starts over runs more "
                    "steps than the others, which leave it waiting; every rank must load the "
                    "checkpoint")
    return f"exit code {run.returncode}: {error}{where}"[:700], hint


def start_epochs(run: Run) -> dict:
    """The epoch each rank started at, read from the first samples it fetched."""
    starts = {}
    for rank, process in run.processes.items():
        first = process.fetched()[:SAMPLES // run.ranks]
        starts[rank] = next((epoch for epoch in range(EPOCHS)
                             if first == rank_share(epoch, rank, run.ranks)), "?")
    return starts


def trained_without_ddp(run: Run) -> bool:
    """Every rank recorded, a rank took an optimizer step, and no forward went through DDP: each
    rank trained as train.py does. Such ranks race for checkpoint.pt (one can load it while
    another writes it), so the crash that may follow is a symptom, DDP missing the cause."""
    events = [event for process in run.processes.values() for event in process.events]
    return (len(run.processes) == run.ranks and any(event[0] == "step" for event in events)
            and not any(event[0] == "forward" for event in events))


def where_it_waits(run: Run, script: Script) -> list:
    lines = script.text.splitlines()
    waits = []
    for name, stacks in sorted(run.stacks.items()):
        frames = re.findall(rf'File "{re.escape(str(script))}", line (\d+) in (\S+)', stacks)
        if frames:  # most recent call first
            number = int(frames[0][0])
            code = lines[number - 1].strip() if number <= len(lines) else ""
            who = name.split(".")[1].replace("rank", "rank ")
            waits.append(f"{who} waits at line {number} ({code})")
    return waits


def failed_outputs(run: Run) -> list:
    """What each process wrote to stderr (torchrun's per-rank logs), read after the run."""
    return run.outputs


def root_error(outputs: list, script: Script) -> tuple:
    """(the error line, ' at line N (code)' in the script) of the most telling traceback: a
    rank's own error before a 'connection closed' that only says a peer left."""
    found = []
    for output in outputs:
        errors = re.findall(r"^(?:\[rank\d+\]: )?((?:[\w.]+(?:Error|Exception|Interrupt)\b|"
                            r"terminate called).*)$", output, flags=re.MULTILINE)
        if errors:
            frames = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', output)
            found.append((errors[-1], int(frames[-1]) if frames else None))
    if not found:
        return "", ""
    found.sort(key=lambda item: "Connection" in item[0])
    error, number = found[0]
    error = re.sub(r"\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", error)  # the C++ source of a torch error
    error = re.sub(r"\. This is typically caused by a remote worker.*", "", error)  # gloo's advice
    error = error if len(error) < 240 else error[:237] + "..."
    lines = script.text.splitlines()
    where = f" ({script.name} line {number}: {lines[number - 1].strip()})" if number and \
        number <= len(lines) else ""
    return error.strip(), where


def agent_summary(run: Run) -> str:
    agent = run.agent_output
    found = re.findall(r"(exitcode\s*:\s*-?\d+.*|Signal \d+ \(\w+\).*)", agent)
    return "; ".join(line.strip() for line in found[:3]) or "torchrun reported a failed worker"
