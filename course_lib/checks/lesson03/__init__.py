"""Graders of lesson 03, processes and collectives: predict what a short program's collectives
leave on each rank (puzzle.py), build a ring all-reduce from send/recv (ring.py), measure this
machine's alpha and beta (alpha_beta.py), and write a loss over the global batch whose gradient
crosses the ranks (global_loss.py); harness.py runs the code they judge on gloo ranks.
"""
from .alpha_beta import check_measure_alpha_beta
from .global_loss import check_global_loss
from .puzzle import check_collective_puzzle
from .ring import check_ring_all_reduce

__all__ = ["check_collective_puzzle", "check_ring_all_reduce", "check_measure_alpha_beta",
           "check_global_loss"]
