"""Activation checkpointing by hand (topics/from_scratch/checkpointing.py) against no checkpointing
and torch.utils.checkpoint, with dropout on: gradients, what autograd keeps, the random state."""
import pytest
import torch

from course_lib.checks.lesson19.ranks import checkpoint_step
from course_lib.topics.from_scratch.checkpointing import Checkpoint, ratios, time_steps

pytestmark = pytest.mark.timeout(120)


def step(checkpoint):
    """Gradients of 3 dropout blocks, tensors kept after the forward, a draw after backward (the
    grader's step, lesson19.ranks.checkpoint_step, in one process)."""
    result = checkpoint_step(1, 2, 0, checkpoint)
    return [result["x_grad"]] + result["grads"], result["saved"], result["after"]


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
