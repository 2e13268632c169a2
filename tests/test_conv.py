"""The convolutional stem's layers: forward values against direct definitions (and
PyTorch when installed), backward against central differences.

Gradient checks run in float64 (the ``backend`` fixture sets it) with a random
upstream gradient, on tiny shapes: odd sizes, stride 2, padding, 1x1 and
rectangular kernels, batch 1, non-contiguous inputs. The bar: max relative
error <= 1e-7 for the input and every parameter.
"""

import math

import numpy as np
import pytest

from tinyvit import backend as B
from tinyvit.gradcheck import gradient_check
from tinyvit.nn.conv import (
    BatchNorm2d,
    Conv2d,
    GroupNorm,
    MaxPool2d,
    ReLU,
    col2im,
    sliding_windows,
)

TOL = 1e-7

# (batch, in, out, H, W, kernel, stride, padding)
CONV_SHAPES = [
    (2, 3, 4, 5, 6, 3, 1, 1),  # odd sizes, padding
    (3, 2, 3, 7, 5, 3, 2, 1),  # stride 2 with overlapping windows (s < k)
    (1, 3, 2, 4, 3, 1, 1, 0),  # 1x1 kernel, batch 1
    (1, 1, 2, 6, 5, 3, 2, 0),  # one input channel, stride 2, no padding
    (2, 2, 3, 6, 5, (2, 3), (2, 1), (1, 0)),  # rectangular kernel, stride and padding
    (2, 2, 2, 5, 5, 3, 1, 2),  # padding as large as the kernel allows
    (2, 4, 3, 7, 6, 3, 2, 1),  # the fast tier's channels-last layout (C >= Wo), stride 2
]


def randn(*shape, seed=5):
    """Standard normal values; the default seed differs from the gradient check's
    upstream gradient (seed 0), which with equal shapes would draw the same values."""
    return B.to_device(B.host_rng(seed).standard_normal(shape))


def non_contiguous(x):
    """The same values as x (B, C, H, W), as a non-contiguous view."""
    view = B.xp.ascontiguousarray(x.transpose(3, 1, 0, 2)).transpose(2, 1, 3, 0)
    assert not view.flags.c_contiguous and (B.to_host(view) == B.to_host(x)).all()
    return view


def jitter(module, seed=1, scale=0.2):
    """Move parameters off their initial values (unit gammas, zero biases)."""
    for p in module.parameters():
        p.data[...] += B.to_device(B.host_rng(seed).standard_normal(p.shape)) * scale
        seed += 1
    return module


def distinct(*shape, seed=0):
    """Values 0.1 apart at least, in random order: no ties within h of each other."""
    n = math.prod(shape)
    values = B.host_rng(seed).permutation(n).reshape(shape) * 0.1 - 0.05 * n
    return B.to_device(values.astype(np.float64))


