"""The course's oracle for graders: one process, plain SGD, one step per global batch.

DDP on N ranks with a per-rank batch B must follow it step by step when each global batch has N x B
samples; the graders of lessons 04 and 05 compare the learner's ranks with it.
"""
import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from ...training.models import make_model


def large_batch_sgd(batches, lr: float, before_each_step=None):
    """Train make_model(seed=0) with SGD(lr) on `batches` [(X, y), ...], one step each.

    Returns (losses, weights): weights[0] is the initial model, weights[s + 1] the model after
    step s, each flattened. `before_each_step(model, X, y)` runs under no_grad before each step.
    """
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, weights = [], [parameters_to_vector(model.parameters()).detach().clone()]
    for X, y in batches:
        if before_each_step is not None:
            with torch.no_grad():
                before_each_step(model, X, y)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(X), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        weights.append(parameters_to_vector(model.parameters()).detach().clone())
    return losses, weights


def close(a, b) -> bool:
    """Weights or updates equal up to float32 summation order across ranks."""
    return torch.allclose(a, b, rtol=1e-4, atol=1e-6)
