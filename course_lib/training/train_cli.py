"""`python -m course_lib train`: train the course model on the course data from a shell.

The same command runs in one process, on N local processes (`--nprocs N`, via course_lib.launch),
and under `torchrun` on one node or several; every TrainConfig field is a flag.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import typing

import torch
import torch.distributed as dist

from ..runtime.shared.env import gpu_count
from .amp import AMP_MODES
from .data import make_dataset
from .models import make_model
from .strategies import STRATEGIES, check_gpus_for_nccl
from .trainers import LR_SCALINGS, OPTIMIZERS, TrainConfig, Trainer

CHOICES = {"strategy": STRATEGIES, "optimizer": OPTIMIZERS, "lr_scaling": LR_SCALINGS,
           "amp": [mode for mode in AMP_MODES if mode]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib train",
        description="Train the course MLP on the synthetic course dataset. Runs as is; under "
                    "torchrun each process is one DDP rank; --nprocs N starts N local ranks itself.")
    run = parser.add_argument_group("how to run")
    run.add_argument("--nprocs", type=int, default=1, help="local processes to start (not under torchrun)")
    run.add_argument("--backend", choices=["gloo", "nccl"], default=None,
                     help="default: nccl when every rank has a GPU, else gloo")
    run.add_argument("--timeout", type=float, default=None, help="seconds before --nprocs ranks are stopped")
    run.add_argument("--samples", type=int, default=1024, help="dataset size")
    run.add_argument("--hidden", type=int, default=32, help="hidden units of the MLP")
    run.add_argument("--history-json", default=None, help="write losses and measurements here (rank 0)")
    config = parser.add_argument_group("training (TrainConfig)")
    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        kind = typing.get_args(hints[field.name])[0] if field.default is None else hints[field.name]
        if field.name == "strategy":  # default: ddp when there are several ranks, else single
            config.add_argument(flag, choices=CHOICES["strategy"], default=None)
        elif kind is bool:
            config.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            config.add_argument(flag, type=kind, choices=CHOICES.get(field.name),
                                default=field.default, help=f"default: {field.default}")
    return parser


def train(config: TrainConfig, samples: int, hidden: int):
    """What every rank runs: the course model and data, one Trainer."""
    dataset = make_dataset(samples, seed=config.seed)
    return Trainer(make_model(seed=config.seed, hidden=hidden), dataset, config).fit()


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)
    world_size = int(os.environ["WORLD_SIZE"]) if under_torchrun else args.nprocs
    if under_torchrun and args.nprocs != 1:
        return _fail("--nprocs starts local processes itself; under torchrun use --nproc_per_node instead")
    if args.nprocs < 1:
        return _fail(f"--nprocs={args.nprocs} must be at least 1")
    fields = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    fields["strategy"] = fields["strategy"] or ("ddp" if world_size > 1 else "single")
    if world_size > 1 and fields["strategy"] != "ddp":
        return _fail(f"strategy={fields['strategy']!r} runs in one process, but {world_size} were "
                     f"asked for; use --strategy ddp, or run one process")
    try:
        config = TrainConfig(**fields)
        if args.backend == "nccl":
            check_gpus_for_nccl(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)))
        if under_torchrun:
            history = _train_under_torchrun(config, args)
        elif args.nprocs > 1:
            from ..runtime.launcher.launch import launch

            history = launch(train, config, args.samples, args.hidden, nprocs=args.nprocs,
                             backend=args.backend, timeout=args.timeout)[0]
        else:
            history = train(config, args.samples, args.hidden)
    except (ValueError, RuntimeError) as error:
        return _fail(str(error))
    if history.rank == 0:
        _report(history, config, args.history_json)
    return 0


def _train_under_torchrun(config: TrainConfig, args):
    if config.strategy != "ddp":
        return train(config, args.samples, args.hidden)
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    backend = args.backend or ("nccl" if gpu_count() >= local_world_size > 0 else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(backend)
    try:
        return train(config, args.samples, args.hidden)
    finally:
        # DDP sits in a reference cycle: collected, it lets go of the group, whose gloo threads
        # then end here, not at exit, where they can abort the process (see examples/ddp_train.py)
        gc.collect()
        dist.destroy_process_group()


def _report(history, config: TrainConfig, history_json) -> None:
    replicas = "devices in one process" if config.strategy == "dp" else "rank(s)"
    print(f"trained strategy={config.strategy} on {history.world_size} {replicas}: "
          f"{len(history.losses)} steps of global batch {history.global_batch_size}, "
          f"loss {history.losses[0]:.4f} -> {history.losses[-1]:.4f}, "
          f"{history.samples_per_second:,.0f} samples/s", flush=True)
    if history_json:
        fields = {f.name: getattr(history, f.name) for f in dataclasses.fields(history) if f.name != "model"}
        if history.timeline is not None:  # --timeline-steps: its spans as plain dicts
            fields["timeline"] = dataclasses.asdict(history.timeline)
        with open(history_json, "w") as file:
            json.dump(fields, file, indent=1)


def _fail(message: str) -> int:
    print(f"course_lib train: error: {message}", file=sys.stderr)
    return 2
