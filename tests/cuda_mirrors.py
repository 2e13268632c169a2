"""NumPy mirrors of the GPU kernels of ``tinyvit/fast/kernels``, one function per
``extern "C" __global__`` function, with its parameters in order and its math in
a line or two: ``test_cuda_sources.py`` runs the GPU classes on NumPy with each
launch replaced by its mirror, and ``test_fast.py`` checks the dropout kernel's
masks against its mirror's on a GPU."""

import numpy as np

from tinyvit.nn.functional import normal_cdf, normal_pdf


def add_bias_residual(x, m, b, y, n, D):
    y.reshape(-1, D)[...] = x.reshape(-1, D) + m.reshape(-1, D) + b


def bias_grad(dy, db, rows, D):
    db += dy.reshape(rows, D).sum(axis=0)


def gelu_forward(x, y, n):
    y[...] = x * normal_cdf(x)


def gelu_backward(x, dy, dx, n):
    dx[...] = dy * (normal_cdf(x) + x * normal_pdf(x))


def bias_gelu_forward(u, b, y, n, D):
    gelu_forward(u.reshape(-1, D) + b, y.reshape(-1, D), n)


def bias_gelu_backward(u, b, dy, du, n, D):
    gelu_backward(u.reshape(-1, D) + b, dy.reshape(-1, D), du.reshape(-1, D), n)


def splitmix64(seed, i):
    """Output i (an array of indices) of SplitMix64 seeded with ``seed``, as uint64."""
    z = np.uint64(seed) + (i.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_apply(x, y, n, seed, draw, p, scale):
    key = splitmix64(seed[0], np.array([draw]))[0]
    u = (splitmix64(key, np.arange(n)) >> np.uint64(11)).astype(np.float64) / 2.0**53
    y.reshape(-1)[...] = np.where(u >= p, x.reshape(-1) * scale, 0)


def layernorm_forward(x, gamma, beta, y, xhat, rstd, rows, D, eps):
    x = x.reshape(rows, D)
    mean = x.mean(axis=1, keepdims=True)
    r = 1 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + eps)
    xhat.reshape(rows, D)[...] = (x - mean) * r
    y.reshape(rows, D)[...] = gamma * xhat.reshape(rows, D) + beta
    rstd[...] = r[:, 0]


def add_layernorm_forward(x, r, s, gamma, beta, y, xhat, rstd, rows, D, eps):
    add_bias_layernorm_forward(x, r, 0, s, gamma, beta, y, xhat, rstd, rows, D, eps)


def add_bias_layernorm_forward(x, r, bias, s, gamma, beta, y, xhat, rstd, rows, D, eps):
    s.reshape(rows, D)[...] = x.reshape(rows, D) + r.reshape(rows, D) + bias
    layernorm_forward(s, gamma, beta, y, xhat, rstd, rows, D, eps)


def layernorm_backward_add(dy, xhat, rstd, gamma, skip, dx, rows, D):
    layernorm_backward(dy, xhat, rstd, gamma, dx, rows, D)
    dx += skip


def layernorm_backward(dy, xhat, rstd, gamma, dx, rows, D):
    g, h = dy.reshape(rows, D) * gamma, xhat.reshape(rows, D)
    dx.reshape(rows, D)[...] = rstd[:, None] * (g - g.mean(axis=1, keepdims=True)
                                                - h * (g * h).mean(axis=1, keepdims=True))


def layernorm_param_grads(dy, xhat, dgamma, dbeta, rows, D):
    dgamma += (dy.reshape(rows, D) * xhat.reshape(rows, D)).sum(axis=0)
    dbeta += dy.reshape(rows, D).sum(axis=0)


