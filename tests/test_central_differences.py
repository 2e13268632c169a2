"""What central differences can measure (tinyvit/gradcheck/check.py): a right backward
passes where their truncation or their rounding is larger than the tolerance, and a
wrong one fails however small its gradient."""

import numpy as np

from tinyvit import gradient_check
from tinyvit.backend import rng
from tinyvit.gradcheck import check
from tinyvit.models import create_model
from tinyvit.nn.module import Module, Parameter

TINY = dict(embed_dim=3, num_heads=1, depth=2, image_size=6, patch_size=3, pool="mean")


def tiny_model(seed):
    """A right ViT with 3 channels (a LayerNorm of 3 entries bends sharply), and its input."""
    model = create_model("mnist", seed=seed, dtype="float64", **TINY)
    return model, np.random.default_rng(seed).standard_normal((2, 1, 6, 6))


def tiny_model_check(seed, **options):
    return gradient_check(*tiny_model(seed), repair=0, **options)


def test_truncation_beyond_the_tolerance_is_refined_away():
    """Seed 1's class token: D(h)'s O(h^2) error is 6.8e-7 of the gradient, past 1e-7;
    Richardson's (4 D(h) - D(2h)) / 3 is within it, on its own merits."""
    central = check.compare("cls_token", *class_token_gradients(1))
    assert 5e-7 < central.rel_err < 1e-6 and not central.within_noise()
    report = tiny_model_check(1)
    assert report.passed
    assert report["cls_token"].rel_err < 1e-7


def class_token_gradients(seed):
    """(the backward's, D(h)'s) gradient of the class token of ``tiny_model_check``'s model."""
    model, x = tiny_model(seed)
    dout = rng((0, check.DOUT_STREAM)).standard_normal((2, 10))  # the check's, at its seed 0
    model.zero_grad()
    model.forward(x)
    model.backward(dout)
    token = dict(model.named_parameters())["cls_token"]

    def loss():
        return float((model.forward(x) * dout).sum())

    return token.grad.copy(), check.numeric_gradient(loss, token.data)


def test_a_gradient_below_what_rounding_lets_differences_measure_passes_and_says_so():
    """Seed 5's blocks.0.norm2.weight: its gradient is 2.8e-6, and the rounding its
    differences carry 4e-11 (measured), so 1e-7 of it cannot be measured; the two are
    5e-12 apart, and the report says so beside the relative error."""
    report = tiny_model_check(5)
    tensor = report["blocks.0.norm2.weight"]
    assert report.passed and tensor.rel_err > 1e-7 and tensor.within_noise()
    assert 1e-11 < tensor.noise < 1e-10
    lines = str(report).splitlines()
    line = lines[lines.index("blocks.0.norm2 (LayerNorm)   docs/backprop.md#layernorm") + 1]
    apart = abs(tensor.analytic - tensor.numeric)
    assert line.startswith("  PASS  weight") and line.endswith(
        f", {apart:.1e} apart, within the rounding of the differences ({tensor.noise:.1e})")


def test_a_right_tiny_model_passes_for_every_seed():
    assert all(tiny_model_check(seed).passed for seed in range(8))


class Scale(Module):
    """y = 1e-6 x, whose backward gives 2e-6 dout: right in form, twice too large."""

    def forward(self, x):
        return 1e-6 * x

    def backward(self, dout):
        return 2e-6 * dout


def test_a_wrong_gradient_a_millionth_small_still_fails():
    report = gradient_check(Scale(), np.random.default_rng(0).standard_normal((4, 5)), repair=0)
    tensor = report["input"]
    assert not report.passed and not tensor.within_noise()
    assert abs(tensor.rel_err - 0.5) < 1e-6
    assert tensor.noise < 1e-8 * abs(tensor.numeric)


class LayerNormWithoutEps(Module):
    """A LayerNorm with beta = 50 (so sum|dout y| is large) whose backward divides by the
    standard deviation without eps, where its forward added eps = 1e-6."""

    def __init__(self, d):
        super().__init__()
        self.weight, self.bias = Parameter(np.ones(d)), Parameter(np.full(d, 50.0))

    def forward(self, x):
        xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-6)
        self.cache = (x, xhat)
        return self.weight.data * xhat + self.bias.data

    def backward(self, dout):
        x, xhat = self._take_cache()
        self.weight.grad += (dout * xhat).reshape(-1, x.shape[-1]).sum(0)
        self.bias.grad += dout.reshape(-1, x.shape[-1]).sum(0)
        g = dout * self.weight.data
        gx = (g * xhat).mean(-1, keepdims=True)
        return (g - g.mean(-1, keepdims=True) - xhat * gx) / x.std(-1, keepdims=True)


def test_a_backward_wrong_by_less_than_a_bound_on_ls_rounding_fails():
    """dx 3e-6 off (8e-7 of it): within 16 eps sum|dout y| / h (1.5e-5 here), a bound on
    the rounding of L tried as the allowance, but 12 times the rounding the differences
    carry, measured (2.6e-7)."""
    x = np.random.default_rng(1).standard_normal((2, 17, 32))
    report = gradient_check(LayerNormWithoutEps(32), x, repair=0)
    tensor = report["input"]
    assert not tensor.passed(report.tol) and not tensor.within_noise()
    assert 5e-7 < tensor.rel_err < 1e-6 and tensor.noise < 1e-6
    assert report["weight"].passed(report.tol) and report["bias"].passed(report.tol)


def test_given_gradients_carry_no_rounding_allowance():
    x = np.random.default_rng(0).standard_normal((4, 5))
    report = gradient_check(Scale(), x, repair=0, expected={"input": 2e-6 * np.ones_like(x)})
    assert report["input"].noise == 0.0


class Offset(Module):
    """y = 1e5 + 1e-6 a x: an output so large that the differences' rounding (3e-5 here)
    hides a's gradient (2.6e-6), whose backward gives twice it."""

    def __init__(self):
        super().__init__()
        self.a = Parameter(np.array([1e-3]))

    def forward(self, x):
        self.cache = x
        return 1e5 + 1e-6 * self.a.data * x

    def backward(self, dout):
        x = self._take_cache()
        self.a.grad += 2e-6 * (dout * x).sum()
        return 1e-6 * self.a.data * dout


def test_a_gradient_wrong_by_a_factor_within_the_rounding_still_fails():
    """A difference within the rounding passes only where the two agree to 1e-4: here
    they are 6% apart, so it fails, and the report says why it cannot tell more."""
    report = gradient_check(Offset(), np.random.default_rng(0).standard_normal((4, 10)), repair=0)
    tensor = report["a"]
    assert tensor.within_noise() and tensor.rel_err > 1e-2 and not tensor.passed(report.tol)
    line = next(line for line in str(report).splitlines() if line.startswith("  FAIL  a "))
    apart = abs(tensor.analytic - tensor.numeric)
    assert line.endswith(f", {apart:.1e} apart, within the rounding of the differences "
                         f"({tensor.noise:.1e}); the differences cannot tell it right or "
                         "wrong here (a large output over a small gradient?)")
