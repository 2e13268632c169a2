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
the index of that worst entry. A second backward, without ``zero_grad``, must
double every parameter's gradient: gradients accumulate (``+=``), so that the
gradients of residual branches and shared layers add up. A tensor that fails
either is diagnosed in the layer's own terms (``diagnose.py``).
"""

import dataclasses
import itertools

from ..backend import rng as device_rng
from ..backend import to_host, xp
from .diagnose import Context, diagnose
from .report import GradCheckReport

DOUT_STREAM = 1  # dout is drawn from rng((seed, DOUT_STREAM))
ACCUMULATION_TOL = 1e-12  # a second backward doubles a gradient to rounding


@dataclasses.dataclass
class TensorCheck:
    """The check of one tensor: the input, or a parameter by its name in the module."""

    name: str
    shape: tuple
    rel_err: float
    where: tuple  # index of the worst entry
    analytic: float  # both values at that index
    numeric: float
    accumulates: bool = True  # a second backward added to the first
    findings: list = dataclasses.field(default_factory=list)  # what is wrong, if anything

    def passed(self, tol):
        return self.rel_err <= tol and self.accumulates


def gradient_check(module, x, *args, h=1e-5, seed=0, before_forward=None, wrt_input=True,
                   tol=1e-7):
    """Check ``module.backward`` against central differences, in float64.

    ``module.forward(x, *args)``: only ``x`` and the parameters are differentiated
    (``args`` are e.g. integer labels). The module and ``x`` must be float64 (use
    ``backend.default_dtype("float64")`` when building, or ``module.astype``).
    ``before_forward`` is called before every forward: use it to restore a random
    generator so dropout draws the same mask each time. Returns a
    ``GradCheckReport``: a tensor passes when its relative error is at most
    ``tol``; call ``.assert_ok()`` on it in tests.
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
    forward()
    module.backward(dout)  # again, without zero_grad: every gradient must double
    twice = {name: p.grad for name, p in module.named_parameters()}
    context = Context(module, x, dout)
    checks = []
    for name, value, analytic in tensors:
        numeric = numeric_gradient(loss, value, h)
        check = compare(name, analytic, numeric)
        check.accumulates = name == "input" or doubled(twice[name], analytic)
        if not check.passed(tol):
            check.findings = diagnose(check, to_host(analytic), to_host(numeric), context, tol)
        checks.append(check)
    return GradCheckReport(checks, h, tol, module)


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


def compare(name, analytic, numeric):
    """The ``TensorCheck`` of a computed gradient against an expected one (numeric, or
    another implementation's): the max-norm relative error and where it is worst."""
    diff = xp.abs(analytic - numeric)
    scale = float(xp.maximum(xp.abs(analytic), xp.abs(numeric)).max())
    worst = diff.argmax()  # flat index, a 0-d array (CuPy's unravel_index takes no Python int)
    where = tuple(int(i) for i in xp.unravel_index(worst, numeric.shape))
    rel_err = float(diff.max()) / scale if scale > 0 else 0.0
    return TensorCheck(name, tuple(numeric.shape), rel_err, where,
                       float(analytic.reshape(-1)[worst]), float(numeric.reshape(-1)[worst]))


def doubled(twice, once):
    """Whether a second backward doubled a gradient (the same computation twice adds
    the same values: to rounding, relative to the gradient's scale)."""
    return float(xp.abs(twice - 2 * once).max()) <= ACCUMULATION_TOL * float(xp.abs(once).max())
