"""Gradient checking: hand-written backward passes against central finite differences.

For a module with output y = f(x; params), pick a random upstream gradient
``dout`` (fixed by a seed) and the scalar L = sum(dout * y). The module's backward
of ``dout`` must equal dL/dx and dL/dparam. Each entry is compared with the
central difference

    numeric_i = (L(theta + h e_i) - L(theta - h e_i)) / (2 h),   h = 1e-5,

whose error is O(h^2 |L'''|) from truncation plus O(eps_machine |L| / h) from
rounding; in float64, h = 1e-5 balances the two at about 1e-10 (on a small ViT
it gave the smallest errors of h in 1e-6 ... 1e-4). A random ``dout`` matters: with dout = 1,
a softmax whose backward returns zeros would pass, since sum(softmax(x)) is constant.

The error reported for each tensor is the max-norm relative error

    rel_err = max_i |analytic_i - numeric_i| / max_i max(|analytic_i|, |numeric_i|),

i.e. the worst entry's error relative to the tensor's scale (an entry-by-entry
ratio would blow up on entries that are legitimately near zero); ``where`` is
the index of that worst entry.
"""

import dataclasses
import itertools

from ..backend import host_rng, to_device, xp
from ..backend import rng as device_rng
from ..nn.layers import Dropout


@dataclasses.dataclass
class TensorCheck:
    name: str
    shape: tuple
    rel_err: float
    where: tuple  # index of the worst entry
    analytic: float  # both values at that index
    numeric: float


class GradCheckReport:
    """The per-tensor results of ``gradient_check``; ``str()`` prints a table."""

    def __init__(self, checks, h):
        self.checks = checks
        self.h = h

    @property
    def max_rel_err(self):
        return max(c.rel_err for c in self.checks)

    def __getitem__(self, name):
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def __str__(self):
        lines = [f"{'tensor':<28}{'shape':<18}{'rel_err':>10}  worst at (analytic vs numeric)"]
        for c in self.checks:
            lines.append(
                f"{c.name:<28}{str(c.shape):<18}{c.rel_err:>10.2e}  "
                f"{c.where} ({c.analytic:.10g} vs {c.numeric:.10g})"
            )
        return "\n".join(lines)

    def assert_ok(self, tol=1e-7):
        """Raise AssertionError naming every tensor whose rel_err exceeds ``tol``."""
        bad = [c for c in self.checks if not c.rel_err <= tol]
        if bad:
            raise AssertionError(
                f"gradient check failed (h={self.h:g}, tol={tol:g}):\n{self}\n"
                + "\n".join(f"  {c.name}: rel_err {c.rel_err:.3e} > {tol:g}" for c in bad)
            )
        return self


DOUT_STREAM = 1  # dout is drawn from rng((seed, DOUT_STREAM))


def gradient_check(module, x, *args, h=1e-5, seed=0, before_forward=None, wrt_input=True):
    """Check ``module.backward`` against central differences, in float64.

    ``module.forward(x, *args)``: only ``x`` and the parameters are differentiated
    (``args`` are e.g. integer labels). The module and ``x`` must be float64 (use
    ``backend.default_dtype("float64")`` when building, or ``module.astype``).
    ``before_forward`` is called before every forward: use it to restore a random
    generator so dropout draws the same mask each time. Returns a
    ``GradCheckReport``; call ``.assert_ok(tol)`` on it in tests.
    """
    if x.dtype != xp.float64 or any(p.data.dtype != xp.float64 for p in module.parameters()):
        raise ValueError("gradient_check: the input and the parameters must be float64")

    def forward():
        if before_forward is not None:
            before_forward()
        return module.forward(x, *args)

    y = forward()
    # dout from a stream of its own: an input drawn with the same integer seed differs from it
    dout = 1.0 if y.ndim == 0 else device_rng((seed, DOUT_STREAM)).standard_normal(y.shape)

    def loss():
        return float((forward() * dout).sum())

    module.zero_grad()
    forward()
    dx = module.backward(dout)
    tensors = [("input", x, dx)] if wrt_input else []
    tensors += [(name, p.data, p.grad.copy()) for name, p in module.named_parameters()]
    checks = [_check_tensor(name, value, analytic, loss, h) for name, value, analytic in tensors]
    return GradCheckReport(checks, h)


def randn(*shape, seed=0):
    """Standard normal float64 values on the active backend (the same on every backend)."""
    return to_device(host_rng(seed).standard_normal(shape))


def jitter(module, scale=0.2, seed=1):
    """Move every parameter off its neat initial value (unit gammas, zero biases),
    which could hide a backward that mixes them up. Returns the module."""
    for i, p in enumerate(module.parameters()):
        p.data[...] += to_device(host_rng((seed, i)).standard_normal(p.shape)) * scale
    return module


def seeded_dropout(module, seed=5):
    """A ``before_forward`` for ``gradient_check``: gives every Dropout in ``module``
    one generator, restarted before each forward, so that every forward of the check
    draws the same masks."""
    def reseed():
        generator = device_rng(seed)
        for _, m in module.named_modules():
            if isinstance(m, Dropout):
                m.rng = generator
    return reseed


def numeric_gradient(loss, value, h=1e-5):
    """Central differences of the scalar ``loss()`` w.r.t. every entry of ``value``,
    each perturbed in place and restored (``value`` may be a strided view)."""
    grad = xp.zeros(value.shape, dtype=xp.float64)
    for index in itertools.product(*(range(n) for n in value.shape)):
        original = float(value[index])
        value[index] = original + h
        plus = loss()
        value[index] = original - h
        minus = loss()
        value[index] = original
        grad[index] = (plus - minus) / (2 * h)
    return grad


def _check_tensor(name, value, analytic, loss, h):
    numeric = numeric_gradient(loss, value, h)
    diff = xp.abs(analytic - numeric)
    scale = float(xp.maximum(xp.abs(analytic), xp.abs(numeric)).max())
    worst = diff.argmax()  # flat index, a 0-d array (CuPy's unravel_index takes no Python int)
    where = tuple(int(i) for i in xp.unravel_index(worst, value.shape))
    rel_err = float(diff.max()) / scale if scale > 0 else 0.0
    return TensorCheck(
        name, tuple(value.shape), rel_err, where,
        float(analytic.reshape(-1)[worst]), float(numeric.reshape(-1)[worst]),
    )
