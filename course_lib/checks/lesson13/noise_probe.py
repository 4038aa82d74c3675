"""Whether a seeded augmentation draws noise of its own for every (seed, step, rank), far into a run.

A seed made by adding scaled numbers (``1000 * seed + step * world_size + rank``) gives two
triples one seed as soon as one term catches up with another: seed 1 at step 0 is seed 0 at step
500. The probe draws a few numbers for every step up to DENSE_STEPS and for the steps where such
sums meet (multiples of powers of 2 and 10, and halves of them, up to FAR_STEP), for several seeds,
and finds two triples whose noise is the same numbers (in any order). noise_on_rank runs the probe
and a few plain draws of a learner's add_noise in a rank, and returns what it drew as plain data
(engine/boundary.py); first_collision, in the grader, compares. The seeds and steps handed to
add_noise are the probe's grid, the same in every grading (the collisions it looks for are sums
that meet on it); the batch X the noise is added to comes from the grading seed.
"""
import torch

from ...training.data import make_dataset

DENSE_STEPS = 2048     # every step up to here
FAR_STEP = 10 ** 8     # more steps than any run takes: a seed may repeat beyond this
PROBE_SEEDS = (0, 1, 2)
PROBE_SHAPE = (1, 8)   # 8 numbers: two different streams never draw the same 8


def probe_steps() -> list:
    far = {base * power // half for power in (10 ** k for k in range(1, 9))
           for base in (1, 2, 5) for half in (1, 2)}
    far |= {2 ** k // half for k in range(11, 27) for half in (1, 2)}
    return sorted(set(range(DENSE_STEPS)) | {step for step in far if step <= FAR_STEP})


def fingerprints_on_rank(add_noise) -> dict:
    """In a rank: {(seed, step): the sorted numbers add_noise draws} over the probe's grid."""
    X = torch.zeros(PROBE_SHAPE)
    found = {}
    for seed in PROBE_SEEDS:
        for step in probe_steps():
            drawn = (add_noise(X, step, seed=seed) - X).detach().flatten()
            found[(seed, step)] = tuple(sorted(round(value, 6) for value in drawn.tolist()))
    return found


def fingerprint_rows(fingerprints: dict):
    """The fingerprints as plain data, in the probe's order: a tensor of one row per (seed, step),
    or a list of rows when add_noise drew different numbers of numbers."""
    rows = [list(numbers) for numbers in fingerprints.values()]
    try:
        return torch.tensor(rows, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return rows


def fingerprints_from_rows(rows) -> dict:
    """fingerprint_rows's rows back as {(seed, step): the sorted numbers}, in the grader."""
    keys = [(seed, step) for seed in PROBE_SEEDS for step in probe_steps()]
    return {key: tuple(row.tolist() if torch.is_tensor(row) else row)
            for key, row in zip(keys, rows)}


def first_collision(fingerprints_of_ranks: list):
    """((rank, seed, step), (rank, seed, step)) of the first two triples that draw the same
    numbers, ordered by how soon a run meets them (the later step first); None if none."""
    seen, collisions = {}, []
    for rank, fingerprints in enumerate(fingerprints_of_ranks):
        for (seed, step), numbers in fingerprints.items():
            triple = (rank, seed, step)
            if numbers in seen:
                collisions.append((seen[numbers], triple))
            else:
                seen[numbers] = triple
    if not collisions:
        return None
    return min(collisions, key=lambda pair: (max(pair[0][2], pair[1][2]), pair))


NOISE_STEPS, SEEDS = 4, (0, 1)
DATA_SEED = 2  # X's seed; the grader passes grading_seed(DATA_SEED)


def noise_on_rank(add_noise, data_seed: int = DATA_SEED):
    """In a rank: the noise of each step of NOISE_STEPS for each seed of SEEDS ([seed][step]),
    seed 0's step 2 drawn again, X as it is after every call, and the probe's fingerprint rows."""
    X = make_dataset(n_samples=64, seed=data_seed).tensors[0]
    noise = [[(add_noise(X, step, seed=seed) - X).detach().clone() for step in range(NOISE_STEPS)]
             for seed in SEEDS]
    again = (add_noise(X, 2, seed=0) - X).detach().clone()
    return noise, again, X.clone(), fingerprint_rows(fingerprints_on_rank(add_noise))
