"""The mixed-precision FSDP unit (topics/from_scratch/mixed_precision_unit.py) on 2 gloo ranks
against torch's fully_shard with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the
tolerances lesson 19's grader uses, measured here (a right unit is fully_shard's to the bit; a
bf16 reduce-scatter, the nearest wrong one, is further than the tolerances)."""
import pytest
import torch

from course_lib import launch
from course_lib.checks import lesson19
from course_lib.checks.lesson19.ranks import beside_fully_shard
from course_lib.topics.from_scratch.fsdp_unit import reduce_scatter_flat
from course_lib.topics.from_scratch.mixed_precision_unit import MixedPrecisionUnit

pytestmark = pytest.mark.timeout(300)


class ReducedInBf16(MixedPrecisionUnit):
    def post_backward(self):
        gradient = torch.empty(self.shard.numel(), dtype=torch.bfloat16)
        reduce_scatter_flat(gradient, self.flat_gradient())
        self.shard.grad = gradient.float() / 2
        self.reshard()


def gaps(results):
    """(largest loss gap, largest master-weight gap) against fully_shard, over the ranks."""
    loss = max(abs(a - b) for r in results for a, b in zip(r["mine"]["losses"], r["torch"]["losses"]))
    return loss, lesson19.master_weight_gap(results)


def test_the_unit_is_fully_shards_mixed_precision_and_a_bf16_reduction_is_not():
    right = launch(beside_fully_shard, MixedPrecisionUnit, 19, 1900, nprocs=2, backend="gloo", output="none")
    for result in right:
        mine = result["mine"]
        assert mine["shard_dtypes"] == [torch.float32] * 2 and mine["grad_dtypes"] == [torch.float32] * 2
        assert mine["output_dtype"] == torch.bfloat16
        assert mine["collectives"] == {"all_gather": ["bfloat16"], "reduce_scatter": ["float32"]}
    assert gaps(right) == (0.0, 0.0)
    wrong = launch(beside_fully_shard, ReducedInBf16, 19, 1900, nprocs=2, backend="gloo", output="none")
    loss_gap, weight_gap = gaps(wrong)
    assert loss_gap > lesson19.LOSS_TOLERANCE and weight_gap > lesson19.WEIGHT_TOLERANCE
