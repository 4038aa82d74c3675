"""Lesson 03's global loss: the learner's global_contrastive_loss(queries, keys) on 2 and 3 gloo
ranks, each holding its rows of a batch drawn at grading time, judged against one process holding
the whole batch: the ranks' losses averaged, and the gradient of the shared projection averaged
over the ranks (what DDP would apply), must equal that process's loss and gradient.

A plain dist.all_gather leaves the gathered keys outside autograd: the loss is right and the
gradient misses what the other ranks' losses send to this rank's keys; local negatives change the
loss; a loss multiplied by the world size scales both.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...topics import global_loss
from ...topics.global_loss import contrastive_loss
from ..engine import GradingError, expect, expect_close, grader
from ..engine.boundary import grading_seed
from ..engine.call_watch import calls_of
from ..engine.learner_call import library_call_hint
from .harness import launch_for_grading

LOSS_WORLD_SIZES = (2, 3)
ROWS_PER_RANK, FEATURES, EMBEDDING = 4, 8, 6


def grading_batch(world_size, seed):
    """(projection, views_a, views_b) of the whole global batch: a shared weight and two views of
    world_size * ROWS_PER_RANK samples; rank r holds rows r * ROWS_PER_RANK onwards."""
    generator = torch.Generator().manual_seed(seed * 7 + world_size)
    projection = torch.randn(FEATURES, EMBEDDING, generator=generator)
    views_a = torch.randn(world_size * ROWS_PER_RANK, FEATURES, generator=generator)
    views_b = views_a + 0.3 * torch.randn(views_a.shape, generator=generator)
    return projection, views_a, views_b


def embed(projection, views):
    return F.normalize(views @ projection, dim=1)


def one_process(world_size, seed):
    """(loss, gradient of the projection) of one process on the whole batch."""
    projection, views_a, views_b = grading_batch(world_size, seed)
    projection.requires_grad_(True)
    loss = contrastive_loss(embed(projection, views_a), embed(projection, views_b))
    loss.backward()
    return loss.item(), projection.grad


def loss_and_gradient_on_rank(global_contrastive_loss, seed):
    """Inside a rank: the learner's loss on this rank's rows, then backward; plain data back."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    projection, views_a, views_b = grading_batch(world_size, seed)
    projection.requires_grad_(True)
    rows = slice(rank * ROWS_PER_RANK, (rank + 1) * ROWS_PER_RANK)
    with calls_of(global_loss.global_contrastive_loss) as library_calls:
        loss = global_contrastive_loss(embed(projection, views_a[rows]),
                                       embed(projection, views_b[rows]))
    if library_calls or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        return {"loss": repr(loss)[:80], "gradient": None, "grad_fn": False,
                "library": bool(library_calls)}
    if loss.requires_grad:
        loss.backward()
    gradient = None if projection.grad is None else projection.grad.detach().clone()
    return {"loss": float(loss.detach()), "gradient": gradient, "grad_fn": loss.requires_grad,
            "library": False}


@grader("a loss over the global batch")
def check_global_loss(global_contrastive_loss):
    seed = grading_seed(0)
    for world_size in LOSS_WORLD_SIZES:
        per_rank = launch_for_grading(loss_and_gradient_on_rank, global_contrastive_loss, seed,
                                      nprocs=world_size,
                                      what=f"global_contrastive_loss on {world_size} ranks")
        _expect_global(per_rank, world_size, seed)


def _expect_global(per_rank, world_size, seed):
    where = f"on {world_size} ranks"
    expect(not any(result["library"] for result in per_rank), "global_contrastive_loss",
           "your own gather and loss", "a call of global_loss.global_contrastive_loss",
           library_call_hint("global_contrastive_loss", "exercise 4"))
    for rank, result in enumerate(per_rank):
        expect(isinstance(result["loss"], float), f"what global_contrastive_loss returns on rank "
               f"{rank} {where}", "a tensor holding one number: the loss", result["loss"])
        expect(result["grad_fn"], f"rank {rank}'s loss {where}", "a tensor in the autograd graph",
               "a loss that does not require grad", "the queries and keys require grad: "
               "something detached them (.detach(), .item(), torch.no_grad)")
    loss, gradient = one_process(world_size, seed)
    mean_loss = sum(result["loss"] for result in per_rank) / world_size
    if abs(mean_loss - loss) > 1e-4 * max(1.0, abs(loss)):
        ratio = mean_loss / loss if loss else float("nan")
        raise GradingError(
            f"the ranks' losses averaged {where}", f"{loss:.6f}, the loss of one process holding "
            "the whole batch", f"{mean_loss:.6f} ({ratio:.3g} times it)",
            f"the loss is {world_size} times too large: it is already a mean over the rows; DDP "
            "averages the gradients over the ranks" if abs(ratio - world_size) < 1e-3 else
            "each query's negatives are every rank's keys, and its positive is the key at its own "
            "row of the global batch: rank r's rows start at r * (rows per rank)")
    missing = [rank for rank, result in enumerate(per_rank) if result["gradient"] is None]
    expect(not missing, f"the projection's gradient on ranks {missing} {where}",
           "a gradient after loss.backward()", "None",
           "the loss does not depend on the projection: were the queries or keys detached?")
    averaged = sum(result["gradient"] for result in per_rank) / world_size
    expect_close(averaged, gradient, f"the projection's gradient {where}, averaged over the ranks "
                 "as DDP does", "the loss is right, the gradient is not: the keys you gathered "
                 "from the other ranks are outside autograd (dist.all_gather fills new tensors), "
                 "so what the other ranks' losses owe this rank's keys never comes back (or comes back "
                 "unsummed). Gather with a collective whose backward sums what every rank's loss "
                 "sent each key: a reduce-scatter", rtol=1e-4, atol=1e-6)