def batchnorm_forward(x, gamma, beta, y, xhat, rstd, running_mean, running_var, B, C, HW, eps,
                      momentum):
    x = x.reshape(B, C, HW)
    mean, var = x.mean(axis=(0, 2)), x.var(axis=(0, 2))
    rstd[...] = 1 / np.sqrt(var + eps)
    xhat.reshape(B, C, HW)[...] = (x - mean[:, None]) * rstd[:, None]
    y.reshape(B, C, HW)[...] = gamma[:, None] * xhat.reshape(B, C, HW) + beta[:, None]
    n = B * HW
    running_mean[...] = (1 - momentum) * running_mean + momentum * mean
    running_var[...] = (1 - momentum) * running_var + momentum * var * n / (n - 1)


def batchnorm_eval(x, gamma, beta, running_mean, running_var, y, total, C, HW, eps):
    scale = gamma / np.sqrt(running_var + eps)
    y.reshape(-1, C, HW)[...] = ((x.reshape(-1, C, HW) - running_mean[:, None]) * scale[:, None]
                                 + beta[:, None])


def batchnorm_backward(dy, xhat, rstd, gamma, dx, dgamma, dbeta, B, C, HW):
    dy, xhat = dy.reshape(B, C, HW), xhat.reshape(B, C, HW)
    sum_dy, sum_dyh = dy.sum(axis=(0, 2)), (dy * xhat).sum(axis=(0, 2))
    n = B * HW
    mean_g, mean_gh = (gamma * sum_dy / n)[:, None], (gamma * sum_dyh / n)[:, None]
    dx.reshape(B, C, HW)[...] = rstd[:, None] * (dy * gamma[:, None] - mean_g - xhat * mean_gh)
    dgamma += sum_dyh
    dbeta += sum_dy


def softmax_forward(S, A, rows, N, scale):
    s = scale * S.reshape(rows, N)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    A.reshape(rows, N)[...] = e / e.sum(axis=1, keepdims=True)


def softmax_backward(A, dA, dS, rows, N, scale):
    a, da = A.reshape(rows, N), dA.reshape(rows, N)
    dS.reshape(rows, N)[...] = scale * a * (da - (da * a).sum(axis=1, keepdims=True))


def heads(qkv, bias, N, NH, Dh):
    """q, k, v (B, NH, N, Dh) from the qkv projection before its bias (B N, 3D)."""
    return (qkv.reshape(-1, N, 3, NH, Dh) + bias.reshape(3, NH, Dh)).transpose(2, 0, 3, 1, 4)


def merge(a, N, NH, Dh):
    """(B, NH, N, Dh) -> (B N, NH Dh), N the rows"""
    return a.transpose(0, 2, 1, 3).reshape(-1, NH * Dh)


def attention_forward(qkv, bias, ctx, A, write_A, N, Q, NH, Dh, scale):
    q, k, v = heads(qkv, bias, N, NH, Dh)
    q = q[:, :, :Q]  # the first Q tokens' queries
    a = np.empty(q.shape[:3] + (N,), dtype=q.dtype)
    softmax_forward(q @ k.swapaxes(-1, -2), a, a.size // N, N, scale)
    if write_A:
        A[...] = a
    ctx.reshape(-1, NH * Dh)[...] = merge(a @ v, Q, NH, Dh)


def attention_backward(qkv, bias, A, dctx, dS, dqkv, N, Q, NH, Dh, scale):
    q, k, v = heads(qkv, bias, N, NH, Dh)
    dc = dctx.reshape(-1, Q, NH, Dh).transpose(0, 2, 1, 3)  # (B, NH, Q, Dh)
    softmax_backward(A, dc @ v.swapaxes(-1, -2), dS, A.size // N, N, scale)
    dq = np.zeros_like(q)
    dq[:, :, :Q] = dS @ k  # the other rows' queries were not used
    dk, dv = dS.swapaxes(-1, -2) @ q[:, :, :Q], A.swapaxes(-1, -2) @ dc
    grads = [merge(g, N, NH, Dh) for g in (dq, dk, dv)]
    dqkv.reshape(-1, 3 * NH * Dh)[...] = np.concatenate(grads, axis=1)


def cross_entropy_soft(z, t, loss_rows, grad, B, K):
    lse = np.log(np.exp(z - z.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True)) \
        + z.max(axis=1, keepdims=True)
    loss_rows[...] = (t * (lse - z)).sum(axis=1) / B
    grad[...] = (np.exp(z - lse) - t) / B


def cross_entropy_labels(z, labels, smoothing, loss_rows, grad, B, K):
    t = np.full((B, K), smoothing / K, dtype=z.dtype)
    valid = (labels >= 0) & (labels < K)
    t[valid, labels[valid]] += 1 - smoothing
    t[~valid] = np.nan
    cross_entropy_soft(z, t, loss_rows, grad, B, K)


def adamw_update(p, g, m, v, decay, n, schedule, beta1, one_minus_beta1, beta2, one_minus_beta2,
                 eps, weight_decay):
    lr, bias1, bias2_sqrt = schedule.astype(p.dtype)
    p -= lr * weight_decay * decay * p
    m[...] = beta1 * m + one_minus_beta1 * g
    v[...] = beta2 * v + one_minus_beta2 * g * g
    p -= lr / bias1 * m / (np.sqrt(v) / bias2_sqrt + eps)


def im2col(x, rows, n, C, H, W, kh, kw, sh, sw, ph, pw, Ho, Wo):
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))  # (B, C, H + 2ph, W + 2pw)
    for i in range(kh):
        for j in range(kw):
            patch = padded[:, :, i : i + sh * Ho : sh, j : j + sw * Wo : sw]  # (B, C, Ho, Wo)
            rows.reshape(-1, Ho, Wo, C, kh, kw)[..., i, j] = patch.transpose(0, 2, 3, 1)


