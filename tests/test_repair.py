"""The repair search (tinyvit/gradcheck/repair.py): each rewrite rule of the error model
applies and is reverted; a wrong backward is answered with the edit of its own line that
makes it right, quoted as the check prints it; the search keeps to its time; where no
edit of one or two lines fixes it, the difference is measured, never guessed."""

import ast
import inspect
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import jitter, load_script, randn
from tinyvit import backend as B
from tinyvit.gradcheck import gradient_check, seeded_dropout
from tinyvit.gradcheck.answer import changes
from tinyvit.gradcheck.diagnose import read_ratio
from tinyvit.gradcheck.error_model import COSTS, edits
from tinyvit.gradcheck.repair import Probe, _pairs, scope_of, search
from tinyvit.gradcheck.source import Source
from tinyvit.gradcheck.trace import trace
from tinyvit.nn import functional, layers
from tinyvit.nn.functional import normal_cdf, normal_pdf, softmax_backward
from tinyvit.nn.loss import SoftmaxCrossEntropy
from tinyvit.nn.module import Module, Parameter

xp = B.xp
HERE = Path(__file__).name


def line_of(function, text):
    """The file line of ``function`` that holds ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


# -- layers of this file, each with one mistake ------------------------------------------------


class ScaledLinear(layers.Linear):
    """A Linear whose backward runs through every construct the error model rewrites."""

    def backward(self, dout):
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)
        self.weight.grad += (dout2.T @ x2) * 1.0
        self.bias.grad += dout2.sum(axis=0)
        parts = [dout2 @ self.weight.data, xp.zeros_like(x2)]
        for part in reversed(parts[:1]):
            dx = part + parts[1][:, :]
        dx = softmax_backward(xp.ones_like(dx), dx) + xp.zeros_like(dx)
        return dx.reshape(*dout.shape[:-1], self.in_features).transpose(*range(dout.ndim))


class TransposedLinear(layers.Linear):
    def backward(self, dout):
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)
        self.weight.grad += dout2.T @ x2
        self.bias.grad += dout2.sum(axis=0)
        dx = dout2 @ self.weight.data.T  # the transpose of W, where W itself is meant
        return dx.reshape(*dout.shape[:-1], self.in_features)


class NoisyTanh(layers.Tanh):
    def backward(self, dout):
        y = self._take_cache()
        return dout * (1.3 - abs(y) ** 2.1)  # two numbers wrong, neither by a sign, 2 or 1/2


class Float32Tanh(layers.Tanh):
    def backward(self, dout):
        y = self._take_cache()
        return (dout * (1.0 - y * y)).astype(xp.float32)


class DroppedCore(layers.Attention):
    def attend_backward(self, dctx):
        q, k, v, A, Ad = self._take_cache()
        dAd = dctx @ v.swapaxes(-1, -2)
        dv = A.swapaxes(-1, -2) @ dctx  # A, not the dropped-out Ad the forward multiplied by
        dS = softmax_backward(A, self.attn_drop.backward(dAd))
        return dS @ k * self.scale, dS.swapaxes(-1, -2) @ q * self.scale, dv


class ForgetfulResidual(layers.Residual):
    def backward(self, dout):
        self.branch.backward(dout)
        return dout  # the branch's gradient thrown away


class DroppingTanh(layers.Tanh):
    def __init__(self):
        super().__init__()
        self.drop = layers.Dropout(0.3)

    def forward(self, x):
        return self.drop.forward(super().forward(x))

    def backward(self, dout):
        y = self._take_cache()
        return dout * (1.0 - y)  # the dropout's backward forgotten, and y^2 taken for y


class DroppedSoftmax(Module):
    """A softmax over rows, then dropout; the backward undoes them in the forward's order
    (which matters: the softmax's backward sums each row)."""

    def __init__(self):
        super().__init__()
        self.drop = layers.Dropout(0.3)

    def forward(self, x):
        self.cache = functional.softmax(x)
        return self.drop.forward(self.cache)

    def backward(self, dout):
        A = self._take_cache()
        d = softmax_backward(A, dout)
        d = self.drop.backward(d)
        return d


class TransposedTanh(layers.Tanh):
    def backward(self, dout):
        y = self._take_cache()
        return dout * (1.0 - y * y).T  # a transpose on an elementwise factor


class InPlaceTanh(layers.Tanh):
    def backward(self, dout):
        y = self._take_cache()
        dout *= 1.0 - y * y  # the caller's dout changed with it
        return dout


class UnguardedLinear(layers.Linear):
    def backward(self, dout):
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)
        self.weight.grad += dout2.T @ x2
        self.bias.grad += dout2.sum(axis=0)  # a layer without bias has no gradient to add to
        return (dout2 @ self.weight.data).reshape(*dout.shape[:-1], self.in_features)


class ProductRuleSwish(Module):
    """A layer of a user's own, y = x sigmoid(x), no reference anywhere."""

    def forward(self, x):
        s = 1 / (1 + xp.exp(-x))
        self.cache = (x, s)
        return x * s

    def backward(self, dout):
        x, s = self._take_cache()
        ds = s * (1 - s)
        return dout * x * ds  # d(x s) = s + x s': the first term forgotten


class Gate(Module):
    """y = x sigmoid(x W), its methods calling the layer ``this``: Python binds the
    first parameter to the instance whatever its name."""

    def __init__(this, dim):
        super().__init__()
        this.w = Parameter(randn(dim, dim, seed=5))

    def forward(this, x):
        g = 1 / (1 + xp.exp(-(x @ this.w.data)))
        this.cache = (x, g)
        return x * g

    def backward(this, dout):
        x, g = this._take_cache()
        dz = dout * x * g * (1 - g)
        this.w.grad += x.T @ dz
        return dout * g + dz @ this.w.data  # W where W^T is meant


