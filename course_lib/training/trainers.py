"""One training loop for every strategy: a TrainConfig in, a History out.

The loop asks a strategy (single, DP, DDP) only for what differs between them; accumulation, AMP,
clipping, LR scaling, measurements and checkpoints are the same code for all three.
"""
from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from . import checkpoint
from ..runtime.shared.env import seed_everything
from .amp import AMP_MODES, Precision
from .loading import make_loader
from .measure import PhaseTimer, StepClock, peak_memory_bytes, reset_peak_memory
from .strategies import STRATEGIES, make_strategy
from .timeline_recorder import Timeline, TimelineRecorder

OPTIMIZERS = ("sgd", "adamw")
LR_SCALINGS = ("none", "linear", "sqrt")


@dataclass
class TrainConfig:
    """Everything a run needs. batch_size is per rank (per device for DP); the global batch is
    batch_size x grad_accum_steps x world_size, and lr is scaled from base_global_batch_size."""

    strategy: str = "single"
    batch_size: int = 32
    grad_accum_steps: int = 1
    epochs: int = 1
    max_steps: Optional[int] = None          # optimizer steps; when set, it overrides epochs
    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    lr_scaling: str = "none"                 # "linear" or "sqrt" in global batch / base
    base_global_batch_size: Optional[int] = None   # the batch lr was tuned for; default batch_size
    warmup_steps: int = 0
    amp: Optional[str] = None                # None, "fp16" (CUDA) or "bf16"
    grad_clip_norm: Optional[float] = None
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: Optional[int] = None    # batches each worker loads ahead (torch's default: 2)
    persistent_workers: bool = False         # keep the workers between epochs (needs num_workers)
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0                # optimizer steps; 0 saves at the end of each epoch
    keep_last: int = 2
    resume: bool = False                     # continue from the newest checkpoint in checkpoint_dir
    find_unused_parameters: bool = False
    sync_batchnorm: bool = False
    progress: bool = True
    timeline_steps: int = 0                  # record a timeline of the run's last N steps (history.timeline)
    device: Optional[str] = None             # default: cuda if available (the rank's GPU for DDP)

    def __post_init__(self):
        choices = {"strategy": STRATEGIES, "optimizer": OPTIMIZERS, "lr_scaling": LR_SCALINGS, "amp": AMP_MODES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        for name in ("batch_size", "grad_accum_steps", "epochs", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps={self.max_steps} must be at least 1 (or None to use epochs)")
        if (self.prefetch_factor is not None or self.persistent_workers) and self.num_workers < 1:
            raise ValueError("prefetch_factor and persistent_workers are settings of DataLoader "
                             "workers: set num_workers to 1 or more, or leave them out")
        if self.timeline_steps < 0:
            raise ValueError(f"timeline_steps={self.timeline_steps} must be 0 (off) or a number of steps")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("resume=True needs checkpoint_dir, the folder to resume from")


@dataclass
class History:
    """What a run produced. losses and learning_rates have one entry per optimizer step;
    the measurements are this rank's, and per_rank holds every rank's."""

    losses: list = field(default_factory=list)      # averaged over ranks: equal on every rank
    model: Optional[nn.Module] = None              # the trained model, without its DP/DDP wrapper
    learning_rates: list = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    global_batch_size: int = 0
    samples_per_second: float = 0.0  # all ranks' samples / the whole run's time, warm-up included;
    # for the steady state, divide the global batch by the median of step_times
    phase_times: dict = field(default_factory=dict)  # seconds in data, forward, backward, optimizer
    step_times: list = field(default_factory=list)  # seconds per optimizer step of this run
    peak_memory_bytes: dict = field(default_factory=dict)  # {device: bytes} of this rank's devices
    skipped_steps: int = 0                          # fp16 steps skipped on inf/NaN gradients
    per_rank: list = field(default_factory=list)    # every rank's measurements, as dicts
    resumed_from: Optional[str] = None
    timeline: Optional[Timeline] = None             # every rank's phases, with timeline_steps


def scaled_lr(config: TrainConfig, global_batch_size: int) -> float:
    """lr for this global batch: unchanged, or scaled linearly / by the square root from the base batch."""
    ratio = global_batch_size / (config.base_global_batch_size or config.batch_size)
    return config.lr * {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[config.lr_scaling]


class Trainer:
    """Wraps the model for its strategy, then `fit()` runs the loop and returns a History."""

    def __init__(self, model: nn.Module, dataset, config: Optional[TrainConfig] = None,
                 loss_fn=F.cross_entropy):
        self.config = config = config or TrainConfig()
        self.loss_fn = loss_fn
        self.strategy = strategy = make_strategy(config.strategy, config.device)
        seed_everything(config.seed + strategy.rank)  # same data order everywhere; own dropout masks
        self.model = strategy.wrap(model, config)  # DDP hooks may be added to trainer.model before fit
        self.device = strategy.device
        self.global_batch_size = config.batch_size * config.grad_accum_steps * strategy.world_size
        loader_batch_size = config.batch_size * strategy.world_size // strategy.num_shards
        self.loader = make_loader(dataset, config, strategy.num_shards, strategy.rank, loader_batch_size)
        self.steps_per_epoch = math.ceil(len(self.loader) / config.grad_accum_steps)
        self.total_steps = config.max_steps or config.epochs * self.steps_per_epoch
        self.precision = Precision(config.amp, self.device, self.model)
        self.optimizer = self._make_optimizer(scaled_lr(config, self.global_batch_size))
        warmup = config.warmup_steps  # no scheduler without warmup: it would wrap every step for nothing
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup)) if warmup else None
        self.epoch, self.position, self.global_step = 0, 0, 0  # position: steps done in this epoch
        self.history = History(rank=strategy.rank, world_size=strategy.world_size,
                               global_batch_size=self.global_batch_size)
        if config.resume:
            self._resume()

    def _make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        config, parameters = self.config, self.model.parameters()
        if config.optimizer == "sgd":
            return torch.optim.SGD(parameters, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay)
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=config.weight_decay)

    def fit(self) -> History:
        config, history = self.config, self.history
        timer = PhaseTimer(self.device)
        if config.timeline_steps:  # a recorder in the timer's place; without it the loop is unchanged
            timer = self._timeline_recorder(timer)
        reset_peak_memory(self.strategy.devices)
        self.model.train()
        bar = tqdm(total=self.total_steps, initial=self.global_step, unit="step",
                   desc=f"{config.strategy} x{self.strategy.world_size}",
                   disable=not (config.progress and self.strategy.rank == 0))
        unreduced_losses, samples, started = [], 0, time.perf_counter()
        step_clock = StepClock(self.device)
        while self.global_step < self.total_steps:
            skip = self.position * config.grad_accum_steps * self.loader.batch_size
            self.loader.sampler.set_epoch(self.epoch, skip=skip)
            micro_batches, remaining = iter(self.loader), len(self.loader)
            while remaining and self.global_step < self.total_steps:
                n_micro = min(config.grad_accum_steps, remaining)
                remaining -= n_micro
                loss, step_samples = self._train_step(micro_batches, n_micro, timer)
                unreduced_losses.append(loss)
                samples += step_samples
                self.position, self.global_step = self.position + 1, self.global_step + 1
                step_clock.tick()
                bar.update(1)
                if not bar.disable and self.global_step % 10 == 0:
                    bar.set_postfix(loss=f"{loss.item():.4f}")  # this rank's loss: no collective
                if not remaining:
                    self.epoch, self.position = self.epoch + 1, 0
                if self._checkpoint_due(epoch_ended=not remaining):
                    self._average_losses(unreduced_losses)
                    self.save_checkpoint()
        self._average_losses(unreduced_losses)
        bar.close()
        history.step_times.extend(step_clock.seconds())
        if config.timeline_steps:
            history.timeline = timer.finish()  # a collective, like the losses' all-reduce above
        self._finish_history(timer, samples, time.perf_counter() - started)
        return history

    def _train_step(self, micro_batches, n_micro: int, timer: PhaseTimer):
        """One optimizer step over n_micro micro-batches; returns (this rank's loss, samples seen)."""
        timer.start()
        samples = 0
        for index in range(n_micro):
            X, y = next(micro_batches)
            X, y = X.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            samples += len(X)
            timer.lap("data")
            is_last = index == n_micro - 1  # only the last backward all-reduces (DDP)
            with nullcontext() if is_last else self.strategy.no_sync(self.model):
                with self.precision.autocast():
                    loss = self.loss_fn(self.model(X), y)
                    loss = loss / n_micro if n_micro > 1 else loss
                timer.lap("forward")
                self.precision.backward(loss)
            timer.lap("backward")
            total_loss = loss.detach() if index == 0 else total_loss + loss.detach()
        self.history.learning_rates.append(self.optimizer.param_groups[0]["lr"])
        stepped = self.precision.step(self.optimizer, self.model.parameters(), self.config.grad_clip_norm)
        if stepped and self.scheduler:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        timer.lap("optimizer")
        return total_loss, samples

    def _timeline_recorder(self, timer: PhaseTimer) -> TimelineRecorder:
        """Records the run's last timeline_steps steps: past the warm-up, where DDP has rebuilt its buckets."""
        steps_left = self.total_steps - self.global_step
        steps = min(self.config.timeline_steps, steps_left)
        return TimelineRecorder(self.model, steps=max(steps, 1), skip=steps_left - steps,
                                timer=timer, device=self.device)

    def _average_losses(self, unreduced_losses: list) -> None:
        # One all-reduce for many steps: no synchronisation inside the loop.
        if unreduced_losses:
            averaged = self.strategy.average(torch.stack(unreduced_losses))
            self.history.losses.extend(averaged.tolist())
            unreduced_losses.clear()

    def _finish_history(self, timer: PhaseTimer, samples: int, seconds: float) -> None:
        history = self.history
        history.model = self.strategy.unwrap(self.model)
        history.phase_times = timer.flush()
        history.peak_memory_bytes = peak_memory_bytes(self.strategy.devices)
        history.skipped_steps = self.precision.skipped_steps
        mine = {"rank": self.strategy.rank, "device": str(self.device), "samples": samples,
                "seconds": seconds, "phase_times": history.phase_times,
                "peak_memory_bytes": history.peak_memory_bytes}
        history.per_rank = self.strategy.gather(mine)
        slowest = max(rank["seconds"] for rank in history.per_rank)
        history.samples_per_second = sum(rank["samples"] for rank in history.per_rank) / max(slowest, 1e-9)

    def _checkpoint_due(self, epoch_ended: bool) -> bool:
        config = self.config
        if not config.checkpoint_dir:
            return False
        if self.global_step == self.total_steps:
            return True
        if config.checkpoint_every:
            return self.global_step % config.checkpoint_every == 0
        return epoch_ended

    def state_dict(self) -> dict:
        """The full training state; every rank's RNG state included (gathered: call on every rank)."""
        return {
            "model": self.strategy.unwrap(self.model).state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler else None,
            "precision": self.precision.state_dict(),
            "epoch": self.epoch, "position": self.position, "global_step": self.global_step,
            "losses": list(self.history.losses),
            "learning_rates": list(self.history.learning_rates),
            "rng": self.strategy.gather(checkpoint.capture_rng_state(self.device)),
            "config": asdict(self.config),
        }

    def save_checkpoint(self):
        """Save the state now (rank 0 writes, every rank must call it); returns the file's path."""
        return checkpoint.save_checkpoint(self.state_dict(), self.config.checkpoint_dir,
                                          self.global_step, self.config.keep_last)

    def _resume(self) -> None:
        found = checkpoint.load_latest_checkpoint(self.config.checkpoint_dir, map_location=self.device)
        if found is None:
            return  # nothing saved yet: start from scratch
        state, path = found
        if len(state["rng"]) != self.strategy.num_shards:
            raise ValueError(
                f"checkpoint {path.name} was saved by {len(state['rng'])} ranks, but this run has "
                f"{self.strategy.num_shards}; resume with the same number of ranks for an exact resume")
        self.strategy.unwrap(self.model).load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler:
            self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state["precision"])
        self.epoch, self.position, self.global_step = state["epoch"], state["position"], state["global_step"]
        self.history.losses = list(state["losses"])
        self.history.learning_rates = list(state["learning_rates"])
        self.history.resumed_from = str(path)
        checkpoint.restore_rng_state(state["rng"][self.strategy.rank], self.device)