def conv_loop(x, weight, bias, stride, padding):
    """The definition, one output value at a time (NumPy, tiny inputs only)."""
    (sh, sw), (ph, pw) = stride, padding
    batch, _, H, W = x.shape
    F, _, kh, kw = weight.shape
    xpad = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    Ho, Wo = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
    y = np.zeros((batch, F, Ho, Wo))
    for b in range(batch):
        for o in range(F):
            for i in range(Ho):
                for j in range(Wo):
                    window = xpad[b, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
                    y[b, o, i, j] = (window * weight[o]).sum() + (0 if bias is None else bias[o])
    return y


def standardized(weight, eps):
    """(W - mean) / sqrt(var + eps) per output channel, biased var (NumPy)."""
    flat = weight.reshape(weight.shape[0], -1)
    mean = flat.mean(axis=1, keepdims=True)
    var = ((flat - mean) ** 2).mean(axis=1, keepdims=True)
    return ((flat - mean) / np.sqrt(var + eps)).reshape(weight.shape)


def as_pair(v):
    return (v, v) if isinstance(v, int) else v


# ---------------------------------------------------------------------------
# Conv2d
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", CONV_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_gradients(backend, shape, bias):
    batch, C, F, H, W, k, s, p = shape
    conv = jitter(Conv2d(C, F, k, s, p, bias=bias, rng=B.host_rng(0)))
    report = gradient_check(conv, randn(batch, C, H, W)).assert_ok(TOL)
    assert [c.name for c in report.checks] == ["input", "weight"] + (["bias"] if bias else [])


@pytest.mark.parametrize("shape", CONV_SHAPES[:3])
def test_conv2d_gradients_non_contiguous_input(backend, shape):
    batch, C, F, H, W, k, s, p = shape
    conv = Conv2d(C, F, k, s, p, rng=B.host_rng(0))
    gradient_check(conv, non_contiguous(randn(batch, C, H, W))).assert_ok(TOL)


@pytest.mark.parametrize("shape", CONV_SHAPES[:2] + CONV_SHAPES[4:5] + [(2, 4, 3, 3, 4, 1, 1, 0)])
def test_conv2d_weight_standardization_gradients(backend, shape):
    """Through the standardization too: dW goes back through mean and rstd. (A 1x1
    kernel over 4 channels: with 2, what = +-1 whatever W, and dW is only noise.)"""
    batch, C, F, H, W, k, s, p = shape
    conv = jitter(Conv2d(C, F, k, s, p, weight_standardization=True, rng=B.host_rng(0)))
    gradient_check(conv, randn(batch, C, H, W)).assert_ok(TOL)


@pytest.mark.parametrize("shape", CONV_SHAPES)
def test_conv2d_matches_loop_definition(backend, shape):
    batch, C, F, H, W, k, s, p = shape
    conv = Conv2d(C, F, k, s, p, rng=B.host_rng(0))
    x = randn(batch, C, H, W)
    expected = conv_loop(B.to_host(x), B.to_host(conv.weight.data), B.to_host(conv.bias.data),
                         as_pair(s), as_pair(p))
    y = conv.forward(x)
    assert y.shape == expected.shape and y.flags.c_contiguous
    np.testing.assert_allclose(B.to_host(y), expected, rtol=1e-13, atol=1e-13)


def test_conv2d_weight_standardization_matches_formula(backend):
    conv = jitter(Conv2d(3, 4, 3, padding=1, weight_standardization=True, rng=B.host_rng(0)))
    x = randn(2, 3, 5, 5)
    weight = B.to_host(conv.weight.data)
    what = standardized(weight, 1e-6)
    np.testing.assert_allclose(what.reshape(4, -1).mean(axis=1), 0, atol=1e-15)
    np.testing.assert_allclose(what.reshape(4, -1).var(axis=1), 1, rtol=1e-4)
    expected = conv_loop(B.to_host(x), what, B.to_host(conv.bias.data), (1, 1), (1, 1))
    np.testing.assert_allclose(B.to_host(conv.forward(x)), expected, rtol=1e-13, atol=1e-13)
    assert conv.ws_eps == 1e-6  # timm's StdConv2d default


def test_conv2d_init_as_pytorch(backend):
    conv = Conv2d(3, 16, 5, rng=B.host_rng(0))
    bound = 1 / math.sqrt(3 * 5 * 5)
    weight, bias = B.to_host(conv.weight.data), B.to_host(conv.bias.data)
    assert weight.shape == (16, 3, 5, 5) and bias.shape == (16,)
    assert weight.dtype == np.float64  # the default dtype the fixture sets
    assert np.abs(weight).max() <= bound and np.abs(bias).max() <= bound
    assert abs(weight.std() - bound / math.sqrt(3)) < 0.1 * bound  # uniform's std
    again = Conv2d(3, 16, 5, rng=B.host_rng(0))
    np.testing.assert_array_equal(B.to_host(again.weight.data), weight)
    assert conv.weight.decay and not conv.bias.decay
    assert Conv2d(3, 16, 5, bias=False, rng=B.host_rng(0)).bias is None


def test_conv2d_gradients_accumulate(backend):
    conv = jitter(Conv2d(2, 3, 3, stride=2, padding=1, rng=B.host_rng(0)))
    x, dout = randn(2, 2, 5, 5), randn(2, 3, 3, 3, seed=1)
    conv.forward(x)
    dx = B.to_host(conv.backward(dout))
    grads = [B.to_host(p.grad).copy() for p in conv.parameters()]
    conv.forward(x)
    np.testing.assert_array_equal(B.to_host(conv.backward(dout)), dx)
    for p, g in zip(conv.parameters(), grads):
        np.testing.assert_allclose(B.to_host(p.grad), 2 * g, rtol=1e-15)
    conv.zero_grad()
    assert all(float(abs(p.grad).max()) == 0 for p in conv.parameters())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_conv2d_dtypes(backend, dtype):
    conv = Conv2d(3, 4, 3, stride=2, padding=1, rng=B.host_rng(0), dtype=dtype)
    x = randn(2, 3, 7, 7).astype(dtype)
    y = conv.forward(x)
    dx = conv.backward(B.xp.ones_like(y))
    assert y.dtype == dtype and dx.dtype == dtype and conv.weight.grad.dtype == dtype
    x64, weight64, bias64 = (B.to_host(a).astype(np.float64)
                             for a in (x, conv.weight.data, conv.bias.data))
    expected = conv_loop(x64, weight64, bias64, (2, 2), (1, 1))
    tol = 1e-5 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(B.to_host(y), expected, rtol=tol, atol=tol)


def test_conv2d_eval_mode_keeps_no_cache(backend):
    conv = Conv2d(2, 3, 3, rng=B.host_rng(0)).eval()
    y = conv.forward(randn(1, 2, 4, 4))
    assert conv.cache is None
    with pytest.raises(RuntimeError, match="Conv2d.backward called without a forward"):
        conv.backward(y)


def test_conv2d_matches_torch(backend):
    torch = pytest.importorskip("torch")
    for ws in (False, True):
        for batch, C, F, H, W, k, s, p in CONV_SHAPES:
            conv = jitter(Conv2d(C, F, k, s, p, weight_standardization=ws, rng=B.host_rng(0)))
            x, weight = randn(batch, C, H, W), B.to_host(conv.weight.data)
            y = conv.forward(x)
            dout = randn(*y.shape, seed=2)
            dx = conv.backward(dout)
            xt = torch.tensor(B.to_host(x), requires_grad=True)
            wt = torch.tensor(weight, requires_grad=True)
            bt = torch.tensor(B.to_host(conv.bias.data), requires_grad=True)
            w_used = wt
            if ws:  # timm's StdConv2d, by batch_norm as timm computes it
                w_used = torch.nn.functional.batch_norm(
                    wt.reshape(1, F, -1), None, None, training=True, momentum=0.0, eps=1e-6
                ).reshape_as(wt)
            yt = torch.nn.functional.conv2d(xt, w_used, bt, as_pair(s), as_pair(p))
            yt.backward(torch.tensor(B.to_host(dout)))
            for ours, theirs in [(y, yt), (dx, xt.grad), (conv.weight.grad, wt.grad),
                                 (conv.bias.grad, bt.grad)]:
                np.testing.assert_allclose(B.to_host(ours), theirs.detach().numpy(),
                                           rtol=1e-10, atol=1e-12)


def test_conv2d_input_errors(backend):
    conv = Conv2d(3, 4, 3, rng=B.host_rng(0))
    expected = r"Conv2d: expected input \(B, 3, H, W\), got shape "
    with pytest.raises(ValueError, match=expected + r"\(2, 4, 5, 5\)"):
        conv.forward(randn(2, 4, 5, 5))
    with pytest.raises(ValueError, match=expected + r"\(3, 5, 5\)"):
        conv.forward(randn(3, 5, 5))
    with pytest.raises(ValueError, match="at least 3x3 .the kernel., got 2x5 padded by 0x0"):
        conv.forward(randn(1, 3, 2, 5))
    with pytest.raises(ValueError, match="Conv2d: expected a float array, got dtype int"):
        conv.forward(B.xp.zeros((1, 3, 5, 5), dtype=B.xp.int64))
    with pytest.raises(ValueError, match="kernel_size must be an int >= 1 or a pair of them, "
                                         "got 2.5"):
        Conv2d(3, 4, 2.5)
    with pytest.raises(ValueError, match=r"stride must be an int >= 1 or a pair of them, "
                                         r"got \(1, 0\)"):
        Conv2d(3, 4, 3, stride=(1, 0))
    with pytest.raises(ValueError, match="padding must be an int >= 0 or a pair of them, got -1"):
        Conv2d(3, 4, 3, padding=-1)


# ---------------------------------------------------------------------------
# im2col and col2im
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("kernel, stride", [((3, 3), (1, 1)), ((3, 2), (2, 1)), ((2, 2), (2, 2))])
def test_col2im_is_the_adjoint_of_sliding_windows(backend, kernel, stride):
    """<windows(x), d> = <x, col2im(d)> for all x, d: col2im adds every window entry
    back into the pixel it was read from, overlapping windows included."""
    x = randn(2, 3, 7, 6)
    windows = sliding_windows(x, kernel, stride)
    d = randn(*windows.shape, seed=1)
    lhs = float((windows * d).sum())
    rhs = float((x * col2im(d, B.xp.zeros(x.shape), stride)).sum())
    assert abs(lhs - rhs) <= 1e-12 * abs(lhs)
    ones = B.to_host(col2im(B.xp.ones(windows.shape), B.xp.zeros(x.shape), stride))[0, 0]
    if stride == (1, 1):  # the centre pixel of a 3x3-stride-1 cover is read 9 times
        assert ones[3, 3] == 9 and ones[0, 0] == 1


def test_sliding_windows_layout(backend):
    x = randn(1, 1, 5, 6)
    windows = sliding_windows(x, (2, 3), (2, 1))  # (1, 1, 2, 3, Ho, Wo)
    assert windows.shape == (1, 1, 2, 3, 2, 4)
    xh, wh = B.to_host(x), B.to_host(windows)
    for i, j, ho, wo in [(0, 0, 0, 0), (1, 2, 1, 3), (1, 0, 0, 2)]:
        assert wh[0, 0, i, j, ho, wo] == xh[0, 0, 2 * ho + i, wo + j]


# ---------------------------------------------------------------------------
# BatchNorm2d
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(4, 3, 5, 3), (1, 2, 3, 5), (3, 2, 1, 1)])
def test_batchnorm_gradients(backend, shape):
    gradient_check(jitter(BatchNorm2d(shape[1])), randn(*shape)).assert_ok(TOL)


