"""The DDP strategy on 2 CPU ranks (gloo, via course_lib.runtime.launcher.launch) against one process with the 2x batch."""
import pytest
import torch

from course_lib import DistributedRunError, launch
from course_lib.training.data import make_dataset
from course_lib.training.models import make_model, make_model_with_batchnorm, make_model_with_unused_branch
from course_lib.training.trainers import TrainConfig, Trainer

TIMEOUT = 120


def train(strategy, batch_size, grad_accum_steps=1, count_allreduces=False, model_maker=make_model, **config):
    """Train the float64 course model; with count_allreduces, a DDP comm hook counts bucket all-reduces."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    config = TrainConfig(strategy=strategy, batch_size=batch_size, grad_accum_steps=grad_accum_steps,
                         epochs=2, lr=0.1, shuffle=False, progress=False, **config)
    trainer = Trainer(model_maker(dtype=torch.float64), make_dataset(64, dtype=torch.float64), config)
    allreduces = []
    if count_allreduces:
        def counting_allreduce(state, bucket):
            allreduces.append(bucket.index())
            return allreduce_hook(state, bucket)
        trainer.model.register_comm_hook(None, counting_allreduce)
    history = trainer.fit()
    return {"losses": history.losses, "params": list(history.model.parameters()),
            "allreduces": len(allreduces), "per_rank": history.per_rank}


def assert_same_run(run, reference):
    torch.testing.assert_close(run["losses"], reference["losses"], rtol=0, atol=1e-12)
    for got, expected in zip(run["params"], reference["params"]):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_ddp_on_2_ranks_equals_one_process_with_twice_the_batch():
    single = train("single", batch_size=8)
    ranks = launch(train, "ddp", 4, nprocs=2, timeout=TIMEOUT)
    assert ranks[0]["losses"] == ranks[1]["losses"]  # averaged over ranks: equal on every rank
    for rank in ranks:
        assert_same_run(rank, single)
    assert [r["rank"] for r in ranks[0]["per_rank"]] == [0, 1]  # every rank's numbers, on every rank


def test_accumulation_with_no_sync_equals_no_accumulation_with_one_allreduce_per_step():
    plain = launch(train, "ddp", 4, count_allreduces=True, nprocs=2, timeout=TIMEOUT)
    accumulated = launch(train, "ddp", 2, 2, count_allreduces=True, nprocs=2, timeout=TIMEOUT)
    steps = len(plain[0]["losses"])
    assert len(accumulated[0]["losses"]) == steps == 2 * 64 // (4 * 2)
    for rank in range(2):
        assert_same_run(accumulated[rank], plain[rank])
        # The small model fits in one gradient bucket: one all-reduce per optimizer step, not per micro-batch.
        assert accumulated[rank]["allreduces"] == plain[rank]["allreduces"] == steps


def test_unused_parameters_need_find_unused_parameters():
    ranks = launch(train, "ddp", 4, model_maker=make_model_with_unused_branch,
                   find_unused_parameters=True, nprocs=2, timeout=TIMEOUT)
    assert ranks[0]["losses"] == ranks[1]["losses"]
    with pytest.raises(DistributedRunError, match="find_unused_parameters"):
        launch(train, "ddp", 4, model_maker=make_model_with_unused_branch, nprocs=2, timeout=TIMEOUT)


@pytest.mark.skipif(torch.cuda.is_available(), reason="SyncBatchNorm runs on GPUs")
def test_sync_batchnorm_on_cpu_is_a_clear_error():
    with pytest.raises(DistributedRunError, match="sync_batchnorm=True needs GPUs"):
        launch(train, "ddp", 4, model_maker=make_model_with_batchnorm, sync_batchnorm=True,
               nprocs=2, timeout=TIMEOUT)