class RootScaled(Module):
    """y = tanh(x W / sqrt(D)), the backward forgetting the scale on dx's way."""

    def __init__(self, dim):
        super().__init__()
        self.w = Parameter(randn(dim, dim, seed=6))

    def forward(self, x):
        self.cache = x
        return xp.tanh(x @ self.w.data / xp.sqrt(x.shape[-1]))

    def backward(self, dout):
        x = self._take_cache()
        dz = dout * (1 - xp.tanh(x @ self.w.data / xp.sqrt(x.shape[-1])) ** 2)
        self.w.grad += x.T @ dz / xp.sqrt(x.shape[-1])
        return dz @ self.w.data.T


class HardcodedRootScaled(RootScaled):
    """The scale of the backward's dx written as its value at D = 4."""

    def backward(self, dout):
        x = self._take_cache()
        dz = dout * (1 - xp.tanh(x @ self.w.data / xp.sqrt(x.shape[-1])) ** 2)
        self.w.grad += x.T @ dz / xp.sqrt(x.shape[-1])
        return dz @ self.w.data.T / 2


class HeadScaled(Module):
    """y = x W^T / d ** 0.5 for a number d the layer holds, the backward forgetting the
    scale in both of its gradients."""

    def __init__(self, dim, d):
        super().__init__()
        self.d, self.w = d, Parameter(randn(dim, dim, seed=7))

    def forward(self, x):
        self.cache = x
        return x @ self.w.data.T / self.d ** 0.5

    def backward(self, dout):
        x = self._take_cache()
        self.w.grad += dout.T @ x
        return dout @ self.w.data


class BatchMeanBias(Module):
    """y = (x + b) / len(x), the backward's 1/len(x) written as its value at a batch of 2."""

    def __init__(self, dim):
        super().__init__()
        self.b = Parameter(randn(dim, seed=8))

    def forward(self, x):
        self.cache = x
        return (x + self.b.data) / len(x)

    def backward(self, dout):
        x = self._take_cache()  # noqa: F841  (the learner kept x, and forgot len(x))
        self.b.grad += dout.sum(axis=0) / 2
        return dout / 2


class ScaledBranch(Module):
    """y = x + alpha f(x), the backward calling f's backward on dout, alpha forgotten."""

    def __init__(self, dim, alpha):
        super().__init__()
        self.alpha, self.fc = alpha, layers.Linear(dim, dim, rng=B.host_rng(0))

    def forward(self, x):
        return x + self.alpha * self.fc.forward(x)

    def backward(self, dout):
        return dout + self.fc.backward(dout)


class Halves(Module):
    """y = 2 a + b for the halves a, b of the last axis; the backward joins the halves'
    gradients along the first axis."""

    def forward(self, x):
        self.cache = x.shape[-1] // 2
        return 2 * x[..., :self.cache] + x[..., self.cache:]

    def backward(self, dout):
        self._take_cache()
        return xp.concatenate([2 * dout, dout], axis=0)


class Folded(Module):
    """y = a + b for the halves a, b of the last axis; the backward computes the half's
    width with /, a float that reshape refuses."""

    def forward(self, x):
        self.cache = x.shape
        half = x.shape[-1] // 2
        return x[..., :half] + x[..., half:]

    def backward(self, dout):
        shape = self._take_cache()
        half = shape[-1] / 2
        return xp.broadcast_to(dout[..., None, :], (*dout.shape[:-1], 2, half)).reshape(shape)


class HandDensityGELU(layers.GELU):
    def backward(self, dout):
        x = self._take_cache()
        pdf = xp.exp(-x * x) / np.sqrt(2 * np.pi)  # the density without its / 2
        return dout * (normal_cdf(x) + x * pdf)


class OutputForInputGELU(layers.GELU):
    def backward(self, dout):
        x = self._take_cache()
        y = x * normal_cdf(x)  # the forward's output, recomputed: right as it is
        return dout * (normal_cdf(x) + y * normal_pdf(x))  # y read where x is meant


class CoshTanh(Module):
    """y = tanh(x), the backward by 1 / cosh(x), its square forgotten."""

    def forward(self, x):
        self.cache = x
        return xp.tanh(x)

    def backward(self, dout):
        x = self._take_cache()
        return dout / xp.cosh(x)


class TwiceScaledDropout(layers.Dropout):
    def backward(self, dout):
        mask = self._take_cache()  # 0 or 1/(1-p) already
        return dout * mask / (1 - self.p)


class NamedScaleDropout(layers.Dropout):
    def backward(self, dout):
        mask = self._take_cache()  # 0 or 1/(1-p) already
        scale = 1.0 / (1.0 - self.p)
        return dout * mask * scale


class EveryOther(Module):
    """y = x[:, ::2], the cache holding twice the columns read; the backward halves them
    with /, floats that index nothing."""

    def forward(self, x):
        self.cache = x.shape, 2 * xp.arange(0, x.shape[1], 2)
        return x[:, ::2]

    def backward(self, dout):
        shape, twice = self._take_cache()
        dx = xp.zeros(shape)
        dx[:, twice / 2] = dout
        return dx


