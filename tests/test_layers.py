"""Every layer alone: forward values, and backward against central differences.

All checks run in float64 (the ``backend`` fixture sets it) with a random
upstream gradient, at several shapes: batch 1, token counts that are not powers
of two, and non-contiguous inputs. The bar: max relative error <= 1e-7. The
gradient checks run on both tiers (the ``tier`` fixture): the reference layers
and the fast kernels of the active backend.
"""

import math
import types

import numpy as np
import pytest

from conftest import jitter, randn
from tinyvit import backend as B
from tinyvit.gradcheck import gradient_check, seeded_dropout
from tinyvit.nn.functional import erf, log_softmax, normal_cdf, normal_pdf, softmax
from tinyvit.nn.layers import (
    GELU,
    MLP,
    Attention,
    Block,
    ClassAttention,
    ClassAttentionBlock,
    Dropout,
    LayerNorm,
    Linear,
    PatchEmbed,
    Patchify,
    Residual,
    Tanh,
)

TOL = 1e-7
SHAPES = [(1, 5, 8), (3, 17, 8), (2, 10, 12)]  # (B, N, D): batch 1, N = 5, 17, 10


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gradients(backend, tier, shape, bias):
    layer = tier(jitter(Linear(shape[-1], 6, bias=bias, rng=B.host_rng(0))))
    report = gradient_check(layer, randn(*shape)).assert_ok(TOL)
    assert [c.name for c in report.checks] == ["input", "weight"] + (["bias"] if bias else [])
    assert report["weight"].shape == (6, shape[-1])
    assert report.max_rel_err == max(c.rel_err for c in report.checks) <= TOL
    assert "weight" in str(report) and "rel_err" in str(report)


def test_linear_matches_formula(backend):
    layer = Linear(4, 3, rng=B.host_rng(0))
    layer.bias.data[...] = B.to_device(np.array([1.0, -2.0, 0.5]))
    x = randn(2, 4)
    expected = B.to_host(x) @ B.to_host(layer.weight.data).T + [1.0, -2.0, 0.5]
    np.testing.assert_allclose(B.to_host(layer.forward(x)), expected, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm_gradients(backend, tier, shape):
    gradient_check(tier(jitter(LayerNorm(shape[-1]))), randn(*shape)).assert_ok(TOL)


def test_layernorm_normalizes_rows(backend):
    y = B.to_host(LayerNorm(16).forward(randn(4, 16) * 3 + 5))
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=-1), 1 / (1 + 1e-6 / y.var(axis=-1)), rtol=1e-5)


@pytest.mark.parametrize("make, dout, message", [
    (lambda: Linear(4, 3, rng=B.host_rng(0)), (5, 3), "Linear.backward: expected dout of the "
     "output's shape, (..., 3) over the input's 10 rows, got (5, 3)"),
    (lambda: Linear(4, 3, rng=B.host_rng(0)), (2, 5, 4), "Linear.backward: expected dout of "
     "the output's shape, (..., 3) over the input's 10 rows, got (2, 5, 4)"),
    # (5, 4) broadcasts against (2, 5, 4): the gradient came out of the shape, but wrong
    (lambda: LayerNorm(4), (5, 4), "LayerNorm.backward: expected dout of the output's shape "
     "(2, 5, 4), got (5, 4)"),
])
def test_a_gradient_of_another_shape_is_refused_and_the_cache_kept(backend, make, dout,
                                                                    message):
    layer = make()
    x = randn(2, 5, 4)
    y = layer.forward(x)
    with pytest.raises(ValueError) as raised:
        layer.backward(randn(*dout))
    assert str(raised.value) == message
    assert layer.backward(B.xp.ones_like(y)).shape == x.shape  # the forward's cache is still there


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", SHAPES)
def test_gelu_gradients(backend, tier, shape, approximate):
    gradient_check(tier(GELU(approximate)), randn(*shape) * 2).assert_ok(TOL)


