"""The course dataset and models: deterministic, tiny, and the pitfall variants behave as taught."""
import pytest
import torch

from course_lib.training.data import N_CLASSES, N_FEATURES, make_dataset
from course_lib.training.models import make_model, make_model_with_batchnorm, make_model_with_unused_branch


def test_dataset_is_deterministic_and_shaped():
    first, again, other = make_dataset(64, seed=1), make_dataset(64, seed=1), make_dataset(64, seed=2)
    X, y = first.tensors
    assert X.shape == (64, N_FEATURES) and y.shape == (64,)
    assert y.min() >= 0 and y.max() < N_CLASSES
    assert torch.equal(X, again.tensors[0]) and torch.equal(y, again.tensors[1])
    assert not torch.equal(X, other.tensors[0])
    assert make_dataset(8, dtype=torch.float64).tensors[0].dtype == torch.float64


def test_models_are_seeded_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    first, again = make_model(seed=3), make_model(seed=3)
    assert torch.equal(torch.rand(1), expected)
    for a, b in zip(first.parameters(), again.parameters()):
        assert torch.equal(a, b)
    X = make_dataset(5).tensors[0]
    assert first(X).shape == (5, N_CLASSES)


def test_pitfall_models():
    X = make_dataset(6).tensors[0]
    unused = make_model_with_unused_branch()
    unused(X).sum().backward()
    assert unused.unused_head.weight.grad is None  # the branch DDP would wait for
    with_batchnorm = make_model_with_batchnorm()
    assert any(isinstance(m, torch.nn.BatchNorm1d) for m in with_batchnorm.modules())
    assert with_batchnorm(X).shape == (6, N_CLASSES)


def test_a_deeper_model_keeps_the_default_and_adds_hidden_layers():
    default, deeper = make_model(seed=0), make_model(seed=0, hidden=8, hidden_layers=3, dropout=0.1)
    assert [type(m).__name__ for m in default] == ["Linear", "ReLU", "Linear"]
    assert len(list(deeper.parameters())) == 2 * (3 + 1)  # lesson 04's buckets need many tensors
    assert sum(isinstance(m, torch.nn.Dropout) for m in deeper) == 3
    assert deeper(make_dataset(5).tensors[0]).shape == (5, N_CLASSES)
    with pytest.raises(ValueError, match="hidden_layers=0"):
        make_model(hidden_layers=0)