class WindowMean(Module):
    """Means of windows of k along the last axis, the rest left out; the backward takes
    the number of windows with /, a float, where a size equal to L // k (the batch of 2)
    would pass too."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        self.cache = x.shape
        windows = x.shape[1] // self.k
        return x[:, :windows * self.k].reshape(x.shape[0], windows, self.k).mean(axis=2)

    def backward(self, dout):
        B, L = self._take_cache()
        windows = L / self.k
        dx = xp.zeros((B, L))
        dx[:, :windows * self.k] = xp.repeat(dout / self.k, self.k, axis=1)
        return dx


class HalfSquaredTanh(layers.Tanh):
    def backward(self, dout):
        t = self._take_cache()
        return dout * (1 - t)  # tanh' = 1 - t^2


class MisgroupedTanh(layers.Tanh):
    def backward(self, dout):
        t = self._take_cache()
        return dout * (1 - t) ** 2  # tanh' = 1 - t^2


CUBIC_C, CUBIC_A = 0.8, 0.05


class TanhOfCubic(Module):
    """y = tanh(c (x + a x^3)); the backward recomputes the argument with x^2 for x^3 and
    takes its slope with x for x^2: each is a power of x one too low."""

    def forward(self, x):
        self.cache = x
        return xp.tanh(CUBIC_C * (x + CUBIC_A * x ** 3))

    def backward(self, dout):
        x = self._take_cache()
        c, a = CUBIC_C, CUBIC_A
        t = xp.tanh(c * (x + a * x ** 2))
        return dout * (1 - t * t) * c * (1 + 3 * a * x)


class LinearAndSquare(Module):
    """y = a x + b x^2, the backward with a and b exchanged between its two terms."""

    def __init__(self):
        super().__init__()
        self.a, self.b = 0.7, 1.9

    def forward(self, x):
        self.cache = x
        return self.a * x + self.b * x * x

    def backward(self, dout):
        x = self._take_cache()
        linear = dout * self.b  # self.a meant
        square = 2 * dout * x * self.a  # self.b meant
        return linear + square


class TwoTanh(Module):
    """Two Tanh layers in a row, the backward walking them with a slice that stops
    before the first."""

    def __init__(self):
        super().__init__()
        self.layers = [layers.Tanh(), layers.Tanh()]

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dout):
        for layer in self.layers[:0:-1]:
            dout = layer.backward(dout)
        return dout


class RowSummedBias(Module):
    """y = x + b; the backward sums the bias's gradient over the features, not the rows,
    and the += raises: (5,) does not fit (8,)."""

    def __init__(self, dim):
        super().__init__()
        self.b = Parameter(randn(dim, seed=9))

    def forward(self, x):
        self.cache = x.shape
        return x + self.b.data

    def backward(self, dout):
        self._take_cache()
        self.b.grad += dout.sum(axis=1)
        return dout


class RenormalizingCrossEntropy(SoftmaxCrossEntropy):
    def backward(self, dout=1.0):
        log_probs, t = self._take_cache()
        p = xp.exp(log_probs)
        p = p / p.sum()  # the whole batch's sum, where each row's is meant
        return dout * (p - t) / log_probs.shape[0]


class UnscaledCrossEntropy(SoftmaxCrossEntropy):
    def backward(self, dout=1.0):
        log_probs, t = self._take_cache()
        B = t.shape[0]
        return (xp.exp(log_probs) - t) / B  # dout left out


def scope(function, module, x, before_forward=None, reference=None):
    """The error model's Scope of ``function`` as ``module``'s backward runs it."""
    def forward():
        if before_forward:
            before_forward()
        return module.forward(x)

    probe = Probe(module, forward, randn(*forward().shape, seed=3))
    probe.start()
    _, recorded = trace(probe.backward)
    source = next(s for s in recorded.sources if s.function is function)
    return source, scope_of(recorded, source, {id(m) for m in probe.pending()}, reference)


def test_each_rule_applies_and_is_reverted():
    dropping = DroppingTanh()
    with B.default_dtype("float64"):
        built = [
            scope(ScaledLinear.backward, jitter(ScaledLinear(5, 4, rng=B.host_rng(0))),
                  randn(3, 5)),
            scope(ForgetfulResidual.backward, ForgetfulResidual(layers.Linear(
                4, 4, rng=B.host_rng(0))), randn(3, 4)),
            scope(DroppingTanh.backward, dropping, randn(3, 4), seeded_dropout(dropping),
                  reference=Source(layers.Tanh.backward).tree),
            scope(InPlaceTanh.backward, InPlaceTanh(), randn(3, 4)),
            scope(UnguardedLinear.backward, UnguardedLinear(4, 3, bias=False,
                                                           rng=B.host_rng(0)), randn(3, 4))]
    rules = set()
    for source, found_scope in built:
        original = ast.dump(source.tree)
        proposed = edits(source, found_scope)
        rules |= {edit.rule for edit in proposed}
        for edit in proposed:
            edit.apply()
            assert ast.dump(source.tree) != original, (edit.rule, edit.detail)
            assert source.compile() is not None  # it compiles, into the function's closure
            edit.revert()
            assert ast.dump(source.tree) == original, (edit.rule, edit.detail)
    assert rules == set(COSTS)


def test_the_product_rules_forgotten_term_is_found_in_a_layer_without_a_reference():
    with B.default_dtype("float64"):
        report = gradient_check(ProductRuleSwish(), randn(3, 4))
    line = line_of(ProductRuleSwish.backward, "return dout * x * ds")
    text = str(report).splitlines()
    head = next(i for i, t in enumerate(text) if t.startswith("the fix, found by trying "))
    assert text[head + 1:head + 5] == [
        f"  line {line} of tests/{HERE} (ProductRuleSwish.backward):",
        "        return dout * x * ds  # d(x s) = s + x s': the first term forgotten",
        "     -> return dout * x * ds + dout * s  # d(x s) = s + x s': the first term forgotten",
        "  the product rule's other term, dout * s, was missing: d(u v) = du v + u dv, and x * "
        "ds is one of its two terms alone"]


def fix_lines(report):
    """The lines of a report's fix: where, the line as written, the edit, and why."""
    text = str(report).splitlines()
    head = next(i for i, t in enumerate(text) if t.startswith("the fix, found by trying "))
    return text[head + 1:head + 5]


