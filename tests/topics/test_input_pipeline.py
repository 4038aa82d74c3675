"""The input-pipeline helpers: the slow dataset and its precomputed features, the data-wait
measurement, worker shutdown and the prefetcher (its CPU path; the CUDA path needs a GPU)."""
import json
import multiprocessing
import os
import subprocess
import sys
import time
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from course_lib.checks.lesson10 import check_fast_loader
from course_lib.topics.input_pipeline import (Prefetcher, SlowDataset, Stamped, data_wait_share,
                                 measure_data_wait, neighbour_features, precompute_features,
                                 sample_utilization, shutdown_workers)
from course_lib.topics.pitfalls import WorkerSeed
from course_lib.training.loading import make_loader
from course_lib.training.trainers import TrainConfig

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def features_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("features") / "neighbours.pt"
    precompute_features(SlowDataset(), path)
    return path


def test_neighbour_features_average_the_k_nearest_samples():
    X = torch.tensor([[0.0], [1.0], [10.0], [11.0], [30.0]])
    features = neighbour_features(X, torch.tensor([0, 3]), k=2)
    assert torch.equal(features, torch.tensor([[0.5], [10.5]]))


def test_slow_dataset_sleeps_and_keeps_the_course_labels():
    dataset = SlowDataset(n_samples=64, read_seconds=0.01)
    started = time.perf_counter()
    x, y = dataset[3]
    assert time.perf_counter() - started >= 0.01
    assert x.shape == (16,) and y == dataset.y[3]


def test_precomputed_features_match_the_ones_computed_per_sample(features_path):
    on_the_fly, precomputed = SlowDataset(read_seconds=0), SlowDataset(read_seconds=0,
                                                                       features_path=features_path)
    for index in (0, 5, 2047):
        assert torch.allclose(on_the_fly[index][0], precomputed[index][0], atol=1e-6)
        assert on_the_fly[index][1] == precomputed[index][1]


def test_workers_load_the_memory_mapped_features(features_path):
    dataset = SlowDataset(n_samples=2048, read_seconds=0, features_path=features_path)
    in_process = list(DataLoader(dataset, batch_size=256))
    workers = DataLoader(dataset, batch_size=256, num_workers=2)
    for (x0, y0), (x1, y1) in zip(in_process, workers):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)
        assert x1.is_shared()  # the batch came from a worker, through shared memory


def test_stamped_samples_say_when_and_which_worker_loaded_them():
    dataset = Stamped(SlowDataset(n_samples=64, read_seconds=0.001))
    x, y, stamps, worker = dataset[0]
    assert worker == -1 and stamps[1] - stamps[0] >= 0.001 and x.shape == (16,)
    before = time.perf_counter()
    batches = list(DataLoader(dataset, batch_size=16, num_workers=2))
    workers = sorted({int(batch[3][0]) for batch in batches})
    assert workers == [0, 1] and all(before < float(batch[2].min()) for batch in batches)


def test_data_wait_share_of_phase_times():
    assert data_wait_share({"data": 1.0, "forward": 1.0, "backward": 2.0, "optimizer": 0.0}) == 0.25
    assert data_wait_share({"compute": 3.0, "data": 1.0}) == 0.25


def test_wait_spread_is_the_courses_spread_of_the_steps_waits():
    class Loader(list):
        num_workers = 0

    waits = iter([0.03, 0.0, 0.01, 0.02, 0.04])
    slept = measure_data_wait(Loader([(torch.zeros(1),)] * 5), lambda batch: None, steps=5, warmup=0)
    slept.steps = [(0.0, wait, wait) for wait in waits]  # the recorded waits, made exact
    assert slept.wait_spread() == pytest.approx((0.02, 0.004, 0.036))  # linear: p10 between 0 and 0.01
    assert slept.wait_spread((0, 100)) == pytest.approx((0.02, 0.0, 0.04))


def when_read(loader, steps, warmup):
    """measure_data_wait over a loader of Stamped samples, with a 20 ms step; returns its record,
    (asked, got, first read's start, last read's end) of each measured batch, on one clock that
    processes share, and who read them (-1: the main process)."""
    read_spans, readers = [], set()

    def step(batch):
        stamps = batch[2]  # (samples, 2): each read's start and end
        read_spans.append((float(stamps[:, 0].min()), float(stamps[:, 1].max())))
        readers.update(batch[3].tolist())
        time.sleep(0.02)

    times = measure_data_wait(loader, step, steps=steps, warmup=warmup)
    return times, [(asked, got, *span) for (asked, got, _), span in
                   zip(times.steps, read_spans[warmup:])], readers


def waited_for_reads(batches) -> float:
    """Seconds the loop spent waiting for a batch while that batch was still being read."""
    return sum(max(0.0, min(got, last) - max(asked, first)) for asked, got, first, last in batches)


