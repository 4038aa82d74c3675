"""Lesson 10's distributed evaluation inside each rank: the task built from the grader's seeds,
the learner's evaluate(model, dataset) run on it, and what comes back as plain data: the two
numbers it returned (or what it returned instead) and every input row its model was called on.
Nothing is judged here: the grader compares in its own process (evaluation.py)."""
import numbers

import torch

from ...topics.evaluation import make_eval_task


def evaluation_on_rank(evaluate, n_samples: int, seed: int) -> dict:
    model, dataset = make_eval_task(n_samples, seed)
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    try:
        result = evaluate(model, dataset)
    finally:
        hook.remove()
    inputs = torch.cat([rows.reshape(-1, rows.shape[-1]).float() for rows in seen]) if seen else None
    return {"result": as_two_numbers(result), "inputs": inputs}


def as_two_numbers(result):
    """[loss, accuracy] as floats when `result` is two numbers (Python numbers or one-element
    tensors); otherwise a short description of what it is, for the verdict."""
    if isinstance(result, (tuple, list)) and len(result) == 2:
        values = []
        for value in result:
            if torch.is_tensor(value) and value.numel() == 1:
                values.append(float(value.item()))
            elif isinstance(value, numbers.Real) and not isinstance(value, bool):
                values.append(float(value))
            else:
                break
        else:
            return values
    text = repr(result)
    return text if len(text) <= 160 else text[:157] + "..."