def test_a_layer_that_calls_itself_another_name_than_self_is_searched_the_same():
    with B.default_dtype("float64"):
        report = gradient_check(Gate(4), randn(3, 4))
    line = line_of(Gate.backward, "return dout * g")
    assert fix_lines(report) == [
        f"  line {line} of tests/{HERE} (Gate.backward):",
        "        return dout * g + dz @ this.w.data  # W where W^T is meant",
        "     -> return dout * g + dz @ this.w.data.T  # W where W^T is meant",
        "  by the matmul rule, Y = X Z gives dX = dY Z^T and dZ = X^T dY"]


def test_a_transpose_outside_a_matrix_product_is_not_explained_by_the_matmul_rule():
    with B.default_dtype("float64"):
        report = gradient_check(TransposedTanh(), randn(6, 6))  # square: the .T runs
    line = line_of(TransposedTanh.backward, "return dout * (1.0 - y * y).T")
    assert fix_lines(report) == [
        f"  line {line} of tests/{HERE} (TransposedTanh.backward):",
        "        return dout * (1.0 - y * y).T  # a transpose on an elementwise factor",
        "     -> return dout * (1.0 - y * y)  # a transpose on an elementwise factor",
        "  no transpose here: the matmul rule transposes a matrix product's operands (Y = X Z "
        "gives dX = dY Z^T); elsewhere each entry stays where it is"]


def test_the_layer_a_function_runs_as_a_method_of_is_its_first_parameter_by_any_name():
    with B.default_dtype("float64"):
        _, gate = scope(Gate.backward, Gate(4), randn(3, 4))
        _, softmax = scope(softmax_backward, jitter(ScaledLinear(5, 4, rng=B.host_rng(0))),
                           randn(3, 5))
    assert (gate.me, gate.inputs, gate.parameters) == ("this", ("dout", "x", "g"), ("w",))
    assert (softmax.me, softmax.selves) == (None, ())


def right_gate_backward(self, dout):
    """Gate's backward as a reference writes it: its layer called self."""
    x, g = self._take_cache()
    dz = dout * x * g * (1 - g)
    self.w.grad += x.T @ dz
    return dout * g + dz @ self.w.data.T


def test_a_references_expressions_are_offered_with_its_parameters_named_as_the_codes():
    with B.default_dtype("float64"):
        _, gate = scope(Gate.backward, Gate(4), randn(3, 4),
                        reference=Source(right_gate_backward).tree)
    assert "dz @ this.w.data.T" in {ast.unparse(term) for term in gate.terms}
    assert "this.w.grad += x.T @ dz" in gate.right


def test_a_scale_left_out_is_put_back_as_the_code_computes_it_not_as_its_value_here():
    # at D = 4 the scale is 1/2: "/ 2" would fix this shape alone
    with B.default_dtype("float64"):
        report = gradient_check(RootScaled(4), randn(3, 4))
    assert report["input"].findings == [
        "computed/expected = 2 everywhere: a factor of 2 too many: a value added 2 times, or "
        "a 1/2 left out, or a 1/sqrt(4) left out (the input has 4 along some axes)"]
    assert fix_lines(report)[1:3] == [
        "        return dz @ self.w.data.T",
        "     -> return dz @ self.w.data.T / xp.sqrt(x.shape[-1])"]


def test_a_scale_written_as_its_value_is_put_back_as_the_code_computes_it():
    # D = 9: the 2 written for sqrt(4) is 3 here, and "/ 3" would fit this shape alone
    with B.default_dtype("float64"):
        report = gradient_check(HardcodedRootScaled(9), randn(3, 9))
    assert fix_lines(report)[1:4] == [
        "        return dz @ self.w.data.T / 2",
        "     -> return dz @ self.w.data.T / xp.sqrt(x.shape[-1])",
        "  xp.sqrt(x.shape[-1]) where it says 2"]


def test_a_batch_size_written_as_a_number_is_put_back_as_len():
    with B.default_dtype("float64"):
        report = gradient_check(BatchMeanBias(4), randn(5, 4))
    assert [line.strip() for line in str(report).splitlines() if "->" in line] == [
        "-> self.b.grad += dout.sum(axis=0) / len(x)",
        "line {} of tests/{} (BatchMeanBias.backward): return dout / 2  ->  return dout / len(x)"
        .format(line_of(BatchMeanBias.backward, "return dout / 2"), HERE)]


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_a_factor_left_out_of_the_gradient_a_layers_backward_is_called_on_is_put_in(alpha):
    with B.default_dtype("float64"):
        report = gradient_check(ScaledBranch(4, alpha), randn(3, 4))
    assert fix_lines(report)[:3] == [
        f"  line {line_of(ScaledBranch.backward, 'return dout +')} of tests/{HERE} "
        "(ScaledBranch.backward):",
        "        return dout + self.fc.backward(dout)",
        "     -> return dout + self.fc.backward(dout * self.alpha)"]


