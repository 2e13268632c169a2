"""Two backward passes written the long way, for learning: LayerNorm through each of
its intermediates (as "Becoming a backprop ninja" does BatchNorm), and softmax
through its Jacobian, formed. Each computes what the fused form in ``tinyvit/nn``
computes (``tests/test_learn.py`` holds them equal); the workbook's exercises 8 and
10 ask for them, and print them as their solutions.

Shapes: M rows (the product of the leading axes), D features.
"""

from ..backend import xp
from ..nn.layers import LayerNorm


class LayerNormSteps(LayerNorm):
    """LayerNorm computed one named step at a time, each step's value kept:

        mean = mean(x)              (..., 1)
        xmu  = x - mean             (..., D)
        var  = mean(xmu^2)          (..., 1)
        rstd = (var + eps)^(-1/2)   (..., 1)
        xhat = xmu * rstd           (..., D)
        y    = gamma * xhat + beta  (..., D)

    Its backward walks the steps in reverse and keeps the gradient of each
    intermediate in ``self.intermediate_grads``, by name."""

    def forward(self, x):
        mean = x.mean(axis=-1, keepdims=True)  # (..., 1)
        xmu = x - mean  # (..., D)
        var = (xmu * xmu).mean(axis=-1, keepdims=True)  # (..., 1)
        rstd = (var + self.eps) ** -0.5  # (..., 1)
        xhat = xmu * rstd  # (..., D)
        self.cache = (xmu, var, rstd, xhat)
        return self.weight.data * xhat + self.bias.data

    def backward(self, dout):
        """Each step's backward, the last step first; a value used twice (xmu, in var
        and in xhat; x, in xmu and in mean) collects the gradients of both uses."""
        xmu, var, rstd, xhat = self._take_cache()
        D = xmu.shape[-1]
        rows = (-1, D)
        # y = gamma * xhat + beta
        self.weight.grad += (dout * xhat).reshape(rows).sum(axis=0)  # (D,)
        self.bias.grad += dout.reshape(rows).sum(axis=0)  # (D,)
        dxhat = dout * self.weight.data  # (..., D)
        # xhat = xmu * rstd
        drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)  # (..., 1)
        dxmu = dxhat * rstd  # (..., D), the first use of xmu
        # rstd = (var + eps)^(-1/2)
        dvar = -0.5 * (var + self.eps) ** -1.5 * drstd  # (..., 1)
        # var = mean(xmu^2)
        dxmu = dxmu + 2.0 * xmu / D * dvar  # (..., D), the second use added
        # xmu = x - mean
        dmean = -dxmu.sum(axis=-1, keepdims=True)  # (..., 1)
        dx = dxmu.copy()  # (..., D), the first use of x
        # mean = mean(x)
        dx += dmean / D  # the second use added
        self.intermediate_grads = {"xhat": dxhat, "rstd": drstd, "var": dvar, "xmu": dxmu,
                                   "mean": dmean}
        return dx


def softmax_jacobian_backward(A, dA):
    """The backward of A = softmax(S) over the last axis with its Jacobian formed:
    for each row, J = diag(A) - A^T A, (N, N) with dA_j/dS_k = J[j, k], and
    dS = dA J. Rows (..., N) -> Jacobians (..., N, N)."""
    eye = xp.eye(A.shape[-1], dtype=A.dtype)  # (N, N)
    J = A[..., :, None] * eye - A[..., :, None] * A[..., None, :]  # (..., N, N)
    return (dA[..., None, :] @ J)[..., 0, :]  # (..., N)
