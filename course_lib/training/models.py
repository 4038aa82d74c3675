"""The course's one model (a small MLP), and deliberately broken variants for the pitfalls lesson.

Each maker takes a seed, so every rank and every run builds identical initial weights.
"""
import torch
from torch import nn

from .data import N_CLASSES, N_FEATURES


def _seeded(seed: int, build, dtype: torch.dtype) -> nn.Module:
    # A private generator state keeps the caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().to(dtype)


def make_model(seed: int = 0, hidden: int = 32, dropout: float = 0.0,
               n_features: int = N_FEATURES, n_classes: int = N_CLASSES,
               dtype: torch.dtype = torch.float32, hidden_layers: int = 1) -> nn.Module:
    """A two-layer MLP: Linear, ReLU, (Dropout), Linear. Outputs class logits.

    `hidden_layers=k` makes it deeper: k (Linear, ReLU, (Dropout)) blocks before the last Linear,
    so 2 (k + 1) parameter tensors (lesson 04 needs many, for DDP's buckets to matter).
    """
    if hidden_layers < 1:
        raise ValueError(f"hidden_layers={hidden_layers} must be at least 1")

    def build():
        layers = []
        for inputs in [n_features] + [hidden] * (hidden_layers - 1):
            layers += [nn.Linear(inputs, hidden), nn.ReLU()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
        return nn.Sequential(*layers, nn.Linear(hidden, n_classes))
    return _seeded(seed, build, dtype)


class UnusedBranchMLP(nn.Module):
    """An MLP with a branch forward never calls: DDP fails on it unless find_unused_parameters=True."""

    def __init__(self, hidden: int, n_features: int, n_classes: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
        self.unused_head = nn.Linear(hidden, n_classes)

    def forward(self, X):
        return self.body(X)


def make_model_with_unused_branch(seed: int = 0, hidden: int = 32, n_features: int = N_FEATURES,
                                  n_classes: int = N_CLASSES,
                                  dtype: torch.dtype = torch.float32) -> nn.Module:
    """Pitfall: parameters that get no gradient (DDP waits for them forever, or errors)."""
    return _seeded(seed, lambda: UnusedBranchMLP(hidden, n_features, n_classes), dtype)


def make_model_with_batchnorm(seed: int = 0, hidden: int = 32, n_features: int = N_FEATURES,
                              n_classes: int = N_CLASSES,
                              dtype: torch.dtype = torch.float32) -> nn.Module:
    """Pitfall: BatchNorm statistics are per rank unless converted to SyncBatchNorm."""
    def build():
        return nn.Sequential(nn.Linear(n_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                             nn.Linear(hidden, n_classes))
    return _seeded(seed, build, dtype)
