"""Set (b) of the repair search's measurement: mistakes people learning backprop make,
written by hand as whole backward passes, one mistake each.

Each entry is what a learner might write in the blank of one workbook exercise
(``python -m tinyvit.learn start DIR``): the whole backward (or function), in a
learner's own style and names, not tinyvit's, with exactly one mistake in it (one wrong
line, or two where the mistake genuinely spans two: a swapped pair of calls, the same
wrong axis in both means). ``right`` maps the wrong line(s), 1-based from the body's
first line of code, to the text that makes the body pass the exercise's check.

They are drawn from what learners get wrong (CS231n's assignments, "Becoming a backprop
ninja" and their discussions): a bias gradient averaged or summed over the wrong axis, a
transpose in the wrong place, a missing keepdims, a sign, a 1/N missing or extra, one of
two paths of a value used twice forgotten, the forward's output taken for its input,
the pre-dropout attention used where the dropped-out one was, the dropout mask or its
1/(1-p) forgotten or applied twice, the scale forgotten, heads split or merged in the
wrong order, layers walked in forward order, the skip connection dropped, ``=`` for
``+=``, a factor of 3 lost, an off-by-one around the class token, the pooling's
gradient spread, col2im overwriting instead of adding.

Every entry was checked (a script outside the repository): with the body in a fresh
workbook's blank, ``python -m tinyvit.learn check N DIR`` fails; with ``right``
substituted, it passes. Exercise 20 (training) has nothing to write.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mistake:
    exercise: str  # the exercise's name, as in tinyvit/learn/exercises.py ("linear")
    what: str  # the mistake, in a few words
    body: str  # the learner's whole blank, dedented
    right: dict  # {line of body (1-based): the corrected text of that line} that makes it pass


MISTAKES = (
    # -- 1 linear -------------------------------------------------------------------------
    Mistake("linear", "the bias gradient averaged over the rows", """
x2 = self._take_cache()
dout2 = dout.reshape(-1, self.out_features)
self.weight.grad += dout2.T @ x2
if self.bias is not None:
    self.bias.grad += dout2.mean(axis=0)
dx = dout2 @ self.weight.data
return dx.reshape(*dout.shape[:-1], self.in_features)
""", {5: "    self.bias.grad += dout2.sum(axis=0)"}),
    Mistake("linear", "dW as x^T dout: operands swapped, (in, out) for (out, in)", """
x2 = self._take_cache()  # (M, in)
N = x2.shape[0]
g = dout.reshape(N, -1)  # (M, out)
self.weight.grad += x2.T @ g
if self.bias is not None:
    self.bias.grad += g.sum(axis=0)
dx = g @ self.weight.data  # (M, in)
return dx.reshape(dout.shape[:-1] + (self.in_features,))
""", {4: "self.weight.grad += g.T @ x2"}),
    Mistake("linear", "= where += is needed: the weight gradient overwritten", """
x = self._take_cache()
dy = dout.reshape(-1, self.out_features)
self.weight.grad = dy.T @ x
if self.bias is not None:
    self.bias.grad += dy.sum(0)
dx = dy @ self.weight.data
return dx.reshape(*dout.shape[:-1], -1)
""", {3: "self.weight.grad += dy.T @ x"}),
    Mistake("linear", "the bias gradient summed over axis 0 of the unflattened dout", """
x2 = self._take_cache()
dout2 = dout.reshape(-1, self.out_features)
dW = dout2.T @ x2          # (out, in)
db = dout.sum(axis=0)      # sum over the batch
dx = dout2 @ self.weight.data
self.weight.grad += dW
if self.bias is not None:
    self.bias.grad += db
return dx.reshape(*dout.shape[:-1], self.in_features)
""", {4: "db = dout2.sum(axis=0)      # sum over the batch"}),
    Mistake("linear", "dx left as rows (M, in), not reshaped back", """
x2 = self._take_cache()
d = dout.reshape(-1, self.out_features)
self.weight.grad += d.T @ x2
if self.bias is not None:
    self.bias.grad += d.sum(axis=0)
dx = d @ self.weight.data
return dx
""", {7: "return dx.reshape(*dout.shape[:-1], self.in_features)"}),
    Mistake("linear", "dx multiplied by W^T, as the forward multiplied", """
x_rows = self._take_cache()
dy = dout.reshape(-1, self.out_features)  # (M, out)
self.weight.grad += dy.T @ x_rows
if self.bias is not None:
    self.bias.grad += dy.sum(axis=0)
dx_rows = dy @ self.weight.data.T
return dx_rows.reshape(*dout.shape[:-1], self.in_features)
""", {6: "dx_rows = dy @ self.weight.data"}),
    Mistake("linear", "no check that the layer has a bias: fails on one without", """
x2 = self._take_cache()
dout2 = dout.reshape(-1, self.out_features)
self.weight.grad += dout2.T @ x2
self.bias.grad += dout2.sum(axis=0)
dx = dout2 @ self.weight.data
return dx.reshape(*dout.shape[:-1], self.in_features)
""", {4: "if self.bias is not None: self.bias.grad += dout2.sum(axis=0)"}),
    # -- 2 tanh ---------------------------------------------------------------------------
    Mistake("tanh", "the local derivative returned, dout never multiplied in", """
y = self._take_cache()
dx = 1 - y ** 2
return dx
""", {2: "dx = dout * (1 - y ** 2)"}),
    Mistake("tanh", "the cached output taken for the input: tanh applied again", """
from tinyvit.backend import xp
x = self._take_cache()
dx = dout * (1 - xp.tanh(x) ** 2)
return dx
""", {3: "dx = dout * (1 - x ** 2)"}),
    Mistake("tanh", "operator precedence: dout * 1 - y^2", """
y = self._take_cache()
return dout * 1 - y**2
""", {2: "return dout * (1 - y**2)"}),
    Mistake("tanh", "dout scaled in place: the caller's gradient overwritten", """
y = self._take_cache()
dout *= 1 - y * y
return dout
""", {2: "dout = dout * (1 - y * y)"}),
    # -- 3 gelu (exact) -------------------------------------------------------------------
    Mistake("gelu", "the product rule forgotten: Phi(x) taken as the derivative", """
x = self._take_cache()
dydx = normal_cdf(x)   # d/dx [x * Phi(x)]
return dout * dydx
""", {2: "dydx = normal_cdf(x) + x * normal_pdf(x)   # d/dx [x * Phi(x)]"}),
    Mistake("gelu", "the x of x * phi(x) dropped", """
x = self._take_cache()
Phi = normal_cdf(x)
phi = normal_pdf(x)
grad = Phi + phi
return dout * grad
""", {4: "grad = Phi + x * phi"}),
    Mistake("gelu", "the density written by hand without the 1/2 in the exponent", """
x = self._take_cache()
Phi = normal_cdf(x)
phi = xp.exp(-x ** 2) / (2 * xp.pi) ** 0.5   # standard normal density
dx = dout * (Phi + x * phi)
return dx
""", {3: "phi = xp.exp(-x ** 2 / 2) / (2 * xp.pi) ** 0.5   # standard normal density"}),
    # -- 4 gelu_tanh ----------------------------------------------------------------------
    Mistake("gelu_tanh", "the 3 of d(x^3)/dx forgotten", """