def test_a_scale_of_the_layers_own_number_left_out_twice_is_put_back_twice():
    # d = 4: "/ 2" twice would fit this layer alone
    with B.default_dtype("float64"):
        report = gradient_check(HeadScaled(3, 4), randn(5, 3))
    lines = str(report).splitlines()
    assert [line.strip() for line in lines if line.strip().startswith("->")] == [
        "-> self.w.grad += dout.T @ x / self.d ** 0.5",  # not on x = self._take_cache(),
        "-> return dout @ self.w.data / self.d ** 0.5"]  # the forward's value, right as it is


class LambdaTanh(layers.Tanh):
    backward = lambda self, dout: dout * (1 + self._take_cache() ** 2)  # noqa: E731  (a - lost)


def test_a_backward_that_cannot_be_edited_says_so_rather_than_0_tried():
    with B.default_dtype("float64"):
        report = gradient_check(LambdaTanh(), randn(3, 4))
    assert "no edit was tried: no function the backward ran could be edited (a lambda, a " \
           "builtin, code typed at a prompt, or code the forward runs too)" in str(report)
    assert not report["input"].passed(1e-7)


def test_arrays_joined_along_another_axis_are_joined_along_the_forwards():
    with B.default_dtype("float64"):
        report = gradient_check(Halves(), randn(3, 8))
    change, = changes(report.fix)
    assert [line.strip() for line in change.after] == [
        "return xp.concatenate([2 * dout, dout], axis=-1)"]
    assert ("along axis -1: the axis along which the forward took the arrays apart (or put "
            "them together)") in str(report)


def test_a_whole_arrays_sum_meant_per_row_gets_its_axis_and_keepdims_in_one_edit():
    with B.default_dtype("float64"):
        report = gradient_check(RenormalizingCrossEntropy(), randn(4, 5), xp.arange(4) % 5)
    fix = changes(report.fix)
    assert [(c.before, c.after) for c in fix] == [(
        ["    p = p / p.sum()  # the whole batch's sum, where each row's is meant"],
        ["    p = p / p.sum(axis=1, keepdims=True)  # the whole batch's sum, where each row's "
         "is meant"])]


def test_a_size_read_from_a_shape_is_kept_and_the_factor_goes_into_the_gradient():
    with B.default_dtype("float64"):  # B = t.shape[0] / dout passes too, but reads oddly
        report = gradient_check(UnscaledCrossEntropy(), randn(4, 5), xp.arange(4) % 5)
    assert [(c.before, c.after) for c in changes(report.fix)] == [(
        ["    return (xp.exp(log_probs) - t) / B  # dout left out"],
        ["    return (xp.exp(log_probs) - t) / B * dout  # dout left out"])]


@pytest.mark.parametrize("module, x, before, after", [
    (Folded(), (3, 8), "half = shape[-1] / 2", "half = shape[-1] // 2"),
    (TwoTanh(), (3, 4), "for layer in self.layers[:0:-1]:", "for layer in self.layers[::-1]:"),
    (HandDensityGELU(), (3, 4), "pdf = xp.exp(-x * x) / np.sqrt(2 * np.pi)  # the density "
     "without its / 2", "pdf = xp.exp(-x * x / 2) / np.sqrt(2 * np.pi)  # the density without "
     "its / 2"),
    (CoshTanh(), (3, 4), "return dout / xp.cosh(x)", "return dout / xp.cosh(x) ** 2"),
    (OutputForInputGELU(), (3, 4), "return dout * (normal_cdf(x) + y * normal_pdf(x))  # y read "
     "where x is meant", "return dout * (normal_cdf(x) + x * normal_pdf(x))  # y read where x "
     "is meant"),
    (EveryOther(), (3, 6), "dx[:, twice / 2] = dout", "dx[:, twice // 2] = dout"),
    (WindowMean(4), (2, 10), "windows = L / self.k", "windows = L // self.k"),
    (MisgroupedTanh(), (3, 4), "return dout * (1 - t) ** 2  # tanh' = 1 - t^2",
     "return dout * (1 - t ** 2)  # tanh' = 1 - t^2"),

], ids=["a size divided with /", "a slice that stops before entry 0",
        "a factor inside exp's argument", "a square forgotten", "the output read for the input",
        "indices divided with /", "a size divided with /, not another size in its place",
        "a square taken of the parentheses"])
def test_a_learners_slip_is_fixed_where_it_is(module, x, before, after):
    with B.default_dtype("float64"):
        report = gradient_check(module.astype("float64"), randn(*x))
    first = changes(report.fix)[0]
    assert (first.before[0].strip(), first.after[0].strip()) == (before, after)


@pytest.mark.parametrize("kind, before, after", [
    (TwiceScaledDropout, "return dout * mask / (1 - self.p)", "return dout * mask"),
    (NamedScaleDropout, "scale = 1.0 / (1.0 - self.p)", "scale = 1.0")])
def test_a_factor_too_many_is_taken_away_not_undone_nor_floored(kind, before, after):
    """Not / (1), nor * (1.0 - p) after it, nor 1.0 // (1.0 - p), which is 1 for p = 0.3."""
    dropout = kind(0.3)
    with B.default_dtype("float64"):
        report = gradient_check(dropout, randn(3, 4), before_forward=seeded_dropout(dropout))
    assert [(c.before[0].strip(), c.after[0].strip()) for c in changes(report.fix)] == [
        (before, after)]


