"""The course's one dataset: small, synthetic, deterministic classification data from a seed.

Every lesson trains on `make_dataset(...)`, so only the parallelism changes between lessons.
"""
import torch
from torch.utils.data import TensorDataset

N_FEATURES = 16
N_CLASSES = 4


def make_dataset(n_samples: int = 512, seed: int = 0, n_features: int = N_FEATURES,
                 n_classes: int = N_CLASSES, dtype: torch.dtype = torch.float32) -> TensorDataset:
    """Gaussian inputs labelled by a fixed random linear teacher: (X[i], y[i]) pairs.

    The same seed always gives the same tensors, on any machine and in any process.
    """
    if n_samples < 1:
        raise ValueError(f"n_samples={n_samples} must be at least 1")
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(n_samples, n_features, generator=generator, dtype=torch.float64)
    teacher = torch.randn(n_features, n_classes, generator=generator, dtype=torch.float64)
    noise = 0.5 * torch.randn(n_samples, n_classes, generator=generator, dtype=torch.float64)
    y = (X @ teacher + noise).argmax(dim=1)
    return TensorDataset(X.to(dtype), y)
