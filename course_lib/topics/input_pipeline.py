"""The input pipeline: a deliberately slow dataset, precomputed features, a prefetcher, and the
share of a loop's time spent waiting for data (what workers and prefetching are there to hide);
also where shared tensors live, and the GPU's utilisation sampled while a function runs.
"""
import os
import threading
import time

import torch
from torch.utils.data import Dataset, get_worker_info

from ..training.data import make_dataset
from .timing import clock_now, seal, sealed_here, spread

READ_SECONDS = 0.001  # per sample: like reading a file; a sleep frees the CPU and the GIL
NEIGHBOURS = 8


def neighbour_features(X: torch.Tensor, rows: torch.Tensor, k: int = NEIGHBOURS) -> torch.Tensor:
    """For each of `rows`, the mean of X over its k nearest samples (itself included): a feature
    from the k-nearest-neighbour graph, costly as it compares the row with every sample."""
    distances = torch.cdist(X[rows], X)
    neighbours = distances.topk(k, dim=1, largest=False).indices  # (len(rows), k)
    return X[neighbours].mean(dim=1)


def precompute_features(dataset, path, k: int = NEIGHBOURS, chunk: int = 1024) -> None:
    """Compute every sample's neighbour features once, in large batches, and save them to `path`."""
    X = dataset.X
    features = torch.cat([neighbour_features(X, torch.arange(start, min(start + chunk, len(X))), k)
                          for start in range(0, len(X), chunk)])
    torch.save(features, path)


class SlowDataset(Dataset):
    """The course's data with a slow input pipeline: each sample takes `read_seconds` to read,
    then its neighbour features are computed on the fly (CPU work), unless `features_path` names
    a file of precomputed ones, which each process memory-maps on first use."""

    def __init__(self, n_samples: int = 2048, read_seconds: float = READ_SECONDS,
                 features_path=None, k: int = NEIGHBOURS, seed: int = 0):
        self.X, self.y = make_dataset(n_samples=n_samples, seed=seed).tensors
        self.read_seconds, self.features_path, self.k = read_seconds, features_path, k
        self._features = None  # opened lazily: a worker maps the file itself, nothing is pickled

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, index):
        time.sleep(self.read_seconds)
        if self.features_path is None:
            return neighbour_features(self.X, torch.tensor([index]), self.k)[0], self.y[index]
        if self._features is None:
            self._features = torch.load(self.features_path, mmap=True)
        return self._features[index], self.y[index]


class Stamped(Dataset):
    """Each sample of `dataset`, with when it was loaded (perf_counter: a clock that the processes
    of a machine share) and which worker loaded it (-1: the main process)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        started = time.perf_counter()
        x, y = self.dataset[index]
        worker = get_worker_info()  # None in the main process
        stamps = torch.tensor([started, time.perf_counter()], dtype=torch.float64)
        return x, y, stamps, worker.id if worker else -1


def device_step(seconds: float):
    """A stand-in for a training step on a GPU: the device is busy for `seconds` while the CPU is
    free (a sleep), so the loop's data wait can be measured the same way on any machine."""
    return lambda batch: time.sleep(seconds)


class DataWait(dict):
    """Seconds per phase, {"data": ..., "compute": ...}, with the raw records they were added up
    from: `steps`, (started, loaded, finished) on time.perf_counter() for each measured step;
    `clock`, (time.time(), time.perf_counter()) read together at the start and at the end; and
    what was measured: `batch_sizes`, `num_workers`, `dataset` (its type's name). Only
    measure_data_wait makes one, sealed (topics.timing.seal): `recorded_here()` says whether it
    was made in this session and is unchanged since."""

    steps: list
    clock: tuple
    batch_sizes: list
    num_workers: int
    dataset: str
    seal: str

    def facts(self) -> tuple:
        return self.steps, self.clock, self.batch_sizes, self.num_workers, self.dataset

    def recorded_here(self) -> bool:
        return sealed_here(self, self.facts())

    def wait_spread(self, interval=(10, 90)) -> tuple:
        """(median, p10, p90) of the seconds each measured step waited for its batch (the
        course's timing.spread; `interval` picks other percentiles): the spread beside the sum."""
        return spread([loaded - started for started, loaded, _ in self.steps], interval)


