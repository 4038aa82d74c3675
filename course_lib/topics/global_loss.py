"""A loss over the whole global batch: a contrastive (InfoNCE) loss whose negatives are every
rank's keys, and the all-gather that carries the gradient back to the rank that made each key.

contrastive_loss(queries, keys)         one process: row i of queries matches row i of keys
global_contrastive_loss(queries, keys)  inside a rank: this rank's rows against every rank's keys
gather_keeping_grad / gather_cutting_grad   the two all-gathers a lesson compares
"""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

TEMPERATURE = 0.5

__all__ = ["TEMPERATURE", "contrastive_loss", "global_contrastive_loss", "gather_keeping_grad",
           "gather_cutting_grad"]


def contrastive_loss(queries, keys, first_label=0, temperature=TEMPERATURE):
    """Cross-entropy of each query against every key: query i's positive is key first_label + i,
    every other key is a negative. The mean over the queries."""
    logits = queries @ keys.T / temperature
    labels = first_label + torch.arange(len(queries), device=queries.device)
    return F.cross_entropy(logits, labels)


def gather_keeping_grad(tensor):
    """Every rank's `tensor`, stacked along dim 0, on every rank, inside autograd: the backward
    reduce-scatters (sums) the gradients, so each rank's rows get what every rank's loss sent them
    (torch/distributed/_functional_collectives.py, all_gather_into_tensor_backward)."""
    return funcol.all_gather_single(tensor.contiguous(), 0, dist.group.WORLD)


def gather_cutting_grad(tensor):
    """The same rows with dist.all_gather: in-place copies into new tensors, outside autograd."""
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor.contiguous())
    return torch.cat(gathered)


def global_contrastive_loss(queries, keys):
    """This rank's queries against the keys of every rank; its positives sit at this rank's rows.
    The mean over this rank's rows: averaged over the ranks (as DDP averages the gradients) it is
    the loss of one process holding the whole batch."""
    all_keys = gather_keeping_grad(keys)
    return contrastive_loss(queries, all_keys, first_label=dist.get_rank() * len(queries))
