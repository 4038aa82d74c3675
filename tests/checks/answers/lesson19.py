"""Lesson 19's graders against answers: correct ones written differently from the solution
(ALTERNATIVES, each must pass) and plausible wrong ones, each one mistake away from right
(WRONG_ANSWERS, each must be rejected).
"""
import torch
import torch.distributed as dist
from torch import nn

from course_lib.checks import lesson19
from course_lib.topics.from_scratch import checkpointing as course_checkpointing
from course_lib.topics.from_scratch import mixed_precision_unit as course_mixed
from course_lib.topics.from_scratch.fsdp_unit import FSDPUnit, all_gather_flat, reduce_scatter_flat

from . import answer, wrong_answer


# -- exercise 1: checkpointing ----------------------------------------------------------------------
def _rerun(ctx, x, grad):
    """ctx.function run again on a copy of x that needs a gradient, and backprop: x's gradient."""
    x = x.detach().requires_grad_()
    with torch.enable_grad():
        out = ctx.function(x)
    out.backward(grad)
    return x.grad


class WithForkRng(torch.autograd.Function):
    """The solution's shape: fork_rng puts the surrounding state back."""

    @staticmethod
    def forward(ctx, function, x):
        ctx.function, ctx.state = function, torch.get_rng_state()
        ctx.save_for_backward(x)
        with torch.no_grad():
            return function(x)

    @staticmethod
    def backward(ctx, grad):
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.state)
            return None, _rerun(ctx, ctx.saved_tensors[0], grad)


class WithStateSwapped(torch.autograd.Function):
    """No fork_rng: the surrounding state noted by hand and set back; the input kept on ctx and
    the input's gradient from torch.autograd.grad, the parameters' accumulated by a second call."""

    @staticmethod
    def forward(ctx, function, x):
        ctx.function, ctx.state, ctx.x = function, torch.get_rng_state(), x.detach()
        with torch.no_grad():
            return function(x)

    @staticmethod
    def backward(ctx, grad):
        surrounding = torch.get_rng_state()
        torch.set_rng_state(ctx.state)
        x = ctx.x.requires_grad_()
        with torch.enable_grad():
            out = ctx.function(x)
        torch.set_rng_state(surrounding)
        parameters = [p for p in ctx.function.parameters()]
        grads = torch.autograd.grad(out, [x, *parameters], grad)
        for parameter, g in zip(parameters, grads[1:]):
            parameter.grad = g if parameter.grad is None else parameter.grad + g
        return None, grads[0]


class RngNotRestored(WithForkRng):
    @staticmethod
    def backward(ctx, grad):
        return None, _rerun(ctx, ctx.saved_tensors[0], grad)


class RngLeftMoved(WithForkRng):
    """The state set for the recompute and never put back."""

    @staticmethod
    def backward(ctx, grad):
        torch.set_rng_state(ctx.state)
        return None, _rerun(ctx, ctx.saved_tensors[0], grad)


class ForwardWithGrad(WithForkRng):
    """The forward run with grad enabled and its graph kept for backward: no recompute, and every
    activation kept, as without checkpointing."""

    @staticmethod
    def forward(ctx, function, x):
        ctx.x = x.detach().requires_grad_()
        with torch.enable_grad():
            ctx.out = function(ctx.x)
        return ctx.out.detach()

    @staticmethod
    def backward(ctx, grad):
        ctx.out.backward(grad)
        return None, ctx.x.grad


class SavingEverything(WithForkRng):
    """The activations kept (save_for_backward of every layer's output), and recomputed anyway."""

    @staticmethod
    def forward(ctx, function, x):
        ctx.function, ctx.state = function, torch.get_rng_state()
        outputs, h = [], x
        with torch.no_grad():
            for layer in function:
                h = layer(h)
                outputs.append(h)
        ctx.save_for_backward(x, *outputs)
        return h


class InputsDetached(WithForkRng):
    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(ctx.state)
            with torch.enable_grad():
                out = ctx.function(x.detach())
        out.backward(grad)
        return None, None


class TorchsCheckpoint:
    @staticmethod
    def apply(function, x):
        return torch.utils.checkpoint.checkpoint(function, x, use_reentrant=False)


class CoursesCheckpoint:
    apply = course_checkpointing.Checkpoint.apply


class TorchsCheckpointFunctionInside(torch.autograd.Function):
    """A Function of one's own whose forward and backward are torch's reentrant CheckpointFunction's."""

    @staticmethod
    def forward(ctx, function, *inputs):
        return torch.utils.checkpoint.CheckpointFunction.forward(ctx, function, True, *inputs)

    @staticmethod
    def backward(ctx, *gradients):
        return (None, *torch.utils.checkpoint.CheckpointFunction.backward(ctx, *gradients)[2:])