def test_an_edit_that_wraps_a_term_goes_in_with_an_edit_inside_it():
    """dout / xp.cosh(x) * f keeps dout / xp.cosh(x): its cosh may still be squared."""
    with B.default_dtype("float64"):
        source, found = scope(CoshTanh.backward, CoshTanh(), randn(3, 4))
    proposed = edits(source, found)
    wraps = [e for e in proposed if e.detail.get("what") == "added"
             and ast.unparse(e.old[0]) == "dout / xp.cosh(x)"]
    squared = next(e for e in proposed if e.detail.get("what") == "squared")
    assert wraps and not any(wrap.clashes(squared) or squared.clashes(wrap) for wrap in wraps)
    sign = next(e for e in proposed if e.rule == "sign" and ast.unparse(e.old[0]) ==
                "dout / xp.cosh(x)")  # -(dout / xp.cosh(x)): it wraps too
    assert not sign.clashes(squared)


def test_a_name_multiplied_by_itself_is_said_to_be_a_square():
    with B.default_dtype("float64"):
        report = gradient_check(HalfSquaredTanh(), randn(3, 4))
    assert fix_lines(report)[1:] == [
        "        return dout * (1 - t)  # tanh' = 1 - t^2",
        "     -> return dout * (1 - t * t)  # tanh' = 1 - t^2",
        "  t squared: the derivation has a square here (tanh(u)' = 1 - tanh(u)^2, (u^2)' = 2 u)"]


def test_two_powers_too_low_are_raised_not_a_coefficient_made_an_array():
    """a = CUBIC_A * x would make up for both at once."""
    with B.default_dtype("float64"):
        report = gradient_check(TanhOfCubic(), randn(3, 4))
    assert [(c.before[0].strip(), c.after[0].strip()) for c in changes(report.fix)] == [
        ("t = xp.tanh(c * (x + a * x ** 2))", "t = xp.tanh(c * (x + a * x ** 2 * x))"),
        ("return dout * (1 - t * t) * c * (1 + 3 * a * x)",
         "return dout * (1 - t * t) * c * (1 + 3 * a * x * x)")]


def test_two_steps_of_a_chain_in_the_forwards_order_are_put_in_reverse():
    softmax = DroppedSoftmax()
    with B.default_dtype("float64"):
        report = gradient_check(softmax, randn(3, 4), before_forward=seeded_dropout(softmax))
    assert [(c.before[0].strip(), c.after[0].strip()) for c in changes(report.fix)] == [
        ("d = softmax_backward(A, dout)", "d = self.drop.backward(dout)"),
        ("d = self.drop.backward(d)", "d = softmax_backward(A, d)")]
    assert ("  each step's backward needs the gradient of the step after it: the reverse order "
            "of the forward") in str(report).splitlines()


def test_parentheses_in_the_wrong_place_are_moved_and_said_so():
    with B.default_dtype("float64"):
        report = gradient_check(MisgroupedTanh(), randn(3, 4))
    assert fix_lines(report)[3] == ("  grouped as 1 - t ** 2: the parentheses decide which "
                                    "operation applies first")


def test_two_names_exchanged_between_two_lines_are_paired_as_one_mistake():
    """Among the pairs of the first kind (no promising edit given), beside the same
    mistake made twice."""
    with B.default_dtype("float64"):
        source, found = scope(LinearAndSquare.backward, LinearAndSquare(), randn(3, 4))
    exchanges = [{(e.line, e.detail["was"], e.detail["now"]) for e in (first, second)}
                 for first, second in _pairs([], edits(source, found))
                 if first.rule == second.rule == "name"
                 and (first.detail["was"], first.detail["now"]) == (second.detail["now"],
                                                                    second.detail["was"])]
    line = line_of(LinearAndSquare.backward, "linear = dout * self.b")
    assert {(line, "self.b", "self.a"), (line + 1, "self.a", "self.b")} in exchanges


def test_a_wrong_backward_is_answered_with_the_fix_on_its_own_line():
    with B.default_dtype("float64"):
        report = gradient_check(jitter(TransposedLinear(6, 6, rng=B.host_rng(0))), randn(2, 6))
    line = line_of(TransposedLinear.backward, "dx = dout2 @ self.weight.data.T")
    text = str(report).splitlines()
    head = next(i for i, t in enumerate(text) if t.startswith("the fix, found by trying "))
    assert text[head].endswith("edits of the code in " + text[head].split(" in ")[1])
    assert text[head + 1:head + 5] == [
        f"  line {line} of tests/{HERE} (TransposedLinear.backward):",
        "        dx = dout2 @ self.weight.data.T  # the transpose of W, where W itself is meant",
        "     -> dx = dout2 @ self.weight.data  # the transpose of W, where W itself is meant",
        "  by the matmul rule, Y = X Z gives dX = dY Z^T and dZ = X^T dY; the derivation: "
        "dx = dy W"]
    assert text[head + 5] == "  the derivation of this step: docs/backprop.md#linear"
    assert report.fix is not None and not report.passed


def test_a_name_for_another_of_its_shape_is_fixed_with_dropout_on():
    with B.default_dtype("float64"):
        core = jitter(DroppedCore(8, 2, attn_dropout=0.3, rng=B.host_rng(0)))
        report = gradient_check(core, randn(2, 5, 8), before_forward=seeded_dropout(core))
    change, = changes(report.fix)
    assert (change.function, change.line) == ("DroppedCore.attend_backward", line_of(
        DroppedCore.attend_backward, "dv = A.swapaxes"))
    assert [line.strip() for line in change.after] == [
        "dv = Ad.swapaxes(-1, -2) @ dctx  # A, not the dropped-out Ad the forward multiplied by"]
    assert "Ad, not A, is what the forward used here" in str(report)


