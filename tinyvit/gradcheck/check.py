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
the index of that worst entry. A tensor over ``tol`` is measured again before it
fails (``measured``): Richardson's extrapolation takes the truncation away, and a
difference within the rounding its differences carry, itself measured, passes where
the two agree to 1e-4. A second backward, without ``zero_grad``, must
double every parameter's gradient: gradients accumulate (``+=``), so that the
gradients of residual branches and shared layers add up. The backward must leave ``dout``
as it came, for its caller reads it too: it gets a copy (so that the differences are
measured against the ``dout`` drawn), and a copy it changed fails the check. When a
tensor fails any of these, edits of the backward's code are searched for the fix
(``repair.py``), and each failing tensor is diagnosed in the layer's own terms
(``diagnose.py``).
"""

import dataclasses
import itertools
import math
import traceback

from ..backend import copied, get_backend, is_array, xp
from ..backend import rng as device_rng
from ..checks import check_array
from .answer import shown
from .diagnose import Context, diagnose
from .repair import BUDGET, Probe, search, within_rounding
from .report import GradCheckReport
from .trace import in_libraries

DOUT_STREAM = 1  # dout is drawn from rng((seed, DOUT_STREAM))
ACCUMULATION_TOL = 1e-12  # a second backward doubles a gradient to rounding
# the rounding a numeric gradient carries, as a multiple of how far its two Richardson estimates
# (from h and 2h, from 2h and 4h) are apart at most
ROUNDING = 8.0


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
    leaves_upstream: bool = True  # the backward left its upstream gradient as it came
    findings: list = dataclasses.field(default_factory=list)  # what is wrong, if anything
    problem: str = None  # a gradient of another type, shape or dtype, or not finite
    noise: float = 0.0  # the error the numeric gradient may carry from rounding (absolute)

    def passed(self, tol):
        rounded = within_rounding(abs(self.analytic - self.numeric), self.rel_err, self.noise)
        return self.problem is None and self.accumulates and self.leaves_upstream and (
            self.rel_err <= tol or rounded)

    def within_noise(self):
        """Whether the worst difference is one the numeric gradient's rounding can make:
        a gradient too small for central differences to measure to ``tol``."""
        return abs(self.analytic - self.numeric) <= self.noise


def check_float64(module, x):
    """A ValueError naming the input, or the first parameter, that is not float64, and how
    to make it so."""
    check_array(x, "gradient_check", "the input, a float64 array")
    if x.dtype != xp.float64:
        raise ValueError(f"gradient_check: the input must be float64, got {x.dtype} (x.astype("
                         "'float64'))")
    for name, p in module.named_parameters():
        if p.data.dtype != xp.float64:
            raise ValueError(f"gradient_check: the parameters must be float64, got {name} in "
                             f"{p.data.dtype} (build the module inside "
                             "backend.default_dtype('float64'), or call module.astype('float64'))")


def gradient_check(module, x, *args, h=1e-5, seed=0, before_forward=None, wrt_input=True,
                   tol=1e-7, expected=None, repair=BUDGET):
    """Check ``module.backward`` against central differences, in float64.

    ``module.forward(x, *args)``: only ``x`` and the parameters are differentiated
    (``args`` are e.g. integer labels). The module and ``x`` must be float64 (use
    ``backend.default_dtype("float64")`` when building, or ``module.astype``).
    ``before_forward`` is called before every forward: use it to restore a random
    generator so dropout draws the same mask each time. ``expected`` ({"input": ...,
    each parameter's name: ...}) stands in for the central differences where they are
    known already (computed once for many checks, or another implementation's). When a
    gradient fails, edits of the code the backward ran are searched for the one that
    makes every gradient right, for at most ``repair`` seconds (0: no search;
    ``repair.py``). Returns a ``GradCheckReport``: a tensor passes when its relative
    error is at most ``tol``, or where its worst difference is within the rounding its
    numeric gradient was measured to carry (``measured``) and the two agree to 1e-4
    (``repair.within_rounding``); call ``.assert_ok()`` on it in tests. A backward that
    raises fails every tensor with what it raised and the line, and is searched as well.
    """
    check_float64(module, x)

    def forward():
        if before_forward is not None:
            before_forward()
        return module.forward(x, *args)

    y = forward()
    # dout from a stream of its own: an input drawn with the same integer seed differs from it;
    # for a scalar (a loss) a number other than 1, so that a backward that drops it fails
    draw = device_rng((seed, DOUT_STREAM)).standard_normal(y.shape)
    dout = float(draw) if y.ndim == 0 else draw

    def loss():
        return float((forward() * dout).sum())

    module.zero_grad()
    forward()
    given = copied(dout)  # the backward's own: dout stays as drawn, for the differences
    try:
        dx = module.backward(given)
    except Exception as error:  # said, and searched, as any wrong backward is
        return raised_report(error, module, forward, loss, dout, x, wrt_input, h, tol, repair,
                             expected)
    tensors = [("input", x, dx)] if wrt_input else []
    tensors += [(name, p.data, p.grad.copy()) for name, p in module.named_parameters()]
    forward()
    module.backward(copied(dout))  # again, without zero_grad: every gradient must double
    twice = {name: p.grad for name, p in module.named_parameters()}
    right, checks = {}, []
    for name, value, analytic in tensors:
        if expected is None:
            right[name], check = measured(name, analytic, loss, value, h, tol)
        else:
            right[name], check = expected[name], compare(name, analytic, expected[name])
        check.accumulates = name == "input" or check.problem is not None or doubled(
            twice[name], analytic)
        checks.append(check)
    if checks and is_array(dout):
        checks[0].leaves_upstream = bool((given == dout).all())
    found = None
    if repair and not all(c.passed(tol) for c in checks):
        found = search(Probe(module, forward, dout), right, tol, budget=repair,
                       noise={c.name: c.noise for c in checks})
    context = Context(module, x, dout, found)
    for check, (name, _, analytic) in zip(checks, tensors):
        if not check.passed(tol):
            check.findings = diagnose(check, analytic, right[name], context, tol)
    return GradCheckReport(checks, h, tol, module, found)


def raised_report(error, module, forward, loss, dout, x, wrt_input, h, tol, repair,
                  expected=None):
    """The report of a backward that raised: every tensor failing with what it raised and
    the line it came from (the last outside Python's libraries), against central
    differences (or ``expected``), and the search for the edit that makes it run and be
    right."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not in_libraries(f.filename)]
    at = f" at line {frames[-1].lineno} of {shown(frames[-1].filename)}: " \
         f"{frames[-1].line}" if frames else ""
    message = " ".join(str(error).split())
    problem = f"the backward raised {type(error).__name__}: {message}{at}"
    tensors = [("input", x)] if wrt_input else []
    tensors += [(name, p.data) for name, p in module.named_parameters()]
    right = {name: numeric_gradient(loss, value, h) if expected is None else expected[name]
             for name, value in tensors}
    checks = [TensorCheck(name, tuple(right[name].shape), math.inf, (), math.nan, math.nan,
                          findings=[problem], problem=problem) for name, _ in tensors]
    found = search(Probe(module, forward, dout), right, tol, budget=repair) if repair else None
    return GradCheckReport(checks, h, tol, module, found)


def measured(name, analytic, loss, value, h, tol):
    """(numeric gradient, its ``TensorCheck``): central differences D(h), and where the
    analytic gradient fails them, Richardson's extrapolation R = (4 D(h) - D(2h)) / 3,
    whose truncation is O(h^4) where D(h)'s is O(h^2), and the rounding it carries,
    measured: ``ROUNDING`` times how far R is at most from the same extrapolation from 2h
    and 4h (its rounding about the same, its truncation as negligible). The estimate the
    analytic gradient is nearer to is kept (near a kink, such as ReLU's at 0, D(2h) can be
    the worse)."""
    numeric = numeric_gradient(loss, value, h)
    check = compare(name, analytic, numeric)
    if check.problem is not None or check.passed(tol):
        return numeric, check
    twice, four_times = (numeric_gradient(loss, value, k * h) for k in (2, 4))
    refined = (4 * numeric - twice) / 3
    noise = ROUNDING * float(xp.abs(refined - (4 * twice - four_times) / 3).max())
    first, second = dataclasses.replace(check, noise=noise), compare(name, analytic, refined, noise)
    return (refined, second) if second.rel_err < first.rel_err else (numeric, first)


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


def compare(name, analytic, numeric, noise=0.0):
    """The ``TensorCheck`` of a computed gradient against an expected one (numeric, or
    another implementation's): the max-norm relative error and where it is worst; a
    problem of type before any value (another shape or dtype, not an array, not finite).
    ``noise``: the absolute error the expected gradient may carry."""
    problem = type_problem(analytic, numeric)
    if problem:
        return TensorCheck(name, tuple(numeric.shape), math.inf, (), math.nan, math.nan,
                           problem=problem, noise=noise)
    diff = xp.abs(analytic - numeric)
    scale = float(xp.maximum(xp.abs(analytic), xp.abs(numeric)).max())
    worst = diff.argmax()  # flat index, a 0-d array (CuPy's unravel_index takes no Python int)
    where = tuple(int(i) for i in xp.unravel_index(worst, numeric.shape))
    rel_err = float(diff.max()) / scale if scale > 0 else 0.0
    return TensorCheck(name, tuple(numeric.shape), rel_err, where,
                       float(analytic.reshape(-1)[worst]), float(numeric.reshape(-1)[worst]),
                       noise=noise)


def type_problem(computed, expected):
    """What is wrong with a gradient before its values: not an array of the active backend,
    another shape or dtype, entries that are not finite; None when nothing is."""
    if not is_array(computed):
        where = type(computed)
        return (f"computed is a {where.__module__}.{where.__name__}, not an array of the "
                f"active backend ({get_backend()})")
    if computed.shape != expected.shape:
        return f"computed has shape {tuple(computed.shape)} where {tuple(expected.shape)} is due"
    if computed.dtype != expected.dtype:
        return (f"computed is {computed.dtype}, not {expected.dtype} like the input and the "
                f"parameters: an array made with another dtype, or converted, on the way")
    bad = int((~xp.isfinite(computed)).sum())
    if bad:
        return (f"{bad} of {computed.size} computed entries are not finite (nan or inf): a "
                "division by zero or an overflow on the way")
    return None


def doubled(twice, once):
    """Whether a second backward doubled a gradient (the same computation twice adds
    the same values: to rounding, relative to the gradient's scale)."""
    return float(xp.abs(twice - 2 * once).max()) <= ACCUMULATION_TOL * float(xp.abs(once).max())