def test_batchnorm_gradients_non_contiguous_input(backend):
    gradient_check(jitter(BatchNorm2d(3)), non_contiguous(randn(2, 3, 4, 5))).assert_ok(TOL)


def test_batchnorm_training_statistics_and_running_averages(backend):
    bn = BatchNorm2d(3, momentum=0.25)
    assert bn.buffers == ("running_mean", "running_var")
    assert [name for name, _ in bn.named_parameters()] == ["weight", "bias"]
    x = randn(4, 3, 5, 6) * 2 + 3
    xh = B.to_host(x)
    y = B.to_host(bn.forward(x))
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-13)
    np.testing.assert_allclose(y.var(axis=(0, 2, 3)), 1, rtol=1e-4)
    n = 4 * 5 * 6
    mean, var = xh.mean(axis=(0, 2, 3)), xh.var(axis=(0, 2, 3))
    np.testing.assert_allclose(B.to_host(bn.running_mean), 0.25 * mean, rtol=1e-13)
    np.testing.assert_allclose(B.to_host(bn.running_var), 0.75 + 0.25 * var * n / (n - 1),
                               rtol=1e-13)
    bn.eval()
    expected = (xh - B.to_host(bn.running_mean)[:, None, None]) / np.sqrt(
        B.to_host(bn.running_var)[:, None, None] + 1e-5)
    np.testing.assert_allclose(B.to_host(bn.forward(x)), expected, rtol=1e-13, atol=1e-13)
    assert bn.cache is None