def test_a_mistake_one_level_down_is_fixed_where_it_is():
    """A mistake in softmax_backward, which Attention.attend_backward calls, is fixed in
    functional.py's line, planted there as if the file said so."""
    mutants = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "mutants.py")
    line = line_of(functional.softmax_backward, "return A * (dA - (dA * A)")
    before = ["    return A * (dA - (dA * A).sum(axis=-1, keepdims=True))"]
    after = ["    return A * (dA + (dA * A).sum(axis=-1, keepdims=True))"]
    with B.default_dtype("float64"), mutants.planted(functional.softmax_backward,
                                                      [(line, before, after)]):
        attention = jitter(layers.Attention(8, 2, rng=B.host_rng(0)))
        report = gradient_check(attention, randn(2, 5, 8))
    change, = changes(report.fix)
    assert (change.function, change.line) == ("softmax_backward", line)
    assert str(change.path).endswith("tinyvit/nn/functional.py")


# A whole ViT's backward runs many functions; the search proposes edits of the lines that ran
# just before the first wrong gradient first, and of the rest only when those are spent.
WHOLE_MODEL_MISTAKES = [
    # every value right, the position embedding's gradient not doubled by a second backward
    ("    self.pos_embed.grad += dx.sum(axis=0, keepdims=True)",
     "    self.pos_embed.grad = dx.sum(axis=0, keepdims=True)"),
    # every parameter right, the input's gradient negated after the last layer ran
    ("    return self.patch_embed.backward(dx[:, 1:])  # (B, C, H, W)",
     "    return -self.patch_embed.backward(dx[:, 1:])  # (B, C, H, W)"),
]


@pytest.mark.parametrize("before, after", WHOLE_MODEL_MISTAKES)
def test_a_whole_models_mistake_is_searched_where_the_gradients_point(monkeypatch, before,
                                                                       after):
    from tinyvit.gradcheck import repair
    from tinyvit.gradcheck.cases import TINY_VIT
    from tinyvit.models import ViT
    mutants = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "mutants.py")
    proposed = set()
    monkeypatch.setattr(repair, "edits", lambda source, *rest: proposed.add(source.name)
                        or edits(source, *rest))
    line = line_of(ViT.backward, before.strip())
    with B.default_dtype("float64"), mutants.planted(ViT.backward, [(line, [before], [after])]):
        report = gradient_check(jitter(ViT(**TINY_VIT)), randn(2, 2, 8, 8))
    change, = changes(report.fix)
    assert (change.function, change.line, change.after) == ("ViT.backward", line, [before])
    assert proposed == {"ViT.backward", "PatchEmbed.backward", "Patchify.backward"}


def test_a_backward_that_raises_is_searched_at_the_line_that_raised_and_its_callers_first(
        monkeypatch):
    from tinyvit.gradcheck import repair
    from tinyvit.gradcheck.cases import TINY_VIT
    from tinyvit.models import ViT
    mutants = load_script(Path(__file__).resolve().parents[1] / "benchmarks" / "mutants.py")
    before, after = "        dx = block.backward(dx)", "        dx = block.backward(dx[:, 1:])"
    line = line_of(ViT.backward, before.strip())
    with B.default_dtype("float64"):
        vit, x, dout = jitter(ViT(**TINY_VIT)), randn(2, 2, 8, 8), randn(2, 3, seed=2)
        vit.forward(x)
        expected = {"input": vit.backward(dout)}
        expected.update((name, p.grad.copy()) for name, p in vit.named_parameters())
        proposed = set()
        monkeypatch.setattr(repair, "edits", lambda source, *rest: proposed.add(source.name)
                            or edits(source, *rest))
        with mutants.planted(ViT.backward, [(line, [before], [after])]):
            vit.forward(x)
            with pytest.raises(ValueError, match="Linear.backward: expected dout of the output"):
                vit.backward(dout)
            found = search(Probe(vit, lambda: vit.forward(x), dout), expected, 1e-8)
    change, = changes(found.fix)
    assert (change.function, change.line) == ("ViT.backward", line)
    # the functions on the stack when it raised, from the ViT down to the Linear that refused
    # the gradient's shape
    assert proposed == {"ViT.backward", "ClassAttentionBlock.backward", "Residual.backward",
                        "Sequential.backward", "Linear.backward"}


def test_a_backward_that_raises_is_reported_with_its_line_and_searched():
    with B.default_dtype("float64"):
        report = gradient_check(RowSummedBias(8), randn(5, 8))
    line = line_of(RowSummedBias.backward, "self.b.grad += dout.sum(axis=1)")
    assert [c.problem for c in report.checks] == [
        "the backward raised ValueError: operands could not be broadcast together with "
        "shapes (8,) (5,) (8,) at line "
        f"{line} of tests/{HERE}: self.b.grad += dout.sum(axis=1)"] * 2
    change, = changes(report.fix)
    assert [text.strip() for text in change.after] == ["self.b.grad += dout.sum(axis=0)"]
    assert not report.passed and "FAIL" in str(report)


def test_the_search_keeps_to_its_time_and_then_measures():
    with B.default_dtype("float64"):
        started = time.perf_counter()
        report = gradient_check(NoisyTanh(), randn(2, 5, 8), repair=1.5)  # of CPU time: all
        spent = time.perf_counter() - started  # its edits take 0.2-0.5 s, by the processor
    assert report.fix is None and report.search.seconds < 1.6 and spent < 10
    text = str(report)
    assert not report.search.ran_out  # every edit tried: no edit makes it right
    assert (f"none of the edits of one or two lines that the search tries makes every "
            f"gradient right ({report.search.tried} tried in {report.search.seconds:.2f} s); "
            "what differs is measured under each failing gradient") in text
    assert "it differs at 80 of 80 entries, all of them" in text


