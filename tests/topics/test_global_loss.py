"""The global batch's references: global_contrastive_loss on 2 ranks trains like one process (the
ranks' losses and, averaged as DDP does, their gradients), and a gather outside autograd does not;
replica_health_check gives every rank the same verdict on a drift and on a NaN."""
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from course_lib import launch
from course_lib.topics import global_loss, pitfalls

pytestmark = pytest.mark.timeout(120)


def _batch(world_size=2, rows=3):
    generator = torch.Generator().manual_seed(5)
    projection = torch.randn(5, 4, generator=generator)
    views = torch.randn(2, world_size * rows, 5, generator=generator)
    return projection, views


def _loss_and_gradient(gather, rows=3):
    rank = dist.get_rank() if dist.is_initialized() else 0
    projection, (views_a, views_b) = _batch(rows=rows)
    projection.requires_grad_(True)
    mine = slice(rank * rows, (rank + 1) * rows) if gather else slice(None)
    queries, keys = (F.normalize(views[mine] @ projection, dim=1) for views in (views_a, views_b))
    loss = global_loss.contrastive_loss(queries, gather(keys) if gather else keys,
                                        first_label=rank * rows if gather else 0)
    loss.backward()
    return loss.detach(), projection.grad


@pytest.mark.parametrize("gather, agrees", [(global_loss.gather_keeping_grad, True),
                                            (global_loss.gather_cutting_grad, False)])
def test_the_gather_with_a_backward_trains_like_one_process(gather, agrees):
    one_loss, one_gradient = _loss_and_gradient(None)
    per_rank = launch(_loss_and_gradient, gather, timeout=60, output="none")
    assert torch.allclose(sum(loss for loss, _ in per_rank) / 2, one_loss, atol=1e-6)
    averaged = sum(gradient for _, gradient in per_rank) / 2
    assert torch.allclose(averaged, one_gradient, atol=1e-6) is agrees


def _verdicts(change):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    loss = model(torch.ones(2, 4)).sum()
    if dist.get_rank() == 1:
        change(model, loss)
    return pitfalls.replica_health_check(model, loss)


def _swap(model, loss):
    with torch.no_grad():
        model.weight[0, 0], model.weight[1, 1] = model.weight[1, 1].clone(), model.weight[0, 0].clone()


def _nan(model, loss):
    with torch.no_grad():
        model.bias[0] = float("nan")


@pytest.mark.parametrize("change, verdict", [(lambda model, loss: None, "ok"), (_swap, "diverged"),
                                             (_nan, "non-finite")])
def test_replica_health_check_tells_every_rank(change, verdict):
    assert launch(_verdicts, change, timeout=60, output="none") == [verdict, verdict]
