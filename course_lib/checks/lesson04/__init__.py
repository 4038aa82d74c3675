"""Graders for lesson 04, the DDP flow: one module per exercise (the two collectives together);
the notebook imports every grader from here.

- broadcast the parameters, DDP by hand: collectives.py.
- indices for a rank: sampler.py.
- hidden share of the all-reduce: overlap.py.
- the fastest bucket size, measured: buckets.py.
"""
from .buckets import check_best_bucket_cap
from .collectives import check_broadcast_parameters, check_train_step_by_hand
from .overlap import check_hidden_share
from .sampler import check_indices_for_rank

__all__ = ["check_broadcast_parameters", "check_train_step_by_hand", "check_indices_for_rank",
           "check_hidden_share", "check_best_bucket_cap"]