def test_batchnorm_matches_torch(backend):
    torch = pytest.importorskip("torch")
    ours = jitter(BatchNorm2d(3, eps=1e-3, momentum=0.2))
    theirs = torch.nn.BatchNorm2d(3, eps=1e-3, momentum=0.2).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(B.to_host(ours.weight.data)))
        theirs.bias.copy_(torch.tensor(B.to_host(ours.bias.data)))
    for step in range(3):
        x = randn(2, 3, 4, 5, seed=step) * (step + 1) + step
        dout = randn(2, 3, 4, 5, seed=10 + step)
        xt = torch.tensor(B.to_host(x), requires_grad=True)
        yt = theirs(xt)
        yt.backward(torch.tensor(B.to_host(dout)))
        ours.zero_grad()
        y = ours.forward(x)
        dx = ours.backward(dout)
        for a, b in [(y, yt), (dx, xt.grad), (ours.weight.grad, theirs.weight.grad),
                     (ours.bias.grad, theirs.bias.grad), (ours.running_mean, theirs.running_mean),
                     (ours.running_var, theirs.running_var)]:
            np.testing.assert_allclose(B.to_host(a), b.detach().numpy(), rtol=1e-11, atol=1e-12)
        theirs.weight.grad = theirs.bias.grad = None
    x = randn(3, 3, 2, 2, seed=99)
    with torch.no_grad():
        expected = theirs.eval()(torch.tensor(B.to_host(x))).numpy()
    np.testing.assert_allclose(B.to_host(ours.eval().forward(x)), expected, rtol=1e-12, atol=1e-12)