# -- exercise 2: mixed-precision FSDP -----------------------------------------------------------------
def _cast_inputs(module, args):
    return tuple(a.to(torch.bfloat16) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


class Mixed(FSDPUnit):
    """The solution's shape, written out: the variants below change one thing each."""

    def __init__(self, module, next_unit=None):
        super().__init__(module, next_unit)
        module.register_forward_pre_hook(_cast_inputs)

    def unshard(self, async_op=False):
        return all_gather_flat(self.allocate_full(torch.bfloat16), self.shard.detach().bfloat16(),
                               async_op=async_op)

    def reduce(self, flat_gradient):
        gradient = torch.empty(self.shard.numel(), dtype=torch.float32)
        reduce_scatter_flat(gradient, flat_gradient.float())
        return gradient

    def post_backward(self):
        gradient = self.reduce(self.flat_gradient()).div_(dist.get_world_size()).to(self.shard.dtype)
        self.shard.grad = gradient if self.shard.grad is None else self.shard.grad + gradient
        self.reshard()


class MixedWithInputCastInForward(FSDPUnit):
    """A wholly other shape: the cast of the inputs in pre_forward's hook replaced by a wrapper of
    the module's forward, the gather into a buffer of its own, the average taken before the sum."""

    def __init__(self, module, next_unit=None):
        super().__init__(module, next_unit)
        forward = module.forward
        module.forward = lambda x: forward(x.to(torch.bfloat16))

    def unshard(self, async_op=False):
        if self.full is None:
            self.full = torch.empty(self.shard.numel() * dist.get_world_size(), dtype=torch.bfloat16)
        full = self.allocate_full()
        return all_gather_flat(full, self.shard.detach().to(full.dtype), async_op=async_op)

    def post_backward(self):
        flat = self.flat_gradient().to(torch.float32) / dist.get_world_size()
        gradient = torch.empty_like(self.shard)
        reduce_scatter_flat(gradient, flat)
        self.shard.grad = gradient if self.shard.grad is None else self.shard.grad + gradient
        self.reshard()


class MasterInBf16(Mixed):
    def __init__(self, module, next_unit=None):
        super().__init__(module, next_unit)
        self.shard = nn.Parameter(self.shard.detach().bfloat16())


class ReducedInBf16(Mixed):
    def reduce(self, flat_gradient):
        gradient = torch.empty(self.shard.numel(), dtype=torch.bfloat16)
        reduce_scatter_flat(gradient, flat_gradient)
        return gradient.float()


class ComputeInFp32(Mixed):
    def __init__(self, module, next_unit=None):
        FSDPUnit.__init__(self, module, next_unit)

    def unshard(self, async_op=False):
        return all_gather_flat(self.allocate_full(), self.shard.detach(), async_op=async_op)


class GradientLeftInBf16(Mixed):
    """The gradient reduced in fp32 and cast back down before it reaches the shard."""

    def post_backward(self):
        gradient = self.reduce(self.flat_gradient()).div_(dist.get_world_size()).bfloat16()
        self.shard.grad = gradient if self.shard.grad is None else self.shard.grad + gradient
        self.reshard()


class CastOnce(Mixed):
    """The bf16 copy made once, in __init__, and gathered from then on: the steps never reach it."""

    def __init__(self, module, next_unit=None):
        super().__init__(module, next_unit)
        self.low_precision = self.shard.detach().bfloat16()

    def unshard(self, async_op=False):
        return all_gather_flat(self.allocate_full(torch.bfloat16), self.low_precision, async_op=async_op)


class CoursesUnit(course_mixed.MixedPrecisionUnit):
    pass


class BorrowingTheCoursesMethods(Mixed):
    """Its own class, the course's unshard and post_backward assigned into it."""
    unshard = course_mixed.MixedPrecisionUnit.unshard
    post_backward = course_mixed.MixedPrecisionUnit.post_backward
    param_dtype, reduce_dtype = torch.bfloat16, torch.float32


ALTERNATIVES = {
    lesson19.check_checkpoint: [
        answer("fork_rng, one input", WithForkRng),
        answer("the random state swapped by hand, autograd.grad", WithStateSwapped),
    ],
    lesson19.check_mixed_precision_unit: [
        answer("the solution's shape, a reduce method", Mixed),
        answer("a wrapped forward, averaged before the sum", MixedWithInputCastInForward),
    ],
}

WRONG_ANSWERS = {
    lesson19.check_checkpoint: [
        wrong_answer("the recompute runs dropout with another random state", RngNotRestored),
        wrong_answer("the random state set for the recompute and left there", RngLeftMoved),
        wrong_answer("the forward run with grad enabled", ForwardWithGrad),
        wrong_answer("every activation saved anyway", SavingEverything),
        wrong_answer("the inputs detached: no gradient reaches them", InputsDetached),
        wrong_answer("torch.utils.checkpoint in place of your own", TorchsCheckpoint),
        wrong_answer("the course's Checkpoint in place of your own", CoursesCheckpoint),
        wrong_answer("torch's CheckpointFunction inside a Function of your own", TorchsCheckpointFunctionInside),
    ],
    lesson19.check_mixed_precision_unit: [
        wrong_answer("master weights kept in bf16", MasterInBf16),
        wrong_answer("gradients reduce-scattered in bf16", ReducedInBf16),
        wrong_answer("the compute left in fp32: no cast", ComputeInFp32),
        wrong_answer("the gradient cast back down to bf16", GradientLeftInBf16),
        wrong_answer("the bf16 copy made once and kept", CastOnce),
        wrong_answer("the course's MixedPrecisionUnit", CoursesUnit),
        wrong_answer("the course's unshard and post_backward in a class of its own", BorrowingTheCoursesMethods),
    ],
}