def test_workers_hide_the_reads(features_path):
    # When the reads happen, not how long the loop waits: handing over a batch that is ready also
    # waits for the scheduler, the longer the busier the machine (the data-wait share tested here
    # before failed under load, with every batch read ahead). 4 workers read 16 ms batches 5 times
    # as fast as the 20 ms step takes them.
    dataset = Stamped(SlowDataset(read_seconds=0.001, features_path=features_path))
    alone, batches, readers = when_read(DataLoader(dataset, batch_size=16), steps=6, warmup=1)
    assert readers == {-1} and alone["data"] >= 6 * 16 * 0.001
    assert all(asked <= first and last <= got for asked, got, first, last in batches)  # waited through
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more workers than cores
        workers = DataLoader(dataset, batch_size=16, num_workers=4, prefetch_factor=4)
        _, batches, readers = when_read(workers, steps=8, warmup=4)
    assert readers <= {0, 1, 2, 3}
    assert waited_for_reads(batches) < 0.1 * 8 * 0.02, batches  # under a tenth of the 8 steps


def test_shutdown_workers_stops_persistent_workers(features_path):
    dataset = SlowDataset(n_samples=256, read_seconds=0, features_path=features_path)
    loader = DataLoader(dataset, batch_size=32, num_workers=2, persistent_workers=True)
    for _ in loader:
        pass
    workers = loader._iterator._workers
    assert len(workers) == 2 and all(worker.is_alive() for worker in workers)
    shutdown_workers(loader)
    assert loader._iterator is None and not any(worker.is_alive() for worker in workers)


def test_prefetcher_on_the_cpu_yields_the_loaders_batches():
    dataset = SlowDataset(n_samples=64, read_seconds=0)
    loader = DataLoader(dataset, batch_size=16)
    prefetched = list(Prefetcher(loader, "cpu"))
    assert len(prefetched) == len(Prefetcher(loader, "cpu")) == 4
    for (x0, y0), (x1, y1) in zip(loader, prefetched):
        assert torch.equal(x0, x1) and torch.equal(y0, y1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_prefetcher_on_cuda_yields_the_loaders_batches_on_the_gpu():
    dataset = SlowDataset(n_samples=64, read_seconds=0)
    loader = DataLoader(dataset, batch_size=16, pin_memory=True)
    for (x0, y0), (x1, y1) in zip(loader, Prefetcher(loader, "cuda")):
        assert x1.is_cuda and torch.equal(x0, x1.cpu()) and torch.equal(y0, y1.cpu())


def test_fast_loader_grader_passes_the_reference(features_path, capsys):
    def fast_loader():  # runs in each of the grader's ranks: DistributedSampler finds its rank
        dataset = SlowDataset(features_path=features_path)
        return DataLoader(dataset, batch_size=32, sampler=DistributedSampler(dataset),
                          num_workers=4, prefetch_factor=4)

    running_before = set(multiprocessing.active_children())
    check_fast_loader(fast_loader)
    assert capsys.readouterr().out == "✓ a loader that hides the data wait: passed\n"
    assert set(multiprocessing.active_children()) <= running_before  # its workers are gone


def test_rank_loaders_give_their_workers_different_seeds():
    class SeedsWithLabels(WorkerSeed):  # the loader's sampler needs len(); items as (x, y)
        def __getitem__(self, index):
            worker, seed, _ = super().__getitem__(index)
            return torch.tensor([worker, seed]), 0

    config = TrainConfig(batch_size=2, seed=7, num_workers=2, progress=False)
    seeds = [{tuple(x.tolist()) for X, _ in make_loader(SeedsWithLabels(8), config, 2, rank, 2)
              for x in X} for rank in (0, 1)]
    assert len(seeds[0]) == len(seeds[1]) == 2  # two workers per rank, one seed each
    assert not seeds[0] & seeds[1]


@pytest.mark.skipif(sys.platform != "linux", reason="/dev/shm is Linux's")
def test_shared_memory_is_in_dev_shm_and_only_the_socket_follows_tmpdir(tmp_path):
    report = ("import json; from course_lib.topics.input_pipeline import shared_memory_files; "
              "print(json.dumps(shared_memory_files()))")
    environment = {**os.environ, "TMPDIR": str(tmp_path)}
    found = json.loads(subprocess.run([sys.executable, "-c", report], env=environment,
                                      capture_output=True, text=True, check=True).stdout)
    assert all(path.startswith("/dev/shm/torch_") for path in found["file_descriptor, open descriptor to"])
    assert found["file_system, data file"].startswith("/dev/shm/torch_")
    assert found["file_system, manager's socket"].startswith(str(tmp_path) + "/torch-shm-dir-")


def test_sample_utilization_samples_while_the_function_runs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "utilization", lambda device: 42)
    result, samples = sample_utilization(lambda: time.sleep(0.35) or "done", "cuda:0", every=0.05)
    assert result == "done" and len(samples) >= 3 and set(samples) == {42}
