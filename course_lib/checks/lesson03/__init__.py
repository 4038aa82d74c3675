"""Graders of lesson 03, processes and collectives: predict what a short program's collectives
leave on each rank (puzzle.py), build a ring all-reduce from send/recv (ring.py), and measure this
machine's alpha and beta (alpha_beta.py); harness.py runs the code they judge on gloo ranks.
"""
from .alpha_beta import check_measure_alpha_beta
from .puzzle import check_collective_puzzle
from .ring import check_ring_all_reduce

__all__ = ["check_collective_puzzle", "check_ring_all_reduce", "check_measure_alpha_beta"]