x = self._take_cache()
inner = TANH_C * (x + TANH_A * x ** 3)
t = xp.tanh(inner)
dinner = TANH_C * (1 + TANH_A * x ** 2)
dydx = 0.5 * (1 + t) + 0.5 * x * (1 - t ** 2) * dinner
return dout * dydx
""", {4: "dinner = TANH_C * (1 + 3 * TANH_A * x ** 2)"}),
    Mistake("gelu_tanh", "the chain rule stopped at tanh: du/dx missing", """
x = self._take_cache()
u = TANH_C * (x + TANH_A * x**3)
t = xp.tanh(u)
dx = dout * (0.5 * (1 + t) + 0.5 * x * (1 - t**2))
return dx
""", {4: "dx = dout * (0.5 * (1 + t) + 0.5 * x * (1 - t**2) * TANH_C * (1 + 3 * TANH_A * x**2))"}),
    Mistake("gelu_tanh", "tanh's derivative as 1 - t, not 1 - t^2", """
x = self._take_cache()
t = xp.tanh(TANH_C * (x + TANH_A * x * x * x))
sech2 = 1 - t
du = TANH_C * (1 + 3 * TANH_A * x * x)
return dout * 0.5 * (1 + t + x * sech2 * du)
""", {3: "sech2 = 1 - t * t"}),
    Mistake("gelu_tanh", "the exact form's derivative used for the tanh form", """
x = self._take_cache()
# y' = Phi(x) + x phi(x), as for the exact GELU
dydx = normal_cdf(x) + x * normal_pdf(x)
return dout * dydx
""", {3: "dydx = 0.5 * (1 + xp.tanh(TANH_C * (x + TANH_A * x**3))) + 0.5 * x * (1 - xp.tanh(TANH_C "
         "* (x + TANH_A * x**3)) ** 2) * TANH_C * (1 + 3 * TANH_A * x**2)"}),
    # -- 5 dropout ------------------------------------------------------------------------
    Mistake("dropout", "the mask turned back into 0/1: the 1/(1-p) lost", """
mask = self._take_cache()
keep = mask != 0
dx = dout * keep
return dx
""", {3: "dx = dout * mask"}),
    Mistake("dropout", "the 1/(1-p) applied a second time", """
mask = self._take_cache()
dx = dout * mask / (1 - self.p)
return dx
""", {2: "dx = dout * mask"}),
    Mistake("dropout", "a new mask drawn in the backward", """
mask = self._take_cache()
if isinstance(mask, float):
    return dout
keep = self.rng.random(dout.shape, dtype=dout.dtype) >= self.p
return dout * keep / (1.0 - self.p)
""", {4: "keep = mask > 0"}),
    Mistake("dropout", "dout multiplied in place: the caller's gradient overwritten", """
mask = self._take_cache()
dout *= mask
return dout
""", {2: "dout = dout * mask"}),
    # -- 6 residual -----------------------------------------------------------------------
    Mistake("residual", "the skip connection forgotten", """
dbranch = self.branch.backward(dout)
dx = dbranch
return dx
""", {2: "dx = dout + dbranch"}),
    Mistake("residual", "the branch's gradient computed but not added", """
# the skip passes dout straight through; the branch needs its backward too
dbranch = self.branch.backward(dout)
return dout
""", {3: "return dout + dbranch"}),
    Mistake("residual", "dx aliases dout: the in-place += writes into the caller's gradient", """
dx = dout                          # the skip
dx += self.branch.backward(dout)   # and the branch
return dx
""", {1: "dx = dout.copy()                   # the skip"}),
    # -- 7 patchify -----------------------------------------------------------------------
    Mistake("patchify", "the forward's permutation reused as its own inverse", """
B, C, H, W = self._take_cache()
P = self.patch_size
gh, gw = H // P, W // P
d = dout.reshape(B, gh, gw, C, P, P)
d = d.transpose(0, 2, 4, 1, 3, 5)  # undo the forward's transpose
return d.reshape(B, C, H, W)
""", {5: "d = d.transpose(0, 3, 1, 4, 2, 5)  # undo the forward's transpose"}),
    Mistake("patchify", "the patch grid's rows and columns swapped", """
B, C, H, W = self._take_cache()
P = self.patch_size
gh, gw = H // P, W // P
dx = dout.reshape(B, gw, gh, C, P, P)
dx = dx.transpose(0, 3, 1, 4, 2, 5)
dx = dx.reshape(B, C, H, W)
return dx
""", {4: "dx = dout.reshape(B, gh, gw, C, P, P)"}),
    Mistake("patchify", "the grid axes not interleaved with the pixel axes", """
B, C, H, W = self._take_cache()
P = self.patch_size
n_h, n_w = H // P, W // P
grad = dout.reshape(B, n_h, n_w, C, P, P)
grad = grad.transpose(0, 3, 1, 2, 4, 5)  # (B, C, n_h, n_w, P, P)
return grad.reshape(B, C, H, W)
""", {5: "grad = grad.transpose(0, 3, 1, 4, 2, 5)  # (B, C, n_h, P, n_w, P)"}),
    # -- 8 layernorm_steps ----------------------------------------------------------------
    Mistake("layernorm_steps", "drstd summed without keepdims", """
xmu, var, rstd, xhat = self._take_cache()
D = xmu.shape[-1]
dy = dout.reshape(-1, D)
# y = gamma * xhat + beta
self.weight.grad += (dy * xhat.reshape(-1, D)).sum(axis=0)
self.bias.grad += dy.sum(axis=0)
dxhat = dout * self.weight.data
# xhat = xmu * rstd
drstd = (dxhat * xmu).sum(axis=-1)
dxmu = dxhat * rstd
# rstd = (var + eps) ** -0.5
dvar = -0.5 * (var + self.eps) ** -1.5 * drstd
# var = mean(xmu ** 2)
dxmu += 2 * xmu * dvar / D
# xmu = x - mean
dmean = -dxmu.sum(axis=-1, keepdims=True)
dx = dxmu.copy()
# mean = mean(x)
dx += dmean / D
self.intermediate_grads = {"xhat": dxhat, "rstd": drstd, "var": dvar, "xmu": dxmu, "mean": dmean}
return dx
""", {9: "drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)"}),
    Mistake("layernorm_steps", "xmu's second path, through var, computed but not added", """
xmu, var, rstd, xhat = self._take_cache()
N = xmu.shape[-1]
rows = dout.reshape(-1, N)
self.weight.grad += (rows * xhat.reshape(-1, N)).sum(0)
self.bias.grad += rows.sum(0)
dxhat = dout * self.weight.data
drstd = (dxhat * xmu).sum(-1, keepdims=True)
dxmu_a = dxhat * rstd                           # through xhat
dvar = -0.5 * drstd * (var + self.eps) ** -1.5
dxmu_b = dvar * 2 * xmu / N                     # through var
dxmu = dxmu_a
dmean = -dxmu.sum(-1, keepdims=True)
dx = dxmu + dmean / N
self.intermediate_grads = dict(xhat=dxhat, rstd=drstd, var=dvar, xmu=dxmu, mean=dmean)
return dx
""", {11: "dxmu = dxmu_a + dxmu_b"}),
    Mistake("layernorm_steps", "x's second path, through the mean, forgotten", """