def test_batchnorm_float32(backend):
    bn = jitter(BatchNorm2d(2)).astype(np.float32)
    x = (randn(3, 2, 4, 4) * 5 + 1).astype(np.float32)
    y = bn.forward(x)
    dx = bn.backward(B.xp.ones_like(y))
    assert y.dtype == np.float32 and dx.dtype == np.float32
    assert float(abs(dx).max()) < 1e-5  # a constant dout has zero gradient through the mean
    assert bn.running_mean.dtype == np.float32  # astype converts the buffers too
    assert bn.eval().forward(x).dtype == np.float32


def test_batchnorm_errors(backend):
    with pytest.raises(ValueError, match=r"BatchNorm2d: expected input \(B, 3, H, W\), "
                                         r"got shape \(2, 4, 2, 2\)"):
        BatchNorm2d(3).forward(randn(2, 4, 2, 2))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        BatchNorm2d(3).forward(randn(1, 3, 1, 1))


# ---------------------------------------------------------------------------
# GroupNorm
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("groups, shape", [(2, (2, 4, 3, 5)), (1, (1, 3, 4, 3)), (3, (2, 3, 2, 2))])
def test_groupnorm_gradients(backend, groups, shape):
    gradient_check(jitter(GroupNorm(groups, shape[1])), randn(*shape)).assert_ok(TOL)


def test_groupnorm_gradients_non_contiguous_input(backend):
    gradient_check(jitter(GroupNorm(2, 4)), non_contiguous(randn(2, 4, 3, 5))).assert_ok(TOL)