def measure_data_wait(loader, step, steps: int = 20, warmup: int = 10) -> DataWait:
    """Run `step(batch)` over `warmup + steps` batches of `loader`; returns the seconds of the
    last `steps` spent waiting for a batch ("data") and in the step ("compute"), with the
    records of each step (a DataWait). Stops the loader's workers when done."""
    times = DataWait(data=0.0, compute=0.0)
    times.steps, times.batch_sizes = [], []
    times.num_workers = getattr(loader, "num_workers", 0)
    times.dataset = type(getattr(loader, "dataset", loader)).__name__
    start_clock = clock_now()
    batches = iter(loader)
    try:
        for index in range(warmup + steps):
            started = time.perf_counter()
            batch = next(batches)
            loaded = time.perf_counter()
            step(batch)
            if index >= warmup:
                finished = time.perf_counter()
                times["data"] += loaded - started
                times["compute"] += finished - loaded
                times.steps.append((started, loaded, finished))
                times.batch_sizes.append(_batch_size(batch))
    finally:
        shutdown_workers(loader, batches)
    times.clock = (start_clock, clock_now())
    times.seal = seal(times.facts())
    return times


def _batch_size(batch):
    """How many samples a batch holds: the length of its first tensor."""
    while isinstance(batch, (list, tuple, dict)) and len(batch):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    try:
        return len(batch)
    except TypeError:  # a number, or a 0-d tensor
        return None


def data_wait_share(phase_times: dict) -> float:
    """The fraction of a loop's time spent waiting for data, from seconds per phase: the "data"
    phase over all phases (a Trainer's History.phase_times, or measure_data_wait's result)."""
    return phase_times["data"] / sum(phase_times.values())


def shutdown_workers(loader, iterator=None) -> None:
    """Stop a DataLoader's worker processes now, persistent ones included (each worker holds
    memory and a CPU; a notebook should not leave them behind)."""
    for running in (iterator, getattr(loader, "_iterator", None)):
        if running is not None and hasattr(running, "_shutdown_workers"):
            running._shutdown_workers()  # what the iterator's __del__ calls; private, but stable
    if getattr(loader, "_iterator", None) is not None:
        loader._iterator = None


class Prefetcher:
    """Iterate a loader with each batch already on `device`: on CUDA the copy of the next batch
    runs on a side stream while the current step computes; elsewhere a plain `.to(device)`."""

    def __init__(self, loader, device):
        self.loader, self.device = loader, torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        if self.stream is None:
            for batch in self.loader:
                yield tuple(tensor.to(self.device) for tensor in batch)
            return
        batches = iter(self.loader)
        ready = self._copy(next(batches, None))
        while ready is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_stream(self.stream)  # the step must not read the batch before it lands
            for tensor in ready:
                tensor.record_stream(compute)  # keep its memory until the step is done with it
            batch, ready = ready, self._copy(next(batches, None))
            yield batch

    def _copy(self, batch):
        if batch is None:
            return None
        with torch.cuda.stream(self.stream):  # non_blocking needs pinned memory to overlap
            return tuple(tensor.to(self.device, non_blocking=True) for tensor in batch)


def shared_memory_files() -> dict:
    """Where this process's shared tensors live, under each sharing strategy (Linux; run it in a
    fresh process: it switches the strategy, and the manager starts once per process).

    file_descriptor: the data is a shared-memory file, unlinked at once; the process keeps an open
    descriptor to it. file_system: the data is a named file in shared memory, and a helper process
    (torch_shm_manager), which deletes it when every user is gone, listens on a socket.
    """
    import torch.multiprocessing as mp
    kept = torch.zeros(1024).share_memory_()  # file_descriptor, Linux's default
    descriptors = [_link(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")]
    mp.set_sharing_strategy("file_system")
    shared = torch.zeros(1024).share_memory_()
    # What a pickled handle of this storage holds (torch/multiprocessing/reductions.py sends it).
    manager_socket, name, _ = shared.untyped_storage()._share_filename_cpu_()
    in_dev_shm = os.path.join("/dev/shm", name.decode().lstrip("/"))
    found = {"file_descriptor, open descriptor to": [d for d in descriptors if "/torch_" in d],
             "file_system, data file": in_dev_shm if os.path.exists(in_dev_shm) else name.decode(),
             "file_system, manager's socket": manager_socket.decode()}
    del kept, shared
    return found


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:  # closed between listdir and readlink
        return ""


def sample_utilization(fn, device, every: float = 0.1):
    """Run fn() while a thread samples torch.cuda.utilization(device) every `every` seconds
    (NVML through the nvidia-ml-py package; amdsmi on ROCm). Returns (fn's result, samples in %)."""
    samples, done = [], threading.Event()

    def sample():
        while not done.wait(every):
            samples.append(torch.cuda.utilization(device))

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    try:
        result = fn()
    finally:
        done.set()
        watcher.join()
    return result, samples