xmu, var, rstd, xhat = self._take_cache()
D = xmu.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
dxhat = dout * self.weight.data
drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)
dvar = drstd * -0.5 * (var + self.eps) ** -1.5
dxmu = dxhat * rstd + dvar * 2.0 * xmu / D
dmean = -dxmu.sum(axis=-1, keepdims=True)
dx = dxmu
self.intermediate_grads = {"xhat": dxhat, "rstd": drstd, "var": dvar, "xmu": dxmu, "mean": dmean}
return dx
""", {10: "dx = dxmu + dmean / D"}),
    Mistake("layernorm_steps", "the 1/D of the variance's mean forgotten", """
xmu, var, rstd, xhat = self._take_cache()
D = xmu.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
dxhat = dout * self.weight.data
drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)
dvar = -0.5 * (var + self.eps) ** -1.5 * drstd
dxmu = dxhat * rstd
dxmu = dxmu + 2 * xmu * dvar
dmean = -dxmu.sum(axis=-1, keepdims=True)
dx = dxmu + dmean / D
self.intermediate_grads = {"xhat": dxhat, "rstd": drstd, "var": dvar, "xmu": dxmu, "mean": dmean}
return dx
""", {9: "dxmu = dxmu + 2 * xmu * dvar / D"}),
    Mistake("layernorm_steps", "the sign of d(var^-1/2) lost", """
xmu, var, rstd, xhat = self._take_cache()
D = xmu.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
dxhat = dout * self.weight.data
drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)
dvar = 0.5 * (var + self.eps) ** -1.5 * drstd
dxmu = dxhat * rstd + 2 * xmu * dvar / D
dmean = -dxmu.sum(axis=-1, keepdims=True)
dx = dxmu + dmean / D
self.intermediate_grads = {"xhat": dxhat, "rstd": drstd, "var": dvar, "xmu": dxmu, "mean": dmean}
return dx
""", {7: "dvar = -0.5 * (var + self.eps) ** -1.5 * drstd"}),
    Mistake("layernorm_steps", "dx aliases dxmu: the in-place += changes dxmu too", """
xmu, var, rstd, xhat = self._take_cache()
D = xmu.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
dxhat = dout * self.weight.data
drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)
dvar = -0.5 * (var + self.eps) ** -1.5 * drstd
dxmu = dxhat * rstd
dxmu += 2 * xmu * dvar / D
dmean = -dxmu.sum(axis=-1, keepdims=True)
dx = dxmu
dx += dmean / D
self.intermediate_grads = {"xhat": dxhat, "rstd": drstd, "var": dvar, "xmu": dxmu, "mean": dmean}
return dx
""", {11: "dx = dxmu.copy()"}),
    Mistake("layernorm_steps", "eps left out of the derivative of (var + eps)^-1/2", """
xmu, var, rstd, xhat = self._take_cache()
D = xmu.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
dxhat = dout * self.weight.data
drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)
dvar = -0.5 * var ** -1.5 * drstd       # d/dvar of var^(-1/2)
dxmu = dxhat * rstd + 2 * xmu * dvar / D
dmean = -dxmu.sum(axis=-1, keepdims=True)
dx = dxmu + dmean / D
self.intermediate_grads = {"xhat": dxhat, "rstd": drstd, "var": dvar, "xmu": dxmu, "mean": dmean}
return dx
""", {7: "dvar = -0.5 * (var + self.eps) ** -1.5 * drstd       # d/dvar of (var + eps)^(-1/2)"}),
    # -- 9 layernorm (fused) --------------------------------------------------------------
    Mistake("layernorm", "gamma left out of the gradient at xhat", """
xhat, rstd = self._take_cache()
D = xhat.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
g = dout
mean_g = g.mean(axis=-1, keepdims=True)
mean_gx = (g * xhat).mean(axis=-1, keepdims=True)
dx = rstd * (g - mean_g - xhat * mean_gx)
return dx
""", {5: "g = dout * self.weight.data"}),
    Mistake("layernorm", "the means taken over the rows (axis 0), not the features", """
xhat, rstd = self._take_cache()
D = xhat.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
g = dout * self.weight.data
mean_g = g.mean(axis=0, keepdims=True)
mean_gx = (g * xhat).mean(axis=0, keepdims=True)
dx = rstd * (g - mean_g - xhat * mean_gx)
return dx
""", {6: "mean_g = g.mean(axis=-1, keepdims=True)",
      7: "mean_gx = (g * xhat).mean(axis=-1, keepdims=True)"}),
    Mistake("layernorm", "the path through rstd (the variance) forgotten", """
xhat, rstd = self._take_cache()
feat = xhat.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, feat).sum(axis=0)
self.bias.grad += dout.reshape(-1, feat).sum(axis=0)
dxhat = dout * self.weight.data
dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True))
return dx
""", {6: "dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True) "
         "- xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))"}),
    Mistake("layernorm", "divided by rstd where it multiplies", """
xhat, rstd = self._take_cache()
D = xhat.shape[-1]
self.weight.grad += (dout * xhat).reshape(-1, D).sum(axis=0)
self.bias.grad += dout.reshape(-1, D).sum(axis=0)
g = dout * self.weight.data
a = g.mean(axis=-1, keepdims=True)
b = (g * xhat).mean(axis=-1, keepdims=True)
dx = (g - a - xhat * b) / rstd
return dx
""", {8: "dx = (g - a - xhat * b) * rstd"}),
    Mistake("layernorm", "dgamma copied from dbeta: xhat left out", """
xhat, rstd = self._take_cache()
D = xhat.shape[-1]
dbeta = dout.reshape(-1, D).sum(axis=0)
dgamma = dout.reshape(-1, D).sum(axis=0)
self.weight.grad += dgamma
self.bias.grad += dbeta
g = dout * self.weight.data
dx = rstd * (g - g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))
return dx
""", {4: "dgamma = (dout * xhat).reshape(-1, D).sum(axis=0)"}),
    # -- 10 softmax_jacobian --------------------------------------------------------------
    Mistake("softmax_jacobian", "A^T A formed as an inner product, not the outer one", """
N = A.shape[-1]
diag = A[..., :, None] * xp.eye(N, dtype=A.dtype)  # (..., N, N)
outer = A[..., None, :] @ A[..., :, None]      # (..., N, N)
J = diag - outer
dS = xp.einsum("...j,...jk->...k", dA, J)
return dS
""", {3: "outer = A[..., :, None] @ A[..., None, :]      # (..., N, N)"}),
    Mistake("softmax_jacobian", "J[j, k] = delta_jk - A_k: the A_j factor lost", """
N = A.shape[-1]
I = xp.eye(N, dtype=A.dtype)
# J[j, k] = dA_j / dS_k
J = I - A[..., None, :]
dS = (dA[..., None, :] @ J)[..., 0, :]
return dS
""", {4: "J = A[..., :, None] * (I - A[..., None, :])"}),
    Mistake("softmax_jacobian", "dA @ J with dA not made a row: its batch axes broadcast wrongly",
            """