def test_a_search_whose_time_is_up_says_it_tried_some_edits_not_all():
    with B.default_dtype("float64"):
        report = gradient_check(NoisyTanh(), randn(2, 5, 8), repair=1e-3)
    assert report.fix is None and report.search.ran_out
    assert (f"no edit of one or two lines that makes every gradient right was found in the "
            f"{report.search.seconds:.2f} s the search has ({report.search.tried} edits tried, "
            "not all of them); what differs is measured under each failing gradient"
            ) in str(report)


def test_where_no_search_runs_the_difference_is_measured_in_named_values():
    class Doubled(layers.Tanh):
        def backward(self, dout):
            y = self._take_cache()
            return dout * (1.0 - y * y) + 0.5 * dout

    with B.default_dtype("float64"):
        report = gradient_check(Doubled(), randn(2, 5, 8), repair=0)
    assert report.search is None
    assert report["input"].findings[0].startswith(
        "yours minus the right one = 0.5 x dout (exactly, to ")


def test_a_backward_that_changes_its_upstream_gradient_in_place_is_fixed():
    with B.default_dtype("float64"):
        report = gradient_check(InPlaceTanh(), randn(2, 5, 8))
    change, = changes(report.fix)
    assert [line.strip() for line in change.after] == ["dout = dout * (1.0 - y * y)"]


def test_a_parameter_that_a_layer_may_lack_is_guarded():
    with B.default_dtype("float64"):
        layer = jitter(UnguardedLinear(4, 3, bias=False, rng=B.host_rng(0)))
        probe = Probe(layer, lambda: layer.forward(randn(2, 4)), randn(2, 3, seed=2))
        right = jitter(layers.Linear(4, 3, bias=False, rng=B.host_rng(0)))
        right.forward(randn(2, 4))
        expected = {"input": right.backward(randn(2, 3, seed=2)), "weight": right.weight.grad}
        found = search(probe, expected, 1e-10)
    change, = changes(found.fix)
    assert [line.strip() for line in change.after] == [
        "if self.bias is not None:", "self.bias.grad += dout2.sum(axis=0)"]


def test_a_gradient_of_another_dtype_is_named_first_and_alone():
    with B.default_dtype("float64"):
        report = gradient_check(Float32Tanh(), randn(2, 5, 8))
    assert report["input"].findings == [
        "computed is float32, not float64 like the input and the parameters: an array made "
        "with another dtype, or converted, on the way"]
    assert "FAIL  input         (2, 5, 8)     not compared" in str(report)


def test_a_ratio_is_said_only_where_it_means_something():
    assert read_ratio(1 / 86439277800028704) is None
    assert read_ratio(0.5) == ("1/2", "a sum over 2 values taken as their mean, or a factor of "
                                      "1/2 too many; a gradient adds up the shares of every "
                                      "value that used it")
    assert read_ratio(0.5, counts={4, 16}, batch={4})[1].startswith(
        "a sum over 2 values taken as their mean, or a factor of 1/2 too many, or a 1/sqrt(4) "
        "too many (the input has 4 along some axes)")
    assert read_ratio(2 / 3) == ("2/3", "a constant factor is wrong")
    assert read_ratio(1.7320508, head_dim=3)[0] == "1.73205 = sqrt(Dh), Dh = 3"
    assert read_ratio(1 / 0.7, named=[("1/(1-p)", 1 / 0.7)])[1] == \
        "a factor of 1/(1-p) too many (or missing)"
    assert read_ratio(np.pi) is None and read_ratio(1.0 + 1e-9) is None
    assert read_ratio(6 ** 0.5, counts={2, 3, 6}) == (
        "2.44949 = sqrt(6)", "a factor of sqrt(6) too many, or a 1/sqrt(6) left out (the input "
        "has 6 along some axes)")
    assert read_ratio(6 ** 0.5) is None  # no 6 in the input


@pytest.mark.parametrize("rule", sorted(COSTS))
def test_every_rule_has_its_reason(rule):
    from tinyvit.gradcheck.answer import REASONS
    assert rule in REASONS


def test_a_search_of_code_that_is_right_finds_nothing_to_do():
    with B.default_dtype("float64"):
        layer = jitter(layers.Linear(4, 3, rng=B.host_rng(0)))
        x = randn(2, 4)
        y = layer.forward(x)
        dout = randn(*y.shape, seed=4)
        layer.zero_grad()
        layer.forward(x)
        right = {"input": layer.backward(dout).copy(), "weight": layer.weight.grad.copy(),
                 "bias": layer.bias.grad.copy()}
        found = search(Probe(layer, lambda: layer.forward(x), dout), right, 1e-7)
    assert found.fix is None and found.tried == 0


def test_the_search_leaves_alone_the_code_that_hands_arrays_to_unchecked_loops():
    """The compiled kernels' and mkl's functions pass arrays to compiled loops and gemm,
    which check no bounds: an edited size there wrote past an array and aborted the
    process. The fast layers' own methods stay editable."""
    from tinyvit.fast import cpu, cpu_numba_gelu, cpu_numba_norm, cpu_numba_softmax, mkl
    from tinyvit.gradcheck.trace import editable_code
    for function in (cpu_numba_norm.layer_norm_backward, cpu_numba_gelu.gelu,
                     cpu_numba_softmax.softmax_block, mkl.matmul):
        assert not editable_code(function.__code__, own_only=False)
    assert editable_code(cpu.LayerNorm.backward_residual.__code__, own_only=False)
