"""Activation checkpointing by hand (topics/from_scratch/checkpointing.py) against no checkpointing
and torch.utils.checkpoint, with dropout on: gradients, what autograd keeps, the random state."""
import pytest
import torch

from course_lib.topics.from_scratch.checkpointing import Checkpoint, blocks, ratios, run_blocks, time_steps
from course_lib.topics.memory import SavedActivations

pytestmark = pytest.mark.timeout(120)


def step(checkpoint, keep_random_state=True):
    """Gradients of 3 dropout blocks, tensors kept after the forward, a draw after backward."""
    model = blocks(3, 8, dropout=0.5, seed=1)
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2), requires_grad=True)
    torch.manual_seed(3)
    with SavedActivations(model) as saved:
        out = run_blocks(model, x, checkpoint)
        kept = len(saved.tensors())
    out.pow(2).sum().backward()
    return [x.grad] + [p.grad for p in model.parameters()], kept, torch.rand(3)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_gives_the_gradients_of_no_checkpointing_keeping_only_the_inputs(use_reentrant):
    plain_grads, plain_kept, plain_after = step(None)
    mine_grads, mine_kept, mine_after = step(Checkpoint.apply)
    torch_grads, torch_kept, _ = step(lambda block, h: torch.utils.checkpoint.checkpoint(
        block, h, use_reentrant=use_reentrant))
    for mine, plain, theirs in zip(mine_grads, plain_grads, torch_grads):
        assert torch.allclose(mine, plain, atol=1e-6) and torch.allclose(mine, theirs, atol=1e-6)
    assert (plain_kept, mine_kept) == (12, 3) and torch_kept <= 3
    assert torch.equal(mine_after, plain_after)  # fork_rng put the surrounding state back


def test_a_recompute_without_the_forwards_random_state_draws_other_masks():
    class Unrestored(Checkpoint):
        @staticmethod
        def backward(ctx, *grads):
            ctx.random_state = torch.get_rng_state()  # today's state, not the forward's
            return Checkpoint.backward(ctx, *grads)

    plain_grads, _, _ = step(None)
    wrong_grads, _, _ = step(Unrestored.apply)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(wrong_grads, plain_grads))


def test_time_steps_takes_the_variants_in_turns_and_leaves_the_warm_up_out():
    calls = []
    seconds = time_steps({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert [len(v) for v in seconds.values()] == [3, 3]
    assert ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