n = A.shape[-1]
J = A[..., :, None] * xp.eye(n, dtype=A.dtype) - A[..., :, None] * A[..., None, :]
dS = dA @ J
return dS
""", {3: "dS = (dA[..., None, :] @ J)[..., 0, :]"}),
    Mistake("softmax_jacobian", "the Jacobian's sign flipped: A A^T - diag(A)", """
N = A.shape[-1]
Ai = A[..., :, None]   # (..., N, 1)
Ak = A[..., None, :]   # (..., 1, N)
J = Ai * Ak - Ai * xp.eye(N, dtype=A.dtype)
return xp.einsum("...j,...jk->...k", dA, J)
""", {4: "J = Ai * xp.eye(N, dtype=A.dtype) - Ai * Ak"}),
    # -- 11 softmax (fused) ---------------------------------------------------------------
    Mistake("softmax", "the elementwise A (1 - A), as if softmax were a sigmoid", """
# dA_j/dS_j = A_j (1 - A_j)
dS = dA * A * (1 - A)
return dS
""", {2: "dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))"}),
    Mistake("softmax", "the row sum without keepdims", """
s = (dA * A).sum(axis=-1)
dS = A * (dA - s)
return dS
""", {1: "s = (dA * A).sum(axis=-1, keepdims=True)"}),
    Mistake("softmax", "A left out of the row sum", """
total = dA.sum(axis=-1, keepdims=True)
return A * (dA - total)
""", {1: "total = (dA * A).sum(axis=-1, keepdims=True)"}),
    Mistake("softmax", "A multiplies dA alone, not the difference", """
dot = xp.sum(dA * A, axis=-1, keepdims=True)   # (..., 1)
dS = A * dA - dot
return dS
""", {2: "dS = A * (dA - dot)"}),
    # -- 12 attention_core ----------------------------------------------------------------
    Mistake("attention_core", "dv from A, the attention before dropout", """
q, k, v, A, Ad = self._take_cache()
# ctx = Ad @ v
dAd = dctx @ v.swapaxes(-1, -2)        # (B, NH, Q, N)
dv = A.swapaxes(-1, -2) @ dctx         # (B, NH, N, Dh)
# Ad = dropout(A)
dA = self.attn_drop.backward(dAd)
# A = softmax(S)
dS = softmax_backward(A, dA)
# S = q @ k^T * scale
dq = (dS @ k) * self.scale
dk = (dS.swapaxes(-1, -2) @ q) * self.scale
return dq, dk, dv
""", {4: "dv = Ad.swapaxes(-1, -2) @ dctx         # (B, NH, N, Dh)"}),
    Mistake("attention_core", "the attention dropout's backward skipped", """
q, k, v, A, Ad = self._take_cache()
dAd = dctx @ v.swapaxes(-1, -2)        # (B, NH, Q, N)
dv = Ad.swapaxes(-1, -2) @ dctx        # (B, NH, N, Dh)
dA = dAd                               # dropout only rescales
dS = softmax_backward(A, dA)
dq = (dS @ k) * self.scale
dk = (dS.swapaxes(-1, -2) @ q) * self.scale
return dq, dk, dv
""", {4: "dA = self.attn_drop.backward(dAd)"}),
    Mistake("attention_core", "the scale forgotten on dq", """
q, k, v, A, Ad = self._take_cache()
kT = k.transpose(0, 1, 3, 2)
vT = v.transpose(0, 1, 3, 2)
dAd = dctx @ vT
dv = Ad.transpose(0, 1, 3, 2) @ dctx
dA = self.attn_drop.backward(dAd)
dS = softmax_backward(A, dA)
dq = dS @ k
dk = dS.transpose(0, 1, 3, 2) @ q * self.scale
return dq, dk, dv
""", {8: "dq = dS @ k * self.scale"}),
    Mistake("attention_core", "dk without transposing dS", """
q, k, v, A, Ad = self._take_cache()
dAd = dctx @ v.swapaxes(-1, -2)
dv = Ad.swapaxes(-1, -2) @ dctx
dA = self.attn_drop.backward(dAd)
dS = softmax_backward(A, dA)
dq = self.scale * (dS @ k)
dk = self.scale * (dS @ q)
return dq, dk, dv
""", {7: "dk = self.scale * (dS.swapaxes(-1, -2) @ q)"}),
    Mistake("attention_core", "divided by the scale, taken for sqrt(Dh)", """
q, k, v, A, Ad = self._take_cache()
dAd = dctx @ v.swapaxes(-1, -2)
dv = Ad.swapaxes(-1, -2) @ dctx
dA = self.attn_drop.backward(dAd)
dS = softmax_backward(A, dA)
dq = dS @ k / self.scale
dk = dS.swapaxes(-1, -2) @ q / self.scale
return dq, dk, dv
""", {6: "dq = dS @ k * self.scale", 7: "dk = dS.swapaxes(-1, -2) @ q * self.scale"}),
    Mistake("attention_core", "softmax's backward given the dropped-out attention", """
q, k, v, A, Ad = self._take_cache()
dAd = dctx @ v.swapaxes(-1, -2)
dv = Ad.swapaxes(-1, -2) @ dctx
dA = self.attn_drop.backward(dAd)
dS = softmax_backward(Ad, dA)
dq = dS @ k * self.scale
dk = dS.swapaxes(-1, -2) @ q * self.scale
return dq, dk, dv
""", {5: "dS = softmax_backward(A, dA)"}),
    # -- 13 merge_heads -------------------------------------------------------------------
    Mistake("merge_heads", "reshaped straight to (B, NH, N, Dh), no transpose", """
B, N, D = dctx.shape
Dh = D // num_heads
dheads = dctx.reshape(B, num_heads, N, Dh)   # (B, NH, N, Dh)
return dheads
""", {3: "dheads = dctx.reshape(B, N, num_heads, Dh).transpose(0, 2, 1, 3)   # (B, NH, N, Dh)"}),
    Mistake("merge_heads", "the heads taken as the minor axis: (Dh, NH) for (NH, Dh)", """
B, N, D = dctx.shape
head_dim = D // num_heads
x = dctx.reshape(B, N, head_dim, num_heads).transpose(0, 3, 1, 2)
return x
""", {3: "x = dctx.reshape(B, N, num_heads, head_dim).transpose(0, 2, 1, 3)"}),
    Mistake("merge_heads", "undone in the forward's order: transpose, then reshape", """
B, N, D = dctx.shape
Dh = D // num_heads
# merge was transpose then reshape, so: transpose back, reshape back
d = dctx.transpose(0, 2, 1).reshape(B, num_heads, N, Dh)
return d
""", {4: "d = dctx.reshape(B, N, num_heads, Dh).transpose(0, 2, 1, 3)"}),
    # -- 14 split_heads -------------------------------------------------------------------
    Mistake("split_heads", "the heads put outside q, k, v in the transpose", """
B, NH, N, Dh = dq.shape
g = xp.stack([dq, dk, dv])          # (3, B, NH, N, Dh)
g = g.transpose(1, 3, 2, 0, 4)      # (B, N, NH, 3, Dh)
return g.reshape(B, N, 3 * NH * Dh)
""", {3: "g = g.transpose(1, 3, 0, 2, 4)      # (B, N, 3, NH, Dh)"}),
    Mistake("split_heads", "each of dq, dk, dv reshaped to (B, N, D) without moving the heads", """