def test_erf_is_exact_to_rounding(backend):
    z = np.linspace(-8, 8, 3201)
    expected = np.array([math.erf(v) for v in z])
    np.testing.assert_allclose(B.to_host(erf(B.to_device(z))), expected, rtol=0, atol=1.5e-15)
    assert erf(B.to_device(z.astype(np.float32))).dtype == np.float32
    special = B.to_host(erf(B.to_device(np.array([np.inf, -np.inf, np.nan, -0.0]))))
    np.testing.assert_array_equal(special, [1.0, -1.0, np.nan, -0.0])
    assert np.signbit(special[-1])


def test_erf_and_gelu_in_float16_are_float32s_rounded(backend, tier):
    """float16 has no room for the rationals' polynomials (its largest number is 65504):
    erf and GELU are computed in float32 and rounded, finite over [-12, 12]."""
    z = np.linspace(-12, 12, 2001).astype(np.float16)
    ours = erf(B.to_device(z))
    assert ours.dtype == np.float16
    expected = erf(B.to_device(z.astype(np.float32))).astype(np.float16)
    np.testing.assert_array_equal(B.to_host(ours), B.to_host(expected))
    y = B.to_host(tier(GELU()).forward(B.to_device(z)))
    exact = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in z.astype(np.float64)])
    assert y.dtype == np.float16 and np.isfinite(y).all()
    np.testing.assert_allclose(y, exact, rtol=2e-3, atol=1e-3)


def test_normal_cdf_and_pdf(backend):
    x = np.linspace(-9, 9, 4001)
    exact_cdf = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x])
    exact_pdf = np.exp(-0.5 * x**2) / math.sqrt(2 * math.pi)
    np.testing.assert_allclose(B.to_host(normal_cdf(B.to_device(x))), exact_cdf, rtol=0, atol=1e-15)
    np.testing.assert_allclose(B.to_host(normal_pdf(B.to_device(x))), exact_pdf, rtol=0, atol=1e-15)


