"""Softmax cross-entropy, with label smoothing and soft (mixup/cutmix) targets."""

from ..backend import xp
from ..checks import check_array, check_distributions, check_label_range
from .functional import log_softmax
from .module import Module


class SoftmaxCrossEntropy(Module):
    """Mean over the batch of -sum_k t_k log softmax(z)_k.

    ``forward(logits, target)``: logits (B, K) float; target either integer labels
    (B,) in [0, K), turned into t = (1 - smoothing) onehot + smoothing / K (as
    PyTorch's ``label_smoothing``), or soft targets (B, K) whose rows sum to 1
    (mixup, cutmix), used as they are. Returns the loss as a scalar on the device.
    """

    def __init__(self, label_smoothing=0.0):
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = label_smoothing

    def targets(self, target, num_classes, dtype):
        """The (B, K) target distribution for integer labels or soft targets
        (``check_labels`` them first: out-of-range labels would index wrongly)."""
        if xp.issubdtype(target.dtype, xp.floating):
            return target.astype(dtype, copy=False)
        t = xp.full((target.shape[0], num_classes), self.label_smoothing / num_classes, dtype=dtype)
        t[xp.arange(target.shape[0]), target] += 1.0 - self.label_smoothing
        return t

    def forward(self, logits, target):
        self._check_logits(logits)
        B, K = logits.shape
        self.check_target(target, B, K)
        self.check_labels(target, K)
        log_probs = log_softmax(logits)  # (B, K)
        t = self.targets(target, K, logits.dtype)
        self.cache = (log_probs, t)
        return -(t * log_probs).sum() / B

    def backward(self, dout=1.0):
        """With p = softmax(z) and sum_k t_k = 1:
            L = -(1/B) sum_b sum_k t_bk (z_bk - log sum_j exp z_bj)
            dL/dz_bk = (1/B) (p_bk sum_j t_bj - t_bk) = (p_bk - t_bk) / B,
        the fused, stable backward (no division by p, no exp of large logits)."""
        log_probs, t = self._take_cache()
        return (xp.exp(log_probs) - t) * (dout / log_probs.shape[0])

    def _check_logits(self, logits):
        check_array(logits, "SoftmaxCrossEntropy", "logits, an array (B, K)")
        if logits.ndim != 2 or logits.shape[0] == 0:
            raise ValueError(
                f"SoftmaxCrossEntropy: expected logits (B, K) of one image or more, got shape "
                f"{logits.shape}"
            )
        if not xp.issubdtype(logits.dtype, xp.floating):
            raise ValueError(
                f"SoftmaxCrossEntropy: expected float logits, got dtype {logits.dtype}"
            )

    def check_target(self, target, batch, num_classes):
        """A clear ValueError unless ``target`` is ``batch`` integer labels or
        (batch, num_classes) soft targets (their shape and dtype: nothing is read)."""
        B, K = batch, num_classes
        check_array(target, "SoftmaxCrossEntropy", f"an array of {B} integer labels or of soft "
                                                   f"targets (B, K) = {(B, K)}")
        if xp.issubdtype(target.dtype, xp.floating):
            if target.shape != (B, K):
                labels = (f"; labels of shape ({B},) must be integers, got dtype {target.dtype}"
                          if target.shape == (B,) else "")
                raise ValueError(
                    f"SoftmaxCrossEntropy: soft targets must be (B, K) = {(B, K)}, "
                    f"got {target.shape}{labels}"
                )
            return
        if target.shape != (B,):
            raise ValueError(
                f"SoftmaxCrossEntropy: expected labels of shape ({B},), got {target.shape}"
            )
        if not xp.issubdtype(target.dtype, xp.integer):
            raise ValueError(
                f"SoftmaxCrossEntropy: expected integer labels, got dtype {target.dtype}"
            )

    def check_labels(self, target, num_classes):
        """A clear ValueError unless integer labels are in [0, num_classes), or soft
        targets are distributions (the backward's (p - t) / B is the gradient only where
        each row of t sums to 1): the one check that reads the targets' values (on a GPU,
        a wait for the device)."""
        if xp.issubdtype(target.dtype, xp.floating):
            check_distributions(target, "SoftmaxCrossEntropy: ")
        else:
            check_label_range(target, num_classes, "SoftmaxCrossEntropy: ")