B, NH, N, Dh = dq.shape
merged = [g.reshape(B, N, NH * Dh) for g in (dq, dk, dv)]
return xp.concatenate(merged, axis=-1)
""", {2: "merged = [g.transpose(0, 2, 1, 3).reshape(B, N, NH * Dh) for g in (dq, dk, dv)]"}),
    Mistake("split_heads", "q, k, v concatenated within each head", """
B, NH, N, Dh = dq.shape
d = xp.concatenate([dq, dk, dv], axis=-1)   # (B, NH, N, 3*Dh)
d = d.transpose(0, 2, 1, 3)                 # (B, N, NH, 3*Dh)
return d.reshape(B, N, 3 * NH * Dh)
""", {2: "d = xp.stack([dq, dk, dv], axis=1)   # (B, 3, NH, N, Dh)",
      3: "d = d.transpose(0, 3, 1, 2, 4)       # (B, N, 3, NH, Dh)"}),
    # -- 15 attention ---------------------------------------------------------------------
    Mistake("attention", "the output dropout's backward forgotten", """
d = self.proj.backward(dout)                     # (B, N, D)
dctx = split_heads_grad(d, self.num_heads)       # (B, NH, N, Dh)
dq, dk, dv = self.attend_backward(dctx)
dqkv = merge_qkv_grads(dq, dk, dv)               # (B, N, 3D)
return self.qkv.backward(dqkv)
""", {1: "d = self.proj.backward(self.proj_drop.backward(dout))   # (B, N, D)"}),
    Mistake("attention", "proj and proj_drop undone in the forward's order", """
g = self.proj.backward(dout)
g = self.proj_drop.backward(g)
g = split_heads_grad(g, self.num_heads)
dq, dk, dv = self.attend_backward(g)
g = merge_qkv_grads(dq, dk, dv)
dx = self.qkv.backward(g)
return dx
""", {1: "g = self.proj_drop.backward(dout)", 2: "g = self.proj.backward(g)"}),
    Mistake("attention", "the head dimension passed where the number of heads goes", """
dproj_in = self.proj.backward(self.proj_drop.backward(dout))
dctx = split_heads_grad(dproj_in, self.head_dim)
dq, dk, dv = self.attend_backward(dctx)
return self.qkv.backward(merge_qkv_grads(dq, dk, dv))
""", {2: "dctx = split_heads_grad(dproj_in, self.num_heads)"}),
    # -- 16 mlp ---------------------------------------------------------------------------
    Mistake("mlp", "the layers walked in the forward's order", """
d = dout
for layer in self.layers:
    d = layer.backward(d)
return d
""", {2: "for layer in reversed(self.layers):"}),
    Mistake("mlp", "every layer given dout, not the gradient of the layer after it", """
grad = dout
for layer in self.layers[::-1]:
    grad = layer.backward(dout)
return grad
""", {3: "    grad = layer.backward(grad)"}),
    Mistake("mlp", "the dropout after the GELU left out", """
d = self.drop2.backward(dout)
d = self.fc2.backward(d)
d = self.act.backward(d)
d = self.fc1.backward(d)
return d
""", {3: "d = self.act.backward(self.drop1.backward(d))"}),
    Mistake("mlp", "the last dropout, after fc2, left out", """
d = self.fc2.backward(dout)
d = self.drop1.backward(d)
d = self.act.backward(d)
return self.fc1.backward(d)
""", {1: "d = self.fc2.backward(self.drop2.backward(dout))"}),
    # -- 17 block -------------------------------------------------------------------------
    Mistake("block", "the residuals undone in the forward's order", """
d = self.attn_residual.backward(dout)
d = self.mlp_residual.backward(d)
return d
""", {1: "d = self.mlp_residual.backward(dout)", 2: "d = self.attn_residual.backward(d)"}),
    Mistake("block", "written out by hand, the attention's skip connection forgotten", """
# x1 = x + attn(norm1(x)); y = x1 + mlp(norm2(x1))
dx1 = dout + self.norm2.backward(self.mlp.backward(dout))
dx = self.norm1.backward(self.attn.backward(dx1))
return dx
""", {3: "dx = dx1 + self.norm1.backward(self.attn.backward(dx1))"}),
    Mistake("block", "the attention residual given dout, not the MLP residual's gradient", """
d_mid = self.mlp_residual.backward(dout)
d_in = self.attn_residual.backward(dout)
return d_in
""", {2: "d_in = self.attn_residual.backward(d_mid)"}),
    # -- 18 vit ---------------------------------------------------------------------------
    Mistake("vit", "mean pooling's gradient divided by N tokens, not the N - 1 patches", """
B, N, D = self._take_cache()
g = self.head.backward(dlogits)
if self.pre_logits is not None:
    g = self.pre_logits.backward(g)
dpooled = self.norm.backward(g)                     # (B, D)
dtok = xp.zeros((B, N, D), dtype=dpooled.dtype)
if self.config.pool == "cls":
    dtok[:, 0, :] = dpooled
else:
    dtok[:, 1:, :] = dpooled[:, None, :] / N  # mean over the tokens
for blk in reversed(self.blocks):
    dtok = blk.backward(dtok)
dtok = self.pos_drop.backward(dtok)
self.pos_embed.grad += dtok.sum(axis=0, keepdims=True)
self.cls_token.grad += dtok[:, :1, :].sum(axis=0, keepdims=True)
return self.patch_embed.backward(dtok[:, 1:, :])
""", {10: "    dtok[:, 1:, :] = dpooled[:, None, :] / (N - 1)  # mean over the patch tokens"}),
    Mistake("vit", "mean pooling's 1/(N - 1) forgotten", """
B, N, D = self._take_cache()
g = self.head.backward(dlogits)
if self.pre_logits is not None:
    g = self.pre_logits.backward(g)
dpooled = self.norm.backward(g)
dtok = xp.zeros((B, N, D), dtype=dpooled.dtype)
if self.config.pool == "cls":
    dtok[:, 0] = dpooled
else:
    dtok[:, 1:] = dpooled[:, None]  # every patch token was pooled
for blk in reversed(self.blocks):
    dtok = blk.backward(dtok)
dtok = self.pos_drop.backward(dtok)
self.pos_embed.grad += dtok.sum(axis=0, keepdims=True)
self.cls_token.grad += dtok[:, :1].sum(axis=0, keepdims=True)
return self.patch_embed.backward(dtok[:, 1:])
""", {10: "    dtok[:, 1:] = dpooled[:, None] / (N - 1)  # every patch token was pooled"}),
    Mistake("vit", "the blocks walked in the forward's order", """
B, N, D = self._take_cache()
d = self.head.backward(dlogits)
if self.pre_logits is not None:
    d = self.pre_logits.backward(d)
d = self.norm.backward(d)                    # (B, D)
dx = xp.zeros((B, N, D), dtype=d.dtype)
if self.config.pool == "cls":
    dx[:, 0, :] = d
