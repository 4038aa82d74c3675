"""The last line of a torchrun script on gloo: end_process_group() ends the group's threads before
Python shuts down. Import this module at the top of the script, before init_process_group().

It works around two details of torch 2.13, not an API; without them this course's scripts
sometimes aborted after their last step ('terminate called without an active exception', a
failed torchrun job): 2 of 30 runs of lesson 04's script without it on a busy 2-core machine
when the lesson was written, and lesson 12's script once in CI (a retry of 15 runs without it
saw none: rare, and the causes below are still in torch 2.13):

- A DDP model that has run a backward sits in a reference cycle: when the training function
  returns, it, its Reducer and the process group they hold stay alive until the garbage
  collector happens to run, which may be during the interpreter's shutdown, with gloo's threads
  still running.
- torch.distributed.nn.functional's collectives take `group=group.WORLD` as a default argument,
  evaluated once, at import (torch/distributed/nn/functional.py); DDP(model) imports it (through
  torch.distributed.fsdp and torch/distributed/_shard/sharded_tensor/reshard.py). Imported after
  init_process_group() it keeps the default group, and gloo's threads, past
  destroy_process_group(). Imported below, while no group exists, it keeps None.

tests/examples/test_examples.py counts gloo's threads after a script's main() returns: none.
"""
import gc

import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  here, before any group exists: see above


def end_process_group() -> None:
    """Free what still holds the process group (a DDP model in a reference cycle), then destroy
    it: gloo's threads end now, not while Python shuts down."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
