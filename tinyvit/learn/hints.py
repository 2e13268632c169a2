"""The hints of each exercise, in three levels that build up:

1. the shapes, and which cached tensors the backward needs;
2. the chain rule for this step written out, with one term left for you: ``[?]``;
3. the formula (the term of level 2 filled in, and the code it becomes).

After the third, ``python -m tinyvit.learn solution N`` shows tinyvit's own code.
``tests/test_learn.py`` holds every level to saying something the levels before it
did not, and level 2 to leaving its term out.
"""

import json

from .exercises import derivation

SHOWN = ".learn-hints.json"  # in the workbook: the hint levels shown so far, per exercise
HOLE = "[?]"  # the term of the chain rule that level 2 leaves for the learner
LEVELS = ("the shapes", "the chain rule", "the formula")

HINTS = {
    "linear": (
        "from the cache x2 (M, in), the input as rows; dout2 = dout.reshape(-1, out) is "
        "(M, out); W is self.weight.data (out, in); dW (out, in), db (out,), dx (M, in), "
        "reshaped back to (..., in)",
        "y_mj = sum_i x_mi W_ji + b_j, so dL/dW_ji = sum_m dL/dy_mj x_mi and dL/db_j = "
        f"sum_m dL/dy_mj (every row used b), and dL/dx_mi = sum_j dL/dy_mj {HOLE}",
        "dy_mj/dx_mi = W_ji: dW = dout2^T x2, db = dout2.sum(axis=0) (a sum, not a mean), "
        "dx = (dout2 @ W).reshape(x's shape); add dW and db into .grad with +=",
    ),
    "tanh": (
        "from the cache y, the forward's output (shaped as x): the backward needs nothing "
        "else; dx has x's shape, and there are no parameters",
        "y_i = tanh(x_i) depends on x_i alone, so dx_i = dout_i dy_i/dx_i, with dy_i/dx_i = "
        f"{HOLE} written with y_i, which the cache holds",
        "tanh'(x) = 1 - tanh(x)^2 = 1 - y^2: dx = dout * (1 - y**2)",
    ),
    "gelu": (
        "from the cache x, the forward's input; dx has x's shape; Phi is normal_cdf and its "
        "derivative phi is normal_pdf, both imported",
        "y = x Phi(x) entry by entry, so dx = dout y'(x), and by the product rule "
        f"y'(x) = Phi(x) * 1 + x * {HOLE}",
        "Phi'(x) = phi(x) = exp(-x^2 / 2) / sqrt(2 pi), the density: "
        "dx = dout * (normal_cdf(x) + x * normal_pdf(x))",
    ),
    "gelu_tanh": (
        "from the cache x, the forward's input; dx has x's shape; c = TANH_C and "
        "a = TANH_A, both imported",
        "with u = c (x + a x^3) and t = tanh(u): y = x (1 + t) / 2, so y' = (1 + t) / 2 + "
        f"(x / 2) dt/du du/dx, where dt/du = 1 - t^2 and du/dx = {HOLE}",
        "du/dx = c (1 + 3 a x^2): dx = dout * (0.5 * (1 + t) + 0.5 * x * (1 - t**2) * "
        "TANH_C * (1 + 3 * TANH_A * x**2))",
    ),
    "dropout": (
        "from the cache mask: 0 or 1/(1-p) per entry, shaped as x, or the number 1.0 when "
        "nothing was dropped; dx has x's shape",
        f"y = x * mask, with the mask fixed by the forward: dy_i/dx_i = {HOLE}, and no other "
        "y_j depends on x_i",
        "dy_i/dx_i = mask_i: dx = dout * mask, the same mask (never drawn again); the "
        "number 1.0 multiplies as an array would",
    ),
    "residual": (
        "no cache of its own (the branch keeps its own); dout, dx and the branch's input "
        "gradient all have x's shape",
        "x is used twice, y = x + f(x): dL/dx = dL/dy dx/dx + dL/dy df/dx = "
        f"dout + {HOLE}",
        "dL/dy df/dx is what the branch's backward returns for dout: "
        "dx = dout + self.branch.backward(dout)",
    ),
    "patchify": (
        "from the cache B, C, H, W, the input's shape; P = self.patch_size, gh, gw = "
        "H // P, W // P; dout (B, gh*gw, C*P*P) in, dx (B, C, H, W) out",
        "the forward reshapes x to (B, C, gh, P, gw, P), transposes it by "
        "(0, 2, 4, 1, 3, 5) and reshapes to (B, gh*gw, C*P*P); each output entry is one "
        "input entry, so go back in reverse: reshape dout to (B, gh, gw, C, P, P), "
        f"transpose it by {HOLE}, reshape to (B, C, H, W)",
        "the inverse of transpose(0, 2, 4, 1, 3, 5) is transpose(0, 3, 1, 4, 2, 5): "
        "dx = dout.reshape(B, gh, gw, C, P, P).transpose(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)",
    ),
    "layernorm_steps": (
        "from the cache xmu, var, rstd, xhat; D = xmu.shape[-1]: dxhat, dxmu, dx (..., D); "
        "drstd, dvar, dmean (..., 1); dgamma, dbeta (D,)",
        "walk up one step at a time: dxhat = dout gamma; drstd = sum over the features of "
        "dxhat xmu; dxmu = dxhat rstd (the first use of xmu); dvar = drstd d/dvar "
        f"(var + eps)^(-1/2) = {HOLE}; dxmu += dvar 2 xmu / D (the second use); dmean = "
        "-sum over the features of dxmu; dx = dxmu + dmean / D",
        "d/dvar (var + eps)^(-1/2) = -0.5 (var + eps)^(-3/2): dvar = -0.5 * (var + eps)**-1.5 "
        "* drstd; dgamma = (dout * xhat) summed over the rows, dbeta = dout summed over the rows",
    ),
    "layernorm": (
        "from the cache xhat (..., D) and rstd (..., 1); g = dout * gamma (..., D); the "
        "row means (..., 1); dgamma, dbeta (D,)",
        "dgamma = self.column_sum(dout, xhat), dbeta = dout summed over the rows; xhat_i = "
        "(x_i - mean) rstd depends on x_k directly, through the mean and through rstd, so "
        f"dx_k = rstd (g_k - mean_i(g_i) - {HOLE}), the means over the features",
        "the path through rstd gives xhat_k mean_i(g_i xhat_i): dx = rstd * (g - "
        "g.mean(-1, keepdims=True) - xhat * (g * xhat).mean(-1, keepdims=True))",
    ),
    "softmax_jacobian": (
        "no cache: the argument A (..., N), the forward's output with rows summing to 1, is "
        "all the backward needs; J (..., N, N), one per row; dA and dS (..., N)",
        f"A_j = exp(S_j) / sum_k exp(S_k); the quotient rule gives dA_j/dS_k = {HOLE}; then "
        "dS_k = sum_j dA_j J[j, k], that is dS = dA J, row by row",
        "dA_j/dS_k = A_j (delta_jk - A_k): J = diag(A) - A^T A = A[..., :, None] * "
        "xp.eye(N, dtype=A.dtype) - A[..., :, None] * A[..., None, :]; "
        "dS = (dA[..., None, :] @ J)[..., 0, :]",
    ),
    "softmax": (
        "no cache: the arguments A and dA (..., N) are all the backward needs, with one sum "
        "per row (..., 1): no (N, N) array",
        f"dS_k = sum_j dA_j A_j (delta_jk - A_k) = A_k dA_k - A_k {HOLE}",
        "the second term's factor is the row sum sum_j dA_j A_j: "
        "dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True)); every row of dS sums to zero",
    ),
    "attention_core": (
        "from the cache q (B, NH, Q, Dh), k, v (B, NH, N, Dh), A and Ad (B, NH, Q, N); "
        "dctx (B, NH, Q, Dh); dAd, dA, dS (B, NH, Q, N)",
        "for Y = X Z the matmul rule gives dX = dY Z^T, dZ = X^T dY: ctx = Ad v, so "
        "dAd = dctx v^T and dv = Ad^T dctx; dA = self.attn_drop.backward(dAd); "
        "dS = softmax_backward(A, dA); S = q k^T scale, so dq = dS k scale and "
        f"dk = {HOLE}",
        "dk = dS^T q scale, dS transposed over its last two axes: "
        "dk = (dS.swapaxes(-1, -2) @ q) * self.scale",
    ),
    "merge_heads": (
        "no cache: num_heads is given; dctx (B, N, NH*Dh) in, (B, NH, N, Dh) out, "
        "Dh = dctx.shape[-1] // num_heads",
        "merge_heads transposes (B, NH, N, Dh) to (B, N, NH, Dh) and reshapes it to "
        f"(B, N, NH*Dh); it only moves entries, so reshape dctx to {HOLE} and undo the "
        "transpose",
        "the reshape is to (B, N, NH, Dh), and the transpose (0, 2, 1, 3) is its own inverse: "
        "dheads = dctx.reshape(B, N, num_heads, Dh).transpose(0, 2, 1, 3)",
    ),
    "split_heads": (
        "no cache: dq, dk, dv each (B, NH, N, Dh) in, dqkv (B, N, 3*NH*Dh) out",
        "split_heads reshapes qkv to (B, N, 3, NH, Dh) and transposes it by (2, 0, 3, 1, 4) "
        "to (3, B, NH, N, Dh); going back: stack dq, dk, dv into (3, B, NH, N, Dh), "
        f"transpose by {HOLE}, reshape to (B, N, 3*NH*Dh)",
        "the inverse of (2, 0, 3, 1, 4) is (1, 3, 0, 2, 4): "
        "dqkv = xp.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, N, 3 * NH * Dh)",
    ),
    "attention": (
        "no cache of its own (each part keeps its own); dout, the projection's input "
        "gradient and dx (B, N, D); the heads (B, NH, N, Dh)",
        "the forward's steps in reverse, each backward given what the one after it "
        "returned: proj_drop, proj, split_heads_grad (exercise 13), attend_backward "
        f"(exercise 12), {HOLE}, qkv",
        "merge_qkv_grads (exercise 14) stacks dq, dk, dv: dctx = self.proj.backward("
        "self.proj_drop.backward(dout)); dq, dk, dv = self.attend_backward(split_heads_grad("
        "dctx, self.num_heads)); return self.qkv.backward(merge_qkv_grads(dq, dk, dv))",
    ),
    "mlp": (
        "no cache of its own: each of the five layers keeps its own; (B, N, D) in and out, "
        "(B, N, Dm) between fc1 and fc2",
        "y = drop2(fc2(drop1(GELU(fc1(x))))): the chain rule multiplies the five layers' "
        f"Jacobians, applied to dout one layer at a time, starting from {HOLE}",
        "from the last layer: for layer in reversed(self.layers): dout = layer.backward(dout); "
        "return dout",
    ),
    "block": (
        "no cache of its own; (B, N, D) everywhere; two Residual layers, "
        "self.attn_residual and self.mlp_residual",
        "x1 = x + attn(norm1(x)), y = x1 + mlp(norm2(x1)): dx1 = the MLP residual's "
        f"backward of dout, and dx = {HOLE}",
        "dx = self.attn_residual.backward(self.mlp_residual.backward(dout)): the MLP's "
        "residual first, then the attention's",
    ),
    "vit": (
        "from the cache B, N, D, the last block's output shape; dlogits (B, K); dpooled "
        "(B, D); the tokens' gradient (B, G^2 + 1, D); cls_token (1, 1, D); pos_embed "
        "(1, G^2 + 1, D)",
        "back through head, pre_logits, norm; then the pooling: cls pooling read token 0, "
        "so its row gets dpooled and the others zero; mean pooling read the mean of the "
        f"N - 1 patch tokens, so each gets {HOLE}; then the blocks reversed and pos_drop; "
        "the class token and the position embedding were added to every image",
        "each patch token gets dpooled / (N - 1); their gradients are sums over the batch: "
        "pos_embed.grad += dx.sum(axis=0, keepdims=True), cls_token.grad += "
        "dx[:, :1].sum(axis=0, keepdims=True); return self.patch_embed.backward(dx[:, 1:])",
    ),
    "cross_entropy": (
        "from the cache log_probs (B, K) and t (B, K), each row of t summing to 1; dout a "
        "number; dlogits (B, K)",
        "L = -(1/B) sum_b sum_k t_bk (z_bk - log sum_j exp z_bj), so dL/dz_bk = "
        f"(1/B) (p_bk sum_j t_bj - {HOLE}), p = exp(log_probs)",
        "the missing term is t_bk, and sum_j t_bj = 1: "
        "dlogits = (xp.exp(log_probs) - t) / B * dout",
    ),
    "col2im": (
        "no cache: dwindows (..., kh, kw, Ho, Wo); dxpad (..., Hp, Wp), zeros to add into "
        "and return; stride (sh, sw); one kernel offset (i, j) gives a (..., Ho, Wo) slab",
        "window entry [..., i, j, ho, wo] was read from pixel [..., sh*ho + i, sw*wo + j]: "
        f"for each kernel offset (i, j), the slab dwindows[..., i, j, :, :] goes to {HOLE} "
        "of dxpad",
        "the strided slice, added (+=, windows overlap): for i in range(kh): for j in "
        "range(kw): dxpad[..., i:i + sh*Ho:sh, j:j + sw*Wo:sw] += dwindows[..., i, j, :, :]",
    ),
    "conv2d": (
        "from the cache cols (U, M), w2 (F, U), rstd (F, 1) or None, padded_shape "
        "(C, B, Hp, Wp); dout (B, F, Ho, Wo) as dy (F, M); dW2 (F, U); dcols (U, M); "
        "dx (B, C, H, W)",
        "y = W2 cols + b, one matmul: db = dy summed over M, dW2 = dy cols^T, "
        f"dcols = {HOLE}; col2im puts the columns back into the padded image, "
        "unpad_spatial drops the padding",
        "dcols = W2^T dy (U, M), with dy = dout.transpose(1, 0, 2, 3).reshape(F, -1); the "
        "columns' order is (C, kh, kw, B, Ho, Wo); under weight standardization "
        "dW = standardize_backward(dW2, w2, rstd, 1)",
    ),
    "batchnorm": (
        "from the cache xhat (B, C, H, W), rstd (1, C, 1, 1) and V = B*H*W; g = dout * gamma "
        "(B, C, H, W); the means (1, C, 1, 1); dgamma, dbeta (C,)",
        "LayerNorm's derivation with the means over (B, H, W) per channel: xhat depends on "
        "x directly, through the mean and through rstd, so dx = rstd (g - mean(g) - "
        f"{HOLE})",
        "the path through rstd gives xhat mean(g xhat): dx = rstd * (g - "
        "g.mean(axis=(0, 2, 3), keepdims=True) - xhat * (g * xhat).mean(axis=(0, 2, 3), "
        "keepdims=True)); dgamma = (dout * xhat).sum(axis=(0, 2, 3)), "
        "dbeta = dout.sum(axis=(0, 2, 3))",
    ),
    "maxpool": (
        "from the cache argmax (B, C, Ho, Wo) and padded_shape (B, C, Hp, Wp); dout "
        "(B, C, Ho, Wo); dwindows (B, C, kh, kw, Ho, Wo); dx (B, C, H, W)",
        "y is the window's entry at argmax: dy/d(entry) is 1 there and 0 elsewhere, so "
        f"dwindows is zero but at each window's argmax, where it holds {HOLE}; col2im "
        "adds the windows back into the pixels",
        "it holds dout: onehot = xp.arange(kh * kw)[:, None, None] == argmax[:, :, None]; "
        "dwindows = (onehot * dout[:, :, None]).reshape(B, C, kh, kw, Ho, Wo); "
        "dx = unpad_spatial(col2im(dwindows, xp.zeros(padded_shape, dout.dtype), "
        "self.stride), self.padding)",
    ),
}


def next_hint(folder, ex, level=None):
    """The hints of exercise ``ex`` up to ``level`` (1 to 3), or without it up to the level
    after the last shown, one line each, the highest level shown recorded in ``folder``;
    past the last, that there are no more."""
    path = folder / SHOWN
    shown = json.loads(path.read_text()) if path.is_file() else {}
    before = shown.get(str(ex.number), 0)
    if level is None:
        level = before + 1
    elif level not in range(1, len(LEVELS) + 1):
        raise ValueError(f"hint: expected a level of 1 to {len(LEVELS)}, got {level!r}")
    if level > len(LEVELS):
        return (f"no more hints for exercise {ex.number} ({ex.title}): python -m tinyvit.learn "
                f"solution {ex.number} shows tinyvit's code")
    shown[str(ex.number)] = max(before, level)
    path.write_text(json.dumps(shown, indent=1, sort_keys=True))
    lines = [f"hint {i + 1} of {len(LEVELS)} for exercise {ex.number} ({ex.title}), "
             f"{LEVELS[i]}: {HINTS[ex.name][i]}" for i in range(level)]
    if level == len(LEVELS):
        lines.append(f"The derivation: {derivation(ex.section)}")
    return "\n".join(lines)
