"""The fast tier on a GPU, the training step's last kernels: the softmax
cross-entropy's loss and gradient, and AdamW's whole update, one launch each."""


from ..backend import write, xp
from ..nn import loss, optim
from .compile import (
    launch_elementwise,
    launch_rows,
    scalars,
)
from .kernel import FastKernel


class SoftmaxCrossEntropy(FastKernel, loss.SoftmaxCrossEntropy):
    """The loss and its gradient in one launch (kernels/cross_entropy.cu); the
    cache is the gradient for dout = 1, which the backward scales by dout.

    It checks the target's shape and dtype but not the labels' values, which would
    wait for the device every step: a label outside [0, K) makes its row's loss
    and gradient NaN, which the trainer stops on (``Batches`` checks a data set's
    labels once, when it is loaded)."""

    def forward(self, logits, target):
        self._check_logits(logits)
        B, K = logits.shape
        self.check_target(target, B, K)
        z = xp.ascontiguousarray(logits)
        rows, grad = xp.empty(B, dtype=z.dtype), xp.empty_like(z)
        if xp.issubdtype(target.dtype, xp.floating):
            args = (z, xp.ascontiguousarray(target, dtype=z.dtype), rows, grad)
            function = "cross_entropy_soft"
        else:
            args = (z, xp.ascontiguousarray(target, dtype=xp.int64),
                    *scalars(z.dtype, self.label_smoothing), rows, grad)
            function = "cross_entropy_labels"
        launch_rows("cross_entropy", function, B, (*args, xp.int64(B), xp.int32(K)), z.dtype)
        self.cache = grad
        return rows.sum()

    def backward(self, dout=1.0):
        grad = self._take_cache()
        return grad if dout == 1.0 else grad * dout


class AdamW(FastKernel, optim.AdamW):
    """The reference AdamW's update in one launch (kernels/adamw.cu). What changes
    from step to step, the learning rate and the bias corrections, ``advance``
    writes into device memory, ``schedule``, where the kernel reads it: the update
    queues the same launch every step (a CUDA graph can replay it)."""

    schedule = None  # made at the first step (``accelerate`` swaps a built optimizer's class)

    def advance(self, lr=None):
        super().advance(lr)
        if self.schedule is None:
            self.schedule = xp.zeros(3, dtype=xp.float64)  # lr, bias1, bias2_sqrt
        t = self.t
        write(self.schedule, [self.step_lr, 1 - self.beta1**t, (1 - self.beta2**t) ** 0.5])

    def update(self):
        dtype = self.data.dtype
        args = (self.data, self.grad, self.m, self.v, self.decay, xp.int64(self.data.size),
                self.schedule, *scalars(dtype, self.beta1, 1 - self.beta1, self.beta2,
                                        1 - self.beta2, self.eps, self.weight_decay))
        launch_elementwise("adamw", "adamw_update", self.data.size, args, dtype)
