"""ZeRO-1: each rank keeps the optimizer state of its own share of the parameters.

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.1, weight_decay=0.1)
    ...backward, gradients averaged (DDP)...
    optimizer.step()   # each rank steps the parameters it owns, then sends them to the others

Every rank still holds every parameter and (after DDP) every averaged gradient; only the
optimizer's state (AdamW: two tensors the size of each parameter) is split, so each rank holds
about 1/world_size of it. Parameters are dealt to ranks largest first, each to the rank with the
fewest elements so far (torch's ZeroRedundancyOptimizer deals them the same way).
"""
from __future__ import annotations

from typing import Type

import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer that steps, on this rank, only the parameters this rank owns.

    optimizer_class and its keyword arguments (lr, weight_decay, ...) build the local optimizer
    (`self.local_optimizer`) over this rank's share; `self.state` is its state (this rank's share
    only), while `self.param_groups` keeps every parameter, so zero_grad() and learning-rate
    schedulers see them all. step() ends with one broadcast per
    parameter, from its owner: a collective, call it on every rank.
    """

    def __init__(self, params, optimizer_class: Type[torch.optim.Optimizer], process_group=None,
                 **defaults):
        self.optimizer_class, self.process_group = optimizer_class, process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.owner = {}                       # id(parameter) -> the rank that steps it
        self.elements = [0] * self.world_size  # elements owned by each rank so far
        self.local_optimizer = None
        super().__init__(params, defaults)     # calls add_param_group for each group
        self.state = self.local_optimizer.state  # this rank's share only: what ZeRO-1 saves

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        for parameter in sorted(group["params"], key=lambda p: p.numel(), reverse=True):
            if id(parameter) not in self.owner:
                rank = min(range(self.world_size), key=lambda r: self.elements[r])
                self.owner[id(parameter)] = rank
                self.elements[rank] += parameter.numel()
        mine = {**group, "params": [p for p in group["params"] if self.owner[id(p)] == self.rank]}
        if self.local_optimizer is None:
            self.local_optimizer = self.optimizer_class([mine], **self.defaults)
        else:
            self.local_optimizer.add_param_group(mine)

    @torch.no_grad()
    def step(self, closure=None):
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups):
            local.update({key: value for key, value in group.items() if key != "params"})  # schedulers
        loss = self.local_optimizer.step(closure)
        source = (lambda rank: rank) if self.process_group is None else \
            (lambda rank: dist.get_global_rank(self.process_group, rank))
        works = [dist.broadcast(parameter, src=source(self.owner[id(parameter)]),
                                group=self.process_group, async_op=True)
                 for group in self.param_groups for parameter in group["params"]]
        for work in works:
            work.wait()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Optimizer.load_state_dict rebinds self.state to a new dict; the local optimizer, which
        steps, must get the loaded state, and self.state stay its alias."""
        super().load_state_dict(state_dict)
        self.local_optimizer.state.clear()
        self.local_optimizer.state.update(self.state)
        self.state = self.local_optimizer.state

    def owned_parameters(self) -> list:
        """The parameters this rank steps (and keeps optimizer state for)."""
        return [p for group in self.param_groups for p in group["params"] if self.owner[id(p)] == self.rank]

    def state_bytes(self) -> int:
        """Bytes of optimizer state (tensors) this rank holds."""
        return sum(value.numel() * value.element_size() for state in self.local_optimizer.state.values()
                   for value in state.values() if torch.is_tensor(value))