def col2im(drows, dx, n, C, H, W, kh, kw, sh, sw, ph, pw, Ho, Wo):
    B = dx.shape[0]
    padded = np.zeros((B, C, H + 2 * ph, W + 2 * pw), dtype=dx.dtype)
    for i in range(kh):
        for j in range(kw):
            patch = drows.reshape(B, Ho, Wo, C, kh, kw)[..., i, j].transpose(0, 3, 1, 2)
            padded[:, :, i : i + sh * Ho : sh, j : j + sw * Wo : sw] += patch
    dx[...] = padded[:, :, ph : ph + H, pw : pw + W]


def gemm(transa, transb, m, n, k, alpha, A, lda, stride_a, B, ldb, stride_b, beta, C, ldc,
         stride_c, batch):
    """cuBLAS's strided batched GEMM (``tinyvit.fast.cublas.gemm``) as its documentation
    states it, on the flat buffers: column-major matrices, each leading dimension at
    least its matrix's rows, C not read where beta is 0."""
    assert A.dtype == B.dtype == C.dtype and all(a.flags.c_contiguous for a in (A, B, C))

    def matrix(buffer, start, ld, rows, cols):  # column-major (rows, cols) at buffer[start]
        assert ld >= max(1, rows) and (cols == 0 or start + (cols - 1) * ld + rows <= buffer.size)
        flat = buffer.reshape(-1)
        return np.lib.stride_tricks.as_strided(flat[start:], (rows, cols),
                                               (flat.itemsize, ld * flat.itemsize))

    for i in range(batch):
        a = matrix(A, i * stride_a, lda, *((k, m) if transa else (m, k)))
        b = matrix(B, i * stride_b, ldb, *((n, k) if transb else (k, n)))
        c = matrix(C, i * stride_c, ldc, m, n)
        product = alpha * (a.T if transa else a) @ (b.T if transb else b)
        c[...] = product if beta == 0 else product + beta * c


MIRRORS = {f.__name__: f for f in (
    add_bias_residual, bias_grad, gelu_forward, gelu_backward, bias_gelu_forward,
    bias_gelu_backward, dropout_apply, layernorm_forward, add_layernorm_forward,
    add_bias_layernorm_forward, layernorm_backward_add, batchnorm_forward, batchnorm_eval,
    batchnorm_backward, layernorm_backward, layernorm_param_grads, softmax_forward,
    softmax_backward, attention_forward, attention_backward, cross_entropy_soft,
    cross_entropy_labels, adamw_update, im2col, col2im)}