else:
    dx[:, 1:, :] = d[:, None, :] / (N - 1)
for block in self.blocks:
    dx = block.backward(dx)
dx = self.pos_drop.backward(dx)
self.pos_embed.grad += dx.sum(axis=0, keepdims=True)
self.cls_token.grad += dx[:, 0:1, :].sum(axis=0, keepdims=True)
return self.patch_embed.backward(dx[:, 1:, :])
""", {11: "for block in reversed(self.blocks):"}),
    Mistake("vit", "the position embedding's gradient averaged over the batch", """
B, N, D = self._take_cache()
g = self.head.backward(dlogits)
if self.pre_logits is not None:
    g = self.pre_logits.backward(g)
dpooled = self.norm.backward(g)                     # (B, D)
dtok = xp.zeros((B, N, D), dtype=dpooled.dtype)
if self.config.pool == "cls":
    dtok[:, 0, :] = dpooled
else:
    dtok[:, 1:, :] = dpooled[:, None, :] / (N - 1)
for blk in reversed(self.blocks):
    dtok = blk.backward(dtok)
dtok = self.pos_drop.backward(dtok)
self.pos_embed.grad += dtok.mean(axis=0, keepdims=True)
self.cls_token.grad += dtok[:, :1, :].sum(axis=0, keepdims=True)
return self.patch_embed.backward(dtok[:, 1:, :])
""", {14: "self.pos_embed.grad += dtok.sum(axis=0, keepdims=True)"}),
    Mistake("vit", "the embedding dropout's backward skipped", """
B, N, D = self._take_cache()
g = self.head.backward(dlogits)
if self.pre_logits is not None:
    g = self.pre_logits.backward(g)
dpooled = self.norm.backward(g)
dtok = xp.zeros((B, N, D), dtype=dpooled.dtype)
if self.config.pool == "cls":
    dtok[:, 0, :] = dpooled
else:
    dtok[:, 1:, :] = dpooled[:, None, :] / (N - 1)
for blk in reversed(self.blocks):
    dtok = blk.backward(dtok)
demb = dtok      # x + pos_embed, then pos_drop
self.pos_embed.grad += demb.sum(axis=0, keepdims=True)
self.cls_token.grad += demb[:, :1, :].sum(axis=0, keepdims=True)
return self.patch_embed.backward(demb[:, 1:, :])
""", {13: "demb = self.pos_drop.backward(dtok)      # x + pos_embed, then pos_drop"}),
    Mistake("vit", "pos_embed's gradient taken before the embedding dropout's backward", """
B, N, D = self._take_cache()
g = self.head.backward(dlogits)
if self.pre_logits is not None:
    g = self.pre_logits.backward(g)
dpooled = self.norm.backward(g)
dtok = xp.zeros((B, N, D), dtype=dpooled.dtype)
if self.config.pool == "cls":
    dtok[:, 0, :] = dpooled
else:
    dtok[:, 1:, :] = dpooled[:, None, :] / (N - 1)
for blk in reversed(self.blocks):
    dtok = blk.backward(dtok)
self.pos_embed.grad += dtok.sum(axis=0, keepdims=True)
dtok = self.pos_drop.backward(dtok)
self.cls_token.grad += dtok[:, :1, :].sum(axis=0, keepdims=True)
return self.patch_embed.backward(dtok[:, 1:, :])
""", {13: "dtok = self.pos_drop.backward(dtok)",
      14: "self.pos_embed.grad += dtok.sum(axis=0, keepdims=True)"}),
    Mistake("vit", "off by one: the class token's row sent into the patch embedding", """
B, N, D = self._take_cache()
g = self.head.backward(dlogits)
if self.pre_logits is not None:
    g = self.pre_logits.backward(g)
dpooled = self.norm.backward(g)
dtok = xp.zeros((B, N, D), dtype=dpooled.dtype)
if self.config.pool == "cls":
    dtok[:, 0, :] = dpooled
else:
    dtok[:, 1:, :] = dpooled[:, None, :] / (N - 1)
for blk in reversed(self.blocks):
    dtok = blk.backward(dtok)
dtok = self.pos_drop.backward(dtok)
self.pos_embed.grad += dtok.sum(axis=0, keepdims=True)
self.cls_token.grad += dtok[:, :1, :].sum(axis=0, keepdims=True)
dpatches = dtok[:, :-1, :]   # the patch rows
return self.patch_embed.backward(dpatches)
""", {16: "dpatches = dtok[:, 1:, :]   # the patch rows"}),
    # -- 19 cross_entropy -----------------------------------------------------------------
    Mistake("cross_entropy", "the 1/B of the batch mean forgotten", """
log_probs, t = self._take_cache()
B = log_probs.shape[0]
probs = xp.exp(log_probs)
dlogits = probs - t
return dlogits * dout
""", {4: "dlogits = (probs - t) / B"}),
    Mistake("cross_entropy", "the sign flipped: t - p", """
log_probs, t = self._take_cache()
B = log_probs.shape[0]
probs = xp.exp(log_probs)
dlogits = (t - probs) / B
return dlogits * dout
""", {4: "dlogits = (probs - t) / B"}),
    Mistake("cross_entropy", "the log-probabilities taken for the probabilities", """
log_probs, t = self._take_cache()
B = log_probs.shape[0]
p = log_probs
return dout * (p - t) / B
""", {3: "p = xp.exp(log_probs)"}),
    Mistake("cross_entropy", "the upstream gradient dout ignored", """
logp, target = self._take_cache()
B = logp.shape[0]
dz = (xp.exp(logp) - target) / B
return dz
""", {4: "return dz * dout"}),
    Mistake("cross_entropy", "stopped at the log: -t/p, the softmax's Jacobian left out", """
log_probs, t = self._take_cache()
B = log_probs.shape[0]
probs = xp.exp(log_probs)
dlogits = -t / probs / B
return dlogits * dout
""", {4: "dlogits = (probs - t) / B"}),
    Mistake("cross_entropy", "divided by B*K, as if the loss were a mean over every entry", """
log_probs, t = self._take_cache()
p = xp.exp(log_probs)
dlogits = (p - t) / t.size
return dout * dlogits
""", {3: "dlogits = (p - t) / t.shape[0]"}),
    Mistake("cross_entropy", "hard labels assumed: p minus the one-hot of t's argmax", """
log_probs, t = self._take_cache()
B = log_probs.shape[0]
d = xp.exp(log_probs)
d[xp.arange(B), t.argmax(axis=1)] -= 1   # p - onehot(y)
return d * dout / B
""", {4: "d -= t   # p - t"}),
    # -- 21 col2im ------------------------------------------------------------------------
    Mistake("col2im", "= where += is needed: overlapping windows overwrite each other", """
kh, kw, Ho, Wo = dwindows.shape[-4:]
sh, sw = stride
for i in range(kh):
    for j in range(kw):
        dxpad[..., i:i + sh * Ho:sh, j:j + sw * Wo:sw] = dwindows[..., i, j, :, :]
return dxpad
""", {5: "        dxpad[..., i:i + sh * Ho:sh, j:j + sw * Wo:sw] += dwindows[..., i, j, :, :]"}),
    Mistake("col2im", "the stride left out of the slice", """
