"""What lesson 18's grader runs on ranks: the course's stages, on the orders a learner's schedule
gave (plain data: no learner code runs here), and torch's Schedule1F1B on the same stages; each
rank returns its stage's gradients, which the grader compares with one process's."""
import torch
from torch import nn

from ...topics.from_scratch.pipeline import Stage, blocks as course_blocks, mean_squared_error as loss_fn

WIDTH, ROWS = 8, 4  # a micro-batch: ROWS samples of WIDTH features


def blocks(stages: int, seed: int):
    """The whole model, one block a stage: Linear and Tanh."""
    return course_blocks(stages, WIDTH, seed=seed)


def batches(microbatches: int, seed: int):
    generator = torch.Generator().manual_seed(seed + 1)
    inputs = [torch.randn(ROWS, WIDTH, generator=generator) for _ in range(microbatches)]
    return inputs, [torch.randn(ROWS, WIDTH, generator=generator) for _ in range(microbatches)]


def one_process(stages: int, microbatches: int, seed: int):
    """Each block's gradients (weight, bias) of the whole batch's mean loss."""
    model = nn.Sequential(*blocks(stages, seed))
    inputs, targets = batches(microbatches, seed)
    loss_fn(model(torch.cat(inputs)), torch.cat(targets)).backward()
    return [[p.grad for p in block.parameters()] for block in model]


def gradients_on_rank(orders, microbatches: int, seed: int):
    """This rank's block's gradients after the course's Stage ran orders[rank], and after torch's
    Schedule1F1B ran the same step."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, stages = dist.get_rank(), dist.get_world_size()
    inputs, targets = batches(microbatches, seed)
    block = blocks(stages, seed)[rank]
    Stage(block, torch.Size([ROWS, WIDTH])).run([tuple(a) for a in orders[rank]], inputs, targets, loss_fn)
    ours = [p.grad.clone() for p in block.parameters()]
    block = blocks(stages, seed)[rank]
    schedule = Schedule1F1B(PipelineStage(block, rank, stages, torch.device("cpu")),
                            n_microbatches=microbatches, loss_fn=loss_fn)
    if rank == 0:
        schedule.step(torch.cat(inputs))
    elif rank == stages - 1:
        schedule.step(target=torch.cat(targets))
    else:
        schedule.step()
    return {"ours": ours, "torch": [p.grad.clone() for p in block.parameters()]}