def test_groupnorm_matches_formula(backend):
    gn = jitter(GroupNorm(2, 4, eps=1e-6))
    x = randn(3, 4, 5, 2)
    xg = B.to_host(x).reshape(3, 2, -1)
    xhat = ((xg - xg.mean(axis=2, keepdims=True)) / np.sqrt(xg.var(axis=2, keepdims=True) + 1e-6))
    expected = (xhat.reshape(3, 4, 5, 2) * B.to_host(gn.weight.data)[:, None, None]
                + B.to_host(gn.bias.data)[:, None, None])
    np.testing.assert_allclose(B.to_host(gn.forward(x)), expected, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(B.to_host(gn.eval().forward(x)), expected, rtol=1e-13, atol=1e-13)


def test_groupnorm_matches_torch(backend):
    torch = pytest.importorskip("torch")
    ours = jitter(GroupNorm(3, 6, eps=1e-6))
    theirs = torch.nn.GroupNorm(3, 6, eps=1e-6).double()
    with torch.no_grad():
        theirs.weight.copy_(torch.tensor(B.to_host(ours.weight.data)))
        theirs.bias.copy_(torch.tensor(B.to_host(ours.bias.data)))
    x, dout = randn(2, 6, 3, 4) * 3, randn(2, 6, 3, 4, seed=1)
    xt = torch.tensor(B.to_host(x), requires_grad=True)
    yt = theirs(xt)
    yt.backward(torch.tensor(B.to_host(dout)))
    y = ours.forward(x)
    dx = ours.backward(dout)
    for a, b in [(y, yt), (dx, xt.grad), (ours.weight.grad, theirs.weight.grad),
                 (ours.bias.grad, theirs.bias.grad)]:
        np.testing.assert_allclose(B.to_host(a), b.detach().numpy(), rtol=1e-11, atol=1e-12)


def test_groupnorm_errors(backend):
    with pytest.raises(ValueError, match="num_channels 6 is not divisible by num_groups 4"):
        GroupNorm(4, 6)
    with pytest.raises(ValueError, match=r"GroupNorm: expected input \(B, 6, H, W\), "
                                         r"got shape \(2, 6, 3\)"):
        GroupNorm(3, 6).forward(randn(2, 6, 3))


# ---------------------------------------------------------------------------
# ReLU, MaxPool2d
# ---------------------------------------------------------------------------


def test_relu_values_and_gradients(backend):
    x = randn(2, 3, 4, 5)
    x = x + B.xp.sign(x) * 0.1  # off the kink at 0
    gradient_check(ReLU(), x).assert_ok(TOL)
    relu = ReLU()
    y = relu.forward(B.to_device(np.array([-2.0, -0.0, 0.0, 3.0])))
    np.testing.assert_array_equal(B.to_host(y), [0, 0, 0, 3])
    np.testing.assert_array_equal(B.to_host(relu.backward(B.xp.ones(4))), [0, 0, 0, 1])
    assert relu.eval().forward(x).dtype == x.dtype and relu.cache is None
    x32 = x.astype(np.float32)
    assert ReLU().forward(x32).dtype == np.float32


@pytest.mark.parametrize("kernel, stride, padding, shape", [
    (2, None, 0, (2, 3, 4, 6)),  # the usual 2x2/2, no overlap
    (3, 2, 1, (1, 2, 7, 5)),  # overlapping windows, padding, odd sizes, batch 1
    (3, 1, 0, (2, 1, 5, 5)),  # stride 1: each pixel in up to 9 windows
    ((2, 3), (1, 2), (1, 1), (1, 2, 4, 5)),  # rectangular
])
def test_maxpool_gradients(backend, kernel, stride, padding, shape):
    pool = MaxPool2d(kernel, stride, padding)
    gradient_check(pool, distinct(*shape)).assert_ok(TOL)
    gradient_check(pool, non_contiguous(distinct(*shape, seed=1))).assert_ok(TOL)


def test_maxpool_ties_go_to_the_first_element(backend):
    """A constant input: every window's gradient goes to its first (top-left) element."""
    pool = MaxPool2d(2)
    x = B.xp.ones((1, 1, 4, 4))
    pool.forward(x)
    dout = B.to_device(np.array([[[[1.0, 2.0], [3.0, 4.0]]]]))
    expected = np.array([[1, 0, 2, 0], [0, 0, 0, 0], [3, 0, 4, 0], [0, 0, 0, 0]], dtype=float)
    np.testing.assert_array_equal(B.to_host(pool.backward(dout))[0, 0], expected)


def test_maxpool_overlapping_windows_accumulate(backend):
    """Stride 1, kernel 3: the single maximum of a 4x4 image wins all 4 windows it lies
    in, so it gets the sum of their gradients; with a constant image, the windows'
    first elements (row 0-1, col 0-1) each get their own window's gradient."""
    x = B.xp.zeros((1, 1, 4, 4))
    x[0, 0, 1, 2] = 5.0
    pool = MaxPool2d(3, stride=1)
    y = pool.forward(x)
    np.testing.assert_array_equal(B.to_host(y), 5.0)
    dout = B.to_device(np.array([[[[1.0, 2.0], [4.0, 8.0]]]]))
    dx = B.to_host(pool.backward(dout))[0, 0]
    assert dx[1, 2] == 15.0 and dx.sum() == 15.0
    pool.forward(B.xp.ones((1, 1, 4, 4)))
    dx = B.to_host(pool.backward(dout))[0, 0]
    np.testing.assert_array_equal(dx[:2, :2], [[1, 2], [4, 8]])
    assert dx.sum() == 15.0


def test_maxpool_padding_never_wins(backend):
    x = -1.0 - B.xp.abs(randn(1, 2, 3, 3))  # all below zero
    y = B.to_host(MaxPool2d(3, stride=1, padding=1).forward(x))
    xh = B.to_host(x)
    assert y.shape == (1, 2, 3, 3) and (y < 0).all()
    assert y[0, 0, 0, 0] == xh[0, 0, :2, :2].max() and y[0, 1, 1, 1] == xh[0, 1].max()


def test_maxpool_matches_torch(backend):
    torch = pytest.importorskip("torch")
    for kernel, stride, padding in [(2, 2, 0), (3, 2, 1), (3, 1, 1), ((2, 3), (2, 1), (1, 0))]:
        x, pool = distinct(2, 3, 7, 6), MaxPool2d(kernel, stride, padding)
        y = pool.forward(x)
        dout = randn(*y.shape, seed=1)
        xt = torch.tensor(B.to_host(x), requires_grad=True)
        yt = torch.nn.functional.max_pool2d(xt, kernel, stride, padding)
        yt.backward(torch.tensor(B.to_host(dout)))
        np.testing.assert_array_equal(B.to_host(y), yt.detach().numpy())
        np.testing.assert_allclose(B.to_host(pool.backward(dout)), xt.grad.numpy(), rtol=1e-14)


def test_maxpool_float32_and_errors(backend):
    x = distinct(1, 2, 4, 4).astype(np.float32)
    pool = MaxPool2d(2)
    y = pool.forward(x)
    assert y.dtype == np.float32 and pool.backward(B.xp.ones_like(y)).dtype == np.float32
    with pytest.raises(ValueError, match="padding must be at most half the kernel size"):
        MaxPool2d(2, padding=2)
    with pytest.raises(ValueError, match=r"MaxPool2d: expected input \(B, C, H, W\), "
                                         r"got shape \(4, 4\)"):
        pool.forward(B.xp.ones((4, 4)))
    with pytest.raises(ValueError, match="MaxPool2d: expected a padded input of at least 2x2"):
        pool.forward(B.xp.ones((1, 1, 1, 4)))