kh, kw, Ho, Wo = dwindows.shape[-4:]
sh, sw = stride
for i in range(kh):
    for j in range(kw):
        dxpad[..., i:i + Ho, j:j + Wo] += dwindows[..., i, j, :, :]
return dxpad
""", {5: "        dxpad[..., i:i + sh * Ho:sh, j:j + sw * Wo:sw] += dwindows[..., i, j, :, :]"}),
    Mistake("col2im", "dwindows[..., i, j] indexes the last two axes (Ho, Wo), not (kh, kw)", """
*_, kh, kw, Ho, Wo = dwindows.shape
sh, sw = stride
for i in range(kh):
    for j in range(kw):
        dxpad[..., i:i + sh * Ho:sh, j:j + sw * Wo:sw] += dwindows[..., i, j]
return dxpad
""", {5: "        dxpad[..., i:i + sh * Ho:sh, j:j + sw * Wo:sw] += dwindows[..., i, j, :, :]"}),
    Mistake("col2im", "each window placed at a multiple of the kernel size, not the stride", """
kh, kw, Ho, Wo = dwindows.shape[-4:]
sh, sw = stride
for ho in range(Ho):
    for wo in range(Wo):
        r, c = ho * kh, wo * kw   # top-left pixel of this window
        dxpad[..., r:r + kh, c:c + kw] += dwindows[..., :, :, ho, wo]
return dxpad
""", {5: "        r, c = ho * sh, wo * sw   # top-left pixel of this window"}),
    Mistake("col2im", "off by one: the slice ends a window short", """
kh, kw = dwindows.shape[-4], dwindows.shape[-3]
Ho, Wo = dwindows.shape[-2], dwindows.shape[-1]
sh, sw = stride
for a in range(kh):
    for b in range(kw):
        rows = slice(a, a + sh * (Ho - 1), sh)
        cols = slice(b, b + sw * Wo, sw)
        dxpad[..., rows, cols] += dwindows[..., a, b, :, :]
return dxpad
""", {6: "        rows = slice(a, a + sh * Ho, sh)"}),
    # -- 22 conv2d ------------------------------------------------------------------------
    Mistake("conv2d", "dout reshaped to (F, M) without moving F first", """
cols, w2, rstd, padded_shape = self._take_cache()
B, F, Ho, Wo = dout.shape
C = self.in_channels
kh, kw = self.kernel_size
dy = dout.reshape(F, -1)                                         # (F, M), M = B*Ho*Wo
if self.bias is not None:
    self.bias.grad += dy.sum(axis=1)
dw2 = dy @ cols.T                                                # (F, U)
if rstd is not None:
    dw2 = standardize_backward(dw2, w2, rstd, 1)                 # back through w_hat
self.weight.grad += dw2.reshape(F, C, kh, kw)
dcols = w2.T @ dy                                                # (U, M)
dwin = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
dx = unpad_spatial(dxpad, self.padding)                          # (C, B, H, W)
return dx.transpose(1, 0, 2, 3)
""", {5: "dy = dout.transpose(1, 0, 2, 3).reshape(F, -1)                   # (F, M), M = B*Ho*Wo"}),
    Mistake("conv2d", "the bias gradient averaged over the output pixels", """
cols, w2, rstd, padded_shape = self._take_cache()
B, F, Ho, Wo = dout.shape
C = self.in_channels
kh, kw = self.kernel_size
dy = dout.transpose(1, 0, 2, 3).reshape(F, -1)
if self.bias is not None:
    self.bias.grad += dy.mean(axis=1)
dw2 = dy @ cols.T
if rstd is not None:
    dw2 = standardize_backward(dw2, w2, rstd, 1)
self.weight.grad += dw2.reshape(F, C, kh, kw)
dcols = w2.T @ dy
dwin = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
dx = unpad_spatial(dxpad, self.padding)
return dx.transpose(1, 0, 2, 3)
""", {7: "    self.bias.grad += dy.sum(axis=1)"}),
    Mistake("conv2d", "weight standardization undone through rstd alone, mean and var taken as "
            "constants", """
cols, w2, rstd, padded_shape = self._take_cache()
B, F, Ho, Wo = dout.shape
C = self.in_channels
kh, kw = self.kernel_size
dy = dout.transpose(1, 0, 2, 3).reshape(F, -1)
if self.bias is not None:
    self.bias.grad += dy.sum(axis=1)
dw2 = dy @ cols.T
if rstd is not None:
    dw2 = dw2 * rstd   # w_hat = (W - mean) * rstd
self.weight.grad += dw2.reshape(F, C, kh, kw)
dcols = w2.T @ dy
dwin = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
dx = unpad_spatial(dxpad, self.padding)
return dx.transpose(1, 0, 2, 3)
""", {10: "    dw2 = standardize_backward(dw2, w2, rstd, 1)   # w_hat = (W - mean) * rstd"}),
    Mistake("conv2d", "dcols from the raw weight, not the standardized one the forward used", """
cols, w2, rstd, padded_shape = self._take_cache()
B, F, Ho, Wo = dout.shape
C = self.in_channels
kh, kw = self.kernel_size
dy = dout.transpose(1, 0, 2, 3).reshape(F, -1)
if self.bias is not None:
    self.bias.grad += dy.sum(axis=1)
dw2 = dy @ cols.T
if rstd is not None:
    dw2 = standardize_backward(dw2, w2, rstd, 1)
self.weight.grad += dw2.reshape(F, C, kh, kw)
dcols = self.weight.data.reshape(F, -1).T @ dy
dwin = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
dx = unpad_spatial(dxpad, self.padding)
return dx.transpose(1, 0, 2, 3)
""", {12: "dcols = w2.T @ dy"}),
    Mistake("conv2d", "the columns' rows taken in (C, B, ...) order", """
cols, w2, rstd, padded_shape = self._take_cache()
B, F, Ho, Wo = dout.shape
C = self.in_channels
kh, kw = self.kernel_size
dy = dout.transpose(1, 0, 2, 3).reshape(F, -1)
if self.bias is not None:
    self.bias.grad += dy.sum(axis=1)
dw2 = dy @ cols.T
if rstd is not None:
    dw2 = standardize_backward(dw2, w2, rstd, 1)
self.weight.grad += dw2.reshape(F, C, kh, kw)
dcols = w2.T @ dy
dwin = dcols.reshape(C, B, kh, kw, Ho, Wo)   # (C, B, kh, kw, Ho, Wo) for col2im
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
dx = unpad_spatial(dxpad, self.padding)
return dx.transpose(1, 0, 2, 3)
""", {13: "dwin = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)"}),
    Mistake("conv2d", "the padding's border not dropped", """
cols, w2, rstd, padded_shape = self._take_cache()
B, F, Ho, Wo = dout.shape
C = self.in_channels
kh, kw = self.kernel_size
dy = dout.transpose(1, 0, 2, 3).reshape(F, -1)
if self.bias is not None:
    self.bias.grad += dy.sum(axis=1)
dw2 = dy @ cols.T
if rstd is not None:
    dw2 = standardize_backward(dw2, w2, rstd, 1)