def test_gelu_matches_exact_definition(backend, tier):
    x = np.linspace(-10, 10, 2001)
    y = B.to_host(tier(GELU()).forward(B.to_device(x)))
    expected = np.array([v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(y, expected, rtol=0, atol=1e-13)


def test_gelu_matches_torch_to_1e12(backend):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(10_000) * 4
    for approximate in ("none", "tanh"):
        ours = B.to_host(GELU(approximate).forward(B.to_device(x)))
        theirs = torch.nn.GELU(approximate=approximate)(torch.from_numpy(x)).numpy()
        assert np.abs(ours - theirs).max() <= 1e-12


def test_gelu_rejects_integer_input(backend):
    with pytest.raises(ValueError, match="expected a float array, got dtype int"):
        GELU().forward(B.to_device(np.arange(4)))


def test_softmax_is_stable_and_normalized(backend):
    s = B.to_device(np.array([[1000.0, 1000.0, -1000.0], [0.0, 1.0, 2.0]]))
    p = B.to_host(softmax(s))
    np.testing.assert_array_equal(p[0], [0.5, 0.5, 0.0])
    e = np.exp([0.0, 1.0, 2.0])
    np.testing.assert_allclose(p[1], e / e.sum(), rtol=1e-15)


def test_log_softmax_is_exact_where_softmax_underflows(backend):
    s = B.to_device(np.array([[0.0, -1e4, -2e4], [0.0, 1.0, 2.0]]))
    log_p = B.to_host(log_softmax(s))
    np.testing.assert_array_equal(log_p[0], [0.0, -1e4, -2e4])
    np.testing.assert_allclose(np.exp(log_p[1]), B.to_host(softmax(s))[1], rtol=1e-15)


def test_tanh_gradients(backend):
    gradient_check(Tanh(), randn(3, 7) * 2).assert_ok(TOL)


def test_patchify_layout_and_exact_inverse(backend):
    x = randn(2, 3, 8, 12)
    layer = Patchify(4)
    patches = layer.forward(x)
    assert patches.shape == (2, 6, 48)
    # patch (row 1, col 2) of image 1, flattened in (C, P, P) order
    np.testing.assert_array_equal(
        B.to_host(patches[1, 1 * 3 + 2]), B.to_host(x[1, :, 4:8, 8:12]).reshape(-1)
    )
    np.testing.assert_array_equal(B.to_host(layer.backward(patches)), B.to_host(x))


def test_patch_embed_is_a_strided_convolution(backend):
    layer = jitter(PatchEmbed(4, 2, 5, rng=B.host_rng(0)))
    x = randn(2, 2, 8, 8)
    y = B.to_host(layer.forward(x))  # (B, N, D)
    weight = B.to_host(layer.weight_to_conv(layer.proj.weight.data))  # (D, C, P, P)
    bias, xh = B.to_host(layer.proj.bias.data), B.to_host(x)
    for i, j in [(0, 0), (1, 0), (1, 1)]:  # conv output at patch row i, col j
        window = xh[:, :, 4 * i : 4 * i + 4, 4 * j : 4 * j + 4]  # (B, C, P, P)
        expected = np.einsum("bcyx,dcyx->bd", window, weight) + bias
        np.testing.assert_allclose(y[:, 2 * i + j], expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(
        B.to_host(layer.weight_from_conv(layer.weight_to_conv(layer.proj.weight.data))),
        B.to_host(layer.proj.weight.data),
    )


@pytest.mark.parametrize("batch", [1, 3])
def test_patch_embed_gradients(backend, tier, batch):
    layer = tier(jitter(PatchEmbed(4, 3, 6, rng=B.host_rng(0))))
    gradient_check(layer, randn(batch, 3, 8, 12)).assert_ok(TOL)


def test_patchify_rejects_indivisible_size(backend):
    with pytest.raises(ValueError, match="10x8 is not divisible by patch_size 4"):
        Patchify(4).forward(randn(1, 1, 10, 8))


@pytest.mark.parametrize("shape", SHAPES)
def test_attention_gradients(backend, tier, shape):
    layer = tier(jitter(Attention(shape[-1], num_heads=2, rng=B.host_rng(0))))
    gradient_check(layer, randn(*shape)).assert_ok(TOL)


def test_attention_on_noncontiguous_input(backend, tier):
    x = randn(10, 3, 8).transpose(1, 0, 2)  # (3, 10, 8), a strided view
    assert not x.flags.c_contiguous
    layer = tier(jitter(Attention(8, num_heads=4, rng=B.host_rng(0))))
    gradient_check(layer, x).assert_ok(TOL)


def test_attention_matches_per_head_loop(backend):
    """The batched heads equal the paper's per-head formula, done with loops."""
    layer = jitter(Attention(6, num_heads=3, rng=B.host_rng(0)))
    x = randn(2, 5, 6)
    y = B.to_host(layer.forward(x))
    w, b = B.to_host(layer.qkv.weight.data), B.to_host(layer.qkv.bias.data)
    qkv = B.to_host(x) @ w.T + b  # (B, N, 3D)
    heads = []
    for h in range(3):
        q, k, v = (qkv[..., i * 6 + 2 * h : i * 6 + 2 * h + 2] for i in range(3))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(2)
        a = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
        heads.append(a @ v)
    expected = np.concatenate(heads, -1) @ B.to_host(layer.proj.weight.data).T
    expected += B.to_host(layer.proj.bias.data)
    np.testing.assert_allclose(y, expected, rtol=1e-12, atol=1e-12)
    assert layer.attn is None  # not kept unless asked
    layer.keep_attn = True
    layer.forward(x)
    attn = B.to_host(layer.attn)
    assert attn.shape == (2, 3, 5, 5)
    np.testing.assert_allclose(attn.sum(-1), 1.0)


def test_class_attention_gives_the_class_token_row(backend, tier):
    """ClassAttention: row 0 of Attention's output, and gradients that pass the check
    (the other tokens' q rows get none, every token's k and v rows get theirs)."""
    full = tier(jitter(Attention(8, num_heads=2, rng=B.host_rng(0))))
    cls = tier(jitter(ClassAttention(8, num_heads=2, rng=B.host_rng(0))))
    x = randn(3, 5, 8)
    y = B.to_host(cls.forward(x))
    assert y.shape == (3, 1, 8)
    np.testing.assert_allclose(y, B.to_host(full.forward(x))[:, :1], rtol=1e-13, atol=1e-14)
    gradient_check(cls, x).assert_ok(TOL)


def test_class_attention_keeps_every_row_of_the_maps(backend, tier):
    full = tier(jitter(Attention(8, num_heads=2, rng=B.host_rng(0))))
    cls = tier(jitter(ClassAttention(8, num_heads=2, rng=B.host_rng(0))))
    full.keep_attn = cls.keep_attn = True
    x = randn(2, 5, 8)
    assert cls.forward(x).shape == (2, 1, 8)
    full.forward(x)
    np.testing.assert_allclose(B.to_host(cls.attn), B.to_host(full.attn), rtol=1e-13, atol=1e-15)


def test_attention_rejects_bad_head_count(backend):
    with pytest.raises(ValueError, match="embed_dim 10 is not divisible by num_heads 3"):
        Attention(10, 3)
    with pytest.raises(ValueError, match="embed_dim 10 is not divisible by num_heads 0"):
        Attention(10, 0)  # not a modulo by zero


def test_broken_softmax_backward_is_caught(backend, tier):
    """A softmax backward that drops the -A * sum(dA * A) term must fail the check."""
    layer = tier(jitter(Attention(8, num_heads=2, rng=B.host_rng(0))))
    if type(layer).backward is not Attention.backward:
        pytest.skip(f"{type(layer).__module__}.{type(layer).__name__} runs its heads' backward "
                    "in one kernel, without attend_backward")
    x = randn(2, 5, 8)
    gradient_check(layer, x).assert_ok(TOL)
    layer.attend_backward = types.MethodType(_attend_backward_without_correction, layer)
    with pytest.raises(AssertionError, match="gradient check failed"):
        gradient_check(layer, x).assert_ok(TOL)


def _attend_backward_without_correction(self, dctx):
    """``Attention.attend_backward`` with dS = A * dA (the row-sum term forgotten).
    The fast tier caches q already scaled; the reference caches q."""
    q, k, v, A, Ad = self._take_cache()
    dA = dctx @ v.transpose(0, 1, 3, 2)
    dS = A * dA
    dq = dS @ k * self.scale
    dk = dS.transpose(0, 1, 3, 2) @ q * self.scale
    return dq, dk, Ad.transpose(0, 1, 3, 2) @ dctx


def test_dropout_masks_scale_and_reuse(backend):
    layer = Dropout(0.25, rng=B.rng(0))
    x = B.xp.ones((200, 100))
    y = B.to_host(layer.forward(x))
    assert set(np.unique(y)) == {0.0, 1 / 0.75}
    assert abs((y == 0).mean() - 0.25) < 0.01
    dx = B.to_host(layer.backward(B.xp.full((200, 100), 2.0)))
    np.testing.assert_array_equal(dx, 2.0 * y)  # the forward's mask, reused
    layer.eval()
    assert layer.forward(x) is x
    np.testing.assert_array_equal(B.to_host(layer.backward(x)), B.to_host(x))


def test_dropout_without_generator_says_so(backend):
    with pytest.raises(RuntimeError, match="no random generator"):
        Dropout(0.1).forward(B.xp.ones(3))


def test_dropout_gradients_under_fixed_seed(backend):
    layer = Dropout(0.3)
    gradient_check(layer, randn(2, 5, 8), before_forward=seeded_dropout(layer)).assert_ok(TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_mlp_gradients(backend, tier, shape):
    layer = tier(jitter(MLP(shape[-1], 2 * shape[-1], rng=B.host_rng(0))))
    gradient_check(layer, randn(*shape)).assert_ok(TOL)


def test_residual_gradients_and_skip(backend):
    branch = jitter(Linear(8, 8, rng=B.host_rng(0)))
    layer = Residual(branch)
    x = randn(2, 5, 8)
    np.testing.assert_allclose(
        B.to_host(layer.forward(x)), B.to_host(x + branch.forward(x)), rtol=1e-15
    )
    gradient_check(layer, x).assert_ok(TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_block_gradients(backend, tier, shape):
    layer = tier(jitter(Block(shape[-1], num_heads=2, mlp_ratio=2.0, rng=B.host_rng(0))))
    gradient_check(layer, randn(*shape)).assert_ok(TOL)


def test_class_attention_block_gives_the_class_token_row(backend, tier):
    full = tier(jitter(Block(8, 2, 2.0, rng=B.host_rng(0))))
    one = tier(jitter(ClassAttentionBlock(8, 2, 2.0, rng=B.host_rng(0))))
    assert [n for n, _ in one.named_parameters()] == [n for n, _ in full.named_parameters()]
    x = randn(2, 5, 8)
    y = B.to_host(one.forward(x))
    assert y.shape == (2, 1, 8)
    np.testing.assert_allclose(y, B.to_host(full.forward(x))[:, :1], rtol=1e-13, atol=1e-14)
    gradient_check(one, x).assert_ok(TOL)


def test_block_gradients_with_dropout(backend, tier):
    layer = tier(jitter(Block(8, 2, 2.0, dropout=0.2, attn_dropout=0.1, rng=B.host_rng(0))))
    reseed = seeded_dropout(layer, seed=7)
    gradient_check(layer, randn(2, 5, 8), before_forward=reseed).assert_ok(TOL)


def test_gradients_accumulate_until_zero_grad(backend):
    layer = jitter(Block(8, 2, 2.0, rng=B.host_rng(0)))
    x, dout = randn(2, 5, 8), randn(2, 5, 8, seed=3)
    layer.forward(x)
    layer.backward(dout)
    once = {n: B.to_host(p.grad).copy() for n, p in layer.named_parameters()}
    layer.forward(x)
    layer.backward(dout)
    for n, p in layer.named_parameters():
        np.testing.assert_allclose(B.to_host(p.grad), 2 * once[n], rtol=1e-14)
    layer.zero_grad()
    assert all(float(abs(p.grad).max()) == 0 for p in layer.parameters())


@pytest.mark.parametrize("make", [lambda: Linear(4, 4), lambda: LayerNorm(4), GELU,
                                  lambda: Attention(4, 2), lambda: Patchify(2), Tanh])
def test_backward_before_forward_is_an_error(tier, make):
    with pytest.raises(RuntimeError, match="backward called without a forward before it"):
        tier(make()).backward(B.xp.ones((1, 4, 4)))


@pytest.mark.parametrize("make", [lambda: LayerNorm(4), GELU,
                                  lambda: Block(4, 2, 2.0, rng=B.host_rng(0)),
                                  lambda: ClassAttentionBlock(4, 2, 2.0, rng=B.host_rng(0))])
def test_a_second_backward_after_one_forward_is_an_error(tier, make):
    # each forward serves one backward, which may overwrite its cache in place
    # (the fast LayerNorm's xhat, the fast GELU's derivative): a second one would read garbage
    layer = tier(make())
    x = B.xp.ones((1, 3, 4)) + B.xp.arange(4.0)
    dout = layer.forward(x)
    layer.backward(dout)
    with pytest.raises(RuntimeError, match="backward called without a forward before it"):
        layer.backward(dout)


def test_linear_rejects_wrong_width(backend):
    with pytest.raises(ValueError, match="expected last axis 4, got input of shape"):
        Linear(4, 2).forward(randn(3, 5))


@pytest.mark.parametrize("make, shape, message", [
    (lambda: LayerNorm(4), (3, 5),
     r"^LayerNorm: expected last axis 4, got input of shape \(3, 5\)$"),
    (lambda: Attention(4, 2), (3, 4),
     r"^Attention: expected input \(B, N, 4\), got shape \(3, 4\)$"),
    (lambda: Attention(4, 2), (2, 3, 5),
     r"^Attention: expected input \(B, N, 4\), got shape \(2, 3, 5\)$"),
    (lambda: ClassAttention(4, 2), (1, 2, 3, 4),
     r"^ClassAttention: expected input \(B, N, 4\), got shape \(1, 2, 3, 4\)$"),
])
def test_an_input_of_the_wrong_shape_is_named(backend, make, shape, message):
    with pytest.raises(ValueError, match=message):
        make().forward(randn(*shape))