self.weight.grad += dw2.reshape(F, C, kh, kw)
dcols = w2.T @ dy
dwin = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
dx = dxpad
return dx.transpose(1, 0, 2, 3)
""", {15: "dx = unpad_spatial(dxpad, self.padding)"}),
    Mistake("conv2d", "kh and kw swapped in the columns' reshape: right for square kernels", """
cols, w2, rstd, padded_shape = self._take_cache()
B, F, Ho, Wo = dout.shape
C = self.in_channels
kh, kw = self.kernel_size
dy = dout.transpose(1, 0, 2, 3).reshape(F, -1)
if self.bias is not None:
    self.bias.grad += dy.sum(axis=1)
dw2 = dy @ cols.T
if rstd is not None:
    dw2 = standardize_backward(dw2, w2, rstd, 1)
self.weight.grad += dw2.reshape(F, C, kh, kw)
dcols = w2.T @ dy
dwin = dcols.reshape(C, kw, kh, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
dx = unpad_spatial(dxpad, self.padding)
return dx.transpose(1, 0, 2, 3)
""", {13: "dwin = dcols.reshape(C, kh, kw, B, Ho, Wo).transpose(0, 3, 1, 2, 4, 5)"}),
    # -- 23 batchnorm ---------------------------------------------------------------------
    Mistake("batchnorm", "the means over each image's pixels, not the batch's", """
xhat, rstd, V = self._take_cache()
axes = (0, 2, 3)
self.weight.grad += (dout * xhat).sum(axis=axes)
self.bias.grad += dout.sum(axis=axes)
gamma = self.weight.data.reshape(1, -1, 1, 1)
g = dout * gamma
g_mean = g.mean(axis=(2, 3), keepdims=True)
gx_mean = (g * xhat).mean(axis=(2, 3), keepdims=True)
dx = rstd * (g - g_mean - xhat * gx_mean)
return dx
""", {7: "g_mean = g.mean(axis=axes, keepdims=True)",
      8: "gx_mean = (g * xhat).mean(axis=axes, keepdims=True)"}),
    Mistake("batchnorm", "divided by the batch size B, not the B*H*W values of a channel", """
xhat, rstd, V = self._take_cache()
n = dout.shape[0]   # values per channel
dgamma = (dout * xhat).sum(axis=(0, 2, 3))
dbeta = dout.sum(axis=(0, 2, 3))
self.weight.grad += dgamma
self.bias.grad += dbeta
g = dout * self.weight.data[None, :, None, None]
s1 = g.sum(axis=(0, 2, 3), keepdims=True)
s2 = (g * xhat).sum(axis=(0, 2, 3), keepdims=True)
dx = rstd * (g - s1 / n - xhat * s2 / n)
return dx
""", {2: "n = dout.shape[0] * dout.shape[2] * dout.shape[3]   # values per channel"}),
    Mistake("batchnorm", "the path through the batch mean forgotten", """
xhat, rstd, V = self._take_cache()
self.weight.grad += (dout * xhat).sum(axis=(0, 2, 3))
self.bias.grad += dout.sum(axis=(0, 2, 3))
g = dout * self.weight.data.reshape(1, -1, 1, 1)
mean_gx = (g * xhat).sum(axis=(0, 2, 3), keepdims=True) / V
dx = rstd * (g - xhat * mean_gx)
return dx
""", {6: "dx = rstd * (g - g.sum(axis=(0, 2, 3), keepdims=True) / V - xhat * mean_gx)"}),
    Mistake("batchnorm", "gamma (C,) broadcast against the last axis, W", """
xhat, rstd, V = self._take_cache()
self.weight.grad += (dout * xhat).sum(axis=(0, 2, 3))
self.bias.grad += dout.sum(axis=(0, 2, 3))
g = dout * self.weight.data
m1 = g.mean(axis=(0, 2, 3), keepdims=True)
m2 = (g * xhat).mean(axis=(0, 2, 3), keepdims=True)
return rstd * (g - m1 - xhat * m2)
""", {4: "g = dout * self.weight.data[:, None, None]"}),
    Mistake("batchnorm", "Bessel's V - 1 in the means, as for the running variance", """
xhat, rstd, V = self._take_cache()
self.weight.grad += (dout * xhat).sum(axis=(0, 2, 3))
self.bias.grad += dout.sum(axis=(0, 2, 3))
g = dout * self.weight.data.reshape(1, -1, 1, 1)
n = V - 1   # unbiased
gm = g.sum(axis=(0, 2, 3), keepdims=True) / n
gxm = (g * xhat).sum(axis=(0, 2, 3), keepdims=True) / n
return rstd * (g - gm - xhat * gxm)
""", {5: "n = V"}),
    # -- 24 maxpool -----------------------------------------------------------------------
    Mistake("maxpool", "the gradient spread evenly over the window, as average pooling's", """
argmax, padded_shape = self._take_cache()
B, C, Ho, Wo = dout.shape
kh, kw = self.kernel_size
dwin = xp.zeros((B, C, kh * kw, Ho, Wo), dtype=dout.dtype)
dwin += dout[:, :, None] / (kh * kw)   # spread over the window
dwin = dwin.reshape(B, C, kh, kw, Ho, Wo)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
return unpad_spatial(dxpad, self.padding)
""", {5: "xp.put_along_axis(dwin, argmax[:, :, None], dout[:, :, None], axis=2)"}),
    Mistake("maxpool", "the kernel size passed as the stride", """
argmax, padded_shape = self._take_cache()
B, C, Ho, Wo = dout.shape
kh, kw = self.kernel_size
dwin = xp.zeros((B, C, kh * kw, Ho, Wo), dtype=dout.dtype)
xp.put_along_axis(dwin, argmax[:, :, None], dout[:, :, None], axis=2)
dwin = dwin.reshape(B, C, kh, kw, Ho, Wo)
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.kernel_size)
return unpad_spatial(dxpad, self.padding)
""", {7: "dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)"}),
    Mistake("maxpool", "the padding's border not dropped", """
argmax, padded_shape = self._take_cache()
B, C, Ho, Wo = dout.shape
kh, kw = self.kernel_size
b, c, h, w = xp.indices((B, C, Ho, Wo))
dwin = xp.zeros((B, C, kh * kw, Ho, Wo), dtype=dout.dtype)
dwin[b, c, argmax, h, w] = dout          # only the winner gets the gradient
dwin = dwin.reshape(B, C, kh, kw, Ho, Wo)
dx = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
return dx
""", {9: "return unpad_spatial(dx, self.padding)"}),
    Mistake("maxpool", "argmax unravelled with kh where kw belongs: right for square kernels", """
argmax, padded_shape = self._take_cache()
B, C, Ho, Wo = dout.shape
kh, kw = self.kernel_size
i, j = argmax // kh, argmax % kh
b, c, h, w = xp.indices((B, C, Ho, Wo))
dwin = xp.zeros((B, C, kh, kw, Ho, Wo), dtype=dout.dtype)
dwin[b, c, i, j, h, w] = dout
dxpad = col2im(dwin, xp.zeros(padded_shape, dtype=dout.dtype), self.stride)
return unpad_spatial(dxpad, self.padding)
""", {4: "i, j = argmax // kw, argmax % kw"}),
)
