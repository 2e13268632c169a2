"""What a failing gradient got wrong, said in the layer's own terms, each finding verified
on the numbers before it is said.

For a tensor that fails its check, ``diagnose`` compares the computed gradient with the
expected one and reports, in this order:

- a problem of type before any value (``check.type_problem``): another shape or dtype,
  not an array of the backend, entries that are not finite: that alone;
- a gradient assigned instead of accumulated (a second backward left it as it was);
- a constant ratio computed/expected, said only where it is constant to 1e-6 and is a
  small fraction or a named quantity of the layer: 0 (a term never added), -1 (a sign),
  1/M (a sum over M rows taken as their mean), a loss's B (its mean taken as a sum),
  sqrt(Dh) or 1/sqrt(Dh) (attention's scale missing or applied twice), a factor the
  layer holds (self.scale, 1/(1-p));
- the expected gradient transposed, or its values in other places; the upstream gradient
  ``dout`` passed on as it came;
- where the error sits: the q, k or v rows of a fused qkv projection and which heads,
  whole rows or whole columns of a weight;
- an invariant of the derivation broken (LayerNorm's input gradient sums to zero over the
  features; each row of softmax cross-entropy's logit gradient sums to zero; the key
  bias's gradient is exactly zero), a term of the derivation missing (GELU's x phi(x),
  LayerNorm's mean(g));
- where the repair search found no fix (``repair.py``), the difference measured
  (``difference.py``): a combination of values the backward had at hand, and which
  entries, rows or heads differ.

Shapes: M rows, D features, NH heads, Dh = D / NH (the legend heads docs/backprop.md).
"""

import dataclasses
import fractions
import math

import numpy as np  # the diagnosis works on host copies

from ..backend import is_array, to_host
from ..nn import layers
from ..nn.functional import normal_cdf, normal_pdf, standardize
from ..nn.loss import SoftmaxCrossEntropy
from .difference import measured

FLAT = 1e-6  # a ratio is constant when every entry is within this of it, relative
CLOSE = 1e-6  # two gradients are the same when they differ by this, relative to their scale
MEANINGFUL = 1e-2  # entries below this share of the largest are left out of ratios
MOST_LISTED = 6  # rows, columns or heads named one by one at most
SMALL = 16  # a ratio p/q is a small fraction when q and |p| are at most this

ASSIGNED = ("assigned, not accumulated: a second backward without zero_grad left it as it "
            "was instead of doubling it; gradients add up (+=), so that residual branches "
            "and shared layers sum")

# what a backward that wrote into its upstream gradient is told, after "the backward" or "your
# backward"
IN_PLACE = ("changes its upstream gradient in place (dout, or a name for the same array, with "
            "*=, -=, += or a slice written): dout is its caller's too; compute into an array "
            "of your own")


@dataclasses.dataclass
class Context:
    """What the diagnosis may look at besides the two gradients: the module checked,
    its input, the upstream gradient of the check, and the repair search's ``Search``
    (None where none ran)."""

    module: object
    x: object
    dout: object
    search: object = None

    def owner(self, name):
        """(the layer holding parameter ``name``, its attribute name in the layer above,
        the layer above): for "blocks.0.attn.qkv.weight", the qkv Linear, "qkv" and
        the Attention."""
        path = name.rsplit(".", 1)[0] if "." in name else ""
        modules = dict(self.module.named_modules())
        parent_path, _, attribute = path.rpartition(".")
        return modules.get(path), attribute, modules.get(parent_path if path else None)


def diagnose(check, computed, expected, context, tol):
    """The findings for a tensor that failed its check, one line each (the gradients on
    the active backend, or the host)."""
    if check.problem:
        return [check.problem]
    findings = [] if check.leaves_upstream else [f"the backward {IN_PLACE}"]
    findings += [] if check.accumulates else [ASSIGNED]
    if check.rel_err <= tol:
        return findings
    computed, expected = to_host(computed), to_host(expected)
    said = _overall(check.name, computed, expected, context)
    said += _where(check.name, computed, expected, context, tol)
    layer = _layer(check.name, computed, expected, context)
    said += layer
    missing = any(finding.endswith(" is missing") for finding in layer)  # measured already
    if (context.search is None or context.search.fix is None) and not missing:
        said += measured(computed, expected, _values(check.name, context), tol, where=not said)
    return findings + said


def _values(name, context):
    """What the measured difference may be made of: dout, the arrays the backward named
    (from the repair search's trace), the derivation's terms of the layer."""
    values = []
    if name == "input" and is_array(context.dout):
        values.append(("dout", context.dout))
    if name == "input":
        values += [(f"the term {label}", value) for label, value in
                   _terms(context.module, context.x, context.dout).items()]
    if context.search is not None:
        values += [(f"{local} (in {function})", value)
                   for function, local, value in context.search.trace.arrays()]
    return values


# -- the whole tensor -------------------------------------------------------------------


def _overall(name, computed, expected, context):
    """Zero, a constant ratio, the transpose, entries moved, or dout as it came."""
    if not computed.any():
        return ["computed is zero everywhere: this gradient is never added"]
    ratio = constant_ratio(computed, expected)
    if ratio is not None:
        read = read_ratio(ratio, _head_dim(name, context), _rows(context),
                          _named(name, context), _counts(context), _batch_rows(context))
        return [f"computed/expected = {read[0]} everywhere: {read[1]}"] if read else []
    if computed.ndim == 2 and computed.shape[0] == computed.shape[1] and _same(computed,
                                                                               expected.T):
        return ["computed is the expected gradient transposed: an (in, out) matrix where "
                "(out, in) is meant (dW = dy^T x, not x^T dy)"]
    if _same(np.sort(computed, axis=None), np.sort(expected, axis=None)):
        return ["computed holds the expected values in other places: entries moved wrong (a "
                "reshape or transpose in the wrong order, two axes swapped)"]
    if name == "input" and _same(computed, to_host(context.dout)):
        return ["computed is dout as it came: the backward passes the upstream gradient on "
                f"unchanged{_passed_on_hint(context.module)}"]
    return []


def constant_ratio(computed, expected):
    """computed / expected when it is one number for every entry (and computed is zero
    where expected is), else None."""
    scale = np.abs(expected).max()
    if scale == 0:
        return None
    meaningful = np.abs(expected) > MEANINGFUL * scale
    ratios = computed[meaningful] / expected[meaningful]
    ratio = float(np.median(ratios))
    flat = np.abs(ratios - ratio).max() <= FLAT * max(1.0, abs(ratio))
    largest = max(scale, np.abs(computed).max())
    everywhere = np.abs(computed - ratio * expected).max() <= CLOSE * largest
    return ratio if flat and everywhere else None


def read_ratio(ratio, head_dim=None, rows=None, named=(), counts=(), batch=()):
    """(a ratio as text, what it means) where it is a quantity of the layer or a small
    fraction; None for any other number, which would mean nothing to a reader.
    ``rows``: the rows a loss averages over; ``named``: [(name, value)] of the layer;
    ``counts``: how many values its input holds along some of its axes (a sum over them
    taken as a mean gives 1/count); ``batch``: its rows (its first axis, its leading
    axes together). A whole number n, or 1/n, is read as each mistake it may be: a sum
    taken as a mean (or the reverse), a factor n left out or added, a 1/sqrt(n^2) where
    the input holds n^2 values along some axes; sqrt(n) where it holds n."""
    if head_dim and math.isclose(ratio, math.sqrt(head_dim), rel_tol=1e-6):
        return (f"{ratio:.6g} = sqrt(Dh), Dh = {head_dim}",
                "the 1/sqrt(Dh) scale of the scores is missing in the backward"
                + _also_whole(head_dim, "or a factor of {} too many"))
    if head_dim and math.isclose(ratio, 1 / math.sqrt(head_dim), rel_tol=1e-6):
        return (f"{ratio:.6g} = 1/sqrt(Dh), Dh = {head_dim}",
                "the 1/sqrt(Dh) scale is applied twice"
                + _also_whole(head_dim, "or a stray factor of 1/{}"))
    if math.isclose(ratio, -1.0, rel_tol=1e-6):
        return "-1", "a sign is wrong"
    if ratio == 0 or math.isclose(ratio, 1.0, rel_tol=1e-6):
        return None  # right to 1e-6, or zero where it matters: no factor to name
    parts = round(1 / ratio)
    counted = set(counts) | set(range(SMALL + 1))  # a count of the input's values, or small
    if parts >= 2 and parts in counted and math.isclose(ratio * parts, 1.0, rel_tol=1e-6):
        return (f"1/{parts}", f"a sum over {parts} values{_which(parts, batch, counts)} taken as "
                f"their mean, or a factor of 1/{parts} too many{_root(parts, counts, 'too many')}"
                "; a gradient adds up the shares of every value that used it")
    times = round(ratio)
    if times >= 2 and times == rows and math.isclose(ratio, times, rel_tol=1e-6):
        return f"{times}", (f"a mean over {times} values (the rows of the batch) taken as their "
                            f"sum: the 1/{times} of the mean is missing")
    for name, value in named:
        for text, factor in ((name, value), (_inverse(name), 1 / value)):
            if math.isclose(ratio, factor, rel_tol=1e-6):
                return f"{ratio:.6g} = {text}", f"a factor of {text} too many (or missing)"
    if times >= 2 and times in counted and math.isclose(ratio, times, rel_tol=1e-6):
        return f"{times}", (f"a factor of {times} too many: a value added {times} times, or a "
                            f"1/{times} left out{_root(times, counts, 'left out')}")
    for n, text in ((round(ratio * ratio), "sqrt"), (round(1 / ratio ** 2), "1/sqrt")):
        if n >= 2 and n in counts and math.isclose(ratio * ratio, n if text == "sqrt" else 1 / n,
                                                   rel_tol=1e-6):
            other = "1/sqrt" if text == "sqrt" else "sqrt"
            return (f"{ratio:.6g} = {text}({n})", f"a factor of {text}({n}) too many, or a "
                    f"{other}({n}) left out (the input has {n} along some axes)")
    fraction = fractions.Fraction(ratio).limit_denominator(SMALL)
    if abs(fraction.numerator) <= SMALL and math.isclose(ratio, fraction, rel_tol=1e-6):
        return f"{fraction}", "a constant factor is wrong"
    return None


def _counts(context):
    """The numbers of values the input, or the upstream gradient, holds along any of its
    axes together (the rows a parameter's gradient sums over are some of them)."""
    found = set()
    for shape in (getattr(context.x, "shape", ()), getattr(context.dout, "shape", ())):
        found |= {math.prod(shape[i] for i in range(len(shape)) if mask >> i & 1)
                  for mask in range(1, 2 ** len(shape))}
    return found


def _named(name, context):
    """The numbers the layer holds that a gradient may be off by: its attributes (the
    scale of attention, the p of dropout as 1/(1-p))."""
    layer = context.module if name == "input" else context.owner(name)[2] or context.module
    found = []
    for attribute, value in vars(layer).items():
        if isinstance(value, float) and value not in (0.0, 1.0):
            found.append((f"self.{attribute}", value))
            if attribute == "p" and value < 1:
                found.append(("1/(1-p)", 1 / (1 - value)))
    return found


def _inverse(name):
    """1/name as it reads: "1/(1-p)" gives "(1-p)", not "1/1/(1-p)"; "1 - p" gives
    "1/(1 - p)"."""
    if name.startswith("1/"):
        return name[2:]
    return f"1/({name})" if any(c in name for c in " +-*/") else f"1/{name}"


def _which(n, batch, counts):
    """What n values are, where the input says: its rows, or a count along some axes."""
    if n in batch:
        return " (the rows of the batch)"
    return f" (the input has {n} along some axes)" if n in counts else ""


def _root(n, counts, how):
    """Where the input holds n^2 values along some axes, the reading of n as 1/sqrt(n^2)."""
    return (f", or a 1/sqrt({n * n}) {how} (the input has {n * n} along some axes)"
            if n * n in counts else "")


def _batch_rows(context):
    """The input's rows: its first axis, and its leading axes together."""
    shape = getattr(context.x, "shape", ())
    return {shape[0], math.prod(shape[:-1])} if len(shape) >= 2 else set()


def _rows(context):
    """The rows a loss averages over (its input's leading axes), or None for a layer
    that takes no mean over its rows."""
    if not isinstance(context.module, SoftmaxCrossEntropy):
        return None
    return math.prod(context.x.shape[:-1])


def _also_whole(head_dim, other):
    """Where sqrt(Dh) is a whole number k, the same ratio is also a plain factor of k:
    ``other`` with k, as a second reading; else nothing."""
    k = math.isqrt(head_dim)
    return f", {other.format(k)}" if k * k == head_dim else ""


def _same(a, b):
    return a.shape == b.shape and np.abs(a - b).max() <= CLOSE * max(np.abs(b).max(), 1e-300)


def _passed_on_hint(module):
    if isinstance(module, layers.Dropout):
        return " (the forward's mask is not applied: dx = dout * mask)"
    if isinstance(module, layers.Residual):
        return " (the skip's share alone: the branch's gradient is not added, dx = dout + df)"
    return ""


def _head_dim(name, context):
    layer, _, parent = context.owner(name) if name != "input" else (context.module, "", None)
    for candidate in (layer, parent):
        if hasattr(candidate, "head_dim"):
            return candidate.head_dim
    return None


# -- where in the tensor ------------------------------------------------------------------


def _where(name, computed, expected, context, tol):
    layer, attribute, parent = context.owner(name) if name != "input" else (None, "", None)
    if attribute == "qkv" and hasattr(parent, "num_heads"):
        return _qkv_parts(name, computed, expected, parent, tol)
    if computed.ndim == 2 and name.rsplit(".", 1)[-1] == "weight":  # an (out, in) matrix
        return _rows_and_columns(computed, expected, tol)
    return []


def _qkv_parts(name, computed, expected, attention, tol):
    """The fused projection's rows (or bias entries) are q, k, v stacked, each split into
    NH heads of Dh rows: which part and which heads are wrong, and how."""
    NH, Dh = attention.num_heads, attention.head_dim
    scale = max(np.abs(computed).max(), np.abs(expected).max())
    findings, verdicts = [], {}
    for p, part in enumerate("qkv"):
        verdicts[part] = []
        for h in range(NH):
            rows = slice((p * NH + h) * Dh, (p * NH + h + 1) * Dh)
            verdicts[part].append(_verdict(computed[rows], expected[rows], tol * scale, Dh))
        findings.append(f"{part} {'rows' if computed.ndim == 2 else 'entries'}, "
                        f"{_by_head(verdicts[part])}")
    if name.endswith("qkv.bias"):
        findings += _key_bias_is_zero(computed[NH * Dh:2 * NH * Dh], expected, verdicts["q"])
    return findings


def _verdict(computed, expected, error, head_dim):
    """How one head's rows of q, k or v compare: "right" within ``error``, "zero", a
    constant ratio, or "wrong"."""
    if np.abs(computed - expected).max() <= error:
        return "right"
    if not computed.any():
        return "zero"
    ratio = constant_ratio(computed, expected)
    if ratio is None:
        return "wrong"
    read = read_ratio(ratio, head_dim)
    return f"computed/expected = {read[0]} ({read[1]})" if read else "wrong"


def _by_head(verdicts):
    if len(set(verdicts)) == 1:
        return f"every head: {verdicts[0]}"
    return "; ".join(f"head {h}: {v}" for h, v in enumerate(verdicts))


def _key_bias_is_zero(key_bias, expected, q_verdicts):
    """The key bias adds the same q . b_k to every score of a row, and each row of
    the softmax's input gradient dS sums to zero, so its gradient is exactly zero.
    With the query's gradient right, or right in every head but for a constant factor
    (a scale), dS = dq / (k scale) is right too, and the mistake is in dk's own formula;
    with dq wrong otherwise, dS or both formulas may be."""
    size = np.abs(key_bias).max()
    if size <= CLOSE * max(np.abs(expected).max(), 1e-300):
        return []
    if all(v == "right" for v in q_verdicts):
        cause = "dq, which uses the same dS, is right, so dS is"
    elif all(v == "right" or v.startswith("computed/expected") for v in q_verdicts):
        cause = "dq, which uses the same dS, is right but for a constant factor, so dS is"
    else:
        return [f"{KEY_BIAS} {size:.3g}: dq is wrong too, so the mistake is in dS, which both "
                f"use (the softmax backward's row-sum term, dS = A * (dA - sum_j dA_j A_j)), "
                f"or in the formulas of dq and dk both"]
    return [f"{KEY_BIAS} {size:.3g}: {cause}: dk's own formula is wrong, dk = dS^T q scale"]


KEY_BIAS = ("the key bias's gradient must be exactly zero (it adds the same q.b to every score "
            "of a row, and each row of dS sums to zero) but reaches")


def _rows_and_columns(computed, expected, tol):
    """Whole rows, or whole columns, of an (out, in) weight that are wrong."""
    scale = max(np.abs(computed).max(), np.abs(expected).max())
    bad = np.abs(computed - expected) > tol * scale
    rows, columns = np.flatnonzero(bad.all(axis=1)), np.flatnonzero(bad.all(axis=0))
    if 0 < len(rows) < bad.shape[0] and bad.sum() == len(rows) * bad.shape[1]:
        return [f"wrong in whole rows {_listed(rows)} (output units), right in the others"]
    if 0 < len(columns) < bad.shape[1] and bad.sum() == len(columns) * bad.shape[0]:
        return [f"wrong in whole columns {_listed(columns)} (input features), right in the others"]
    return []


def _listed(indices):
    shown = ", ".join(str(i) for i in indices[:MOST_LISTED])
    return shown + (f" and {len(indices) - MOST_LISTED} more" if len(indices) > MOST_LISTED else "")


# -- the layer's own derivation --------------------------------------------------------------


def _layer(name, computed, expected, context):
    """Invariants and terms of the checked layer's derivation, for its input gradient."""
    module = context.module
    if name != "input":
        return []
    findings = []
    if isinstance(module, layers.LayerNorm):
        findings += _features_sum_to_zero(computed)
    if isinstance(module, SoftmaxCrossEntropy):
        findings += _rows_sum_to_zero(computed)
    formula = next((f for kind, f in FORMULAS if isinstance(module, kind)), None)
    terms = _terms(module, context.x, context.dout)
    missing = expected - computed
    return findings + [f"the term {term} of {formula} is missing" for term, value in
                       terms.items() if _same(missing, np.broadcast_to(to_host(value),
                                                                       missing.shape))]


FORMULAS = ((layers.LayerNorm, "dx = rstd * (g - mean(g) - xhat * mean(g * xhat))"),
            (layers.GELU, "y' = Phi(x) + x * phi(x)"))


def _terms(module, x, dout):
    """The terms of a layer's input gradient by its derivation, computed on the active
    backend from its input, the upstream gradient and its parameters: {label: value}."""
    if isinstance(module, layers.LayerNorm):
        xhat, rstd, _, _ = standardize(x, -1, module.eps)
        g = dout * module.weight.data  # the gradient at xhat
        return {"-rstd * mean(g)": -rstd * g.mean(axis=-1, keepdims=True),
                "-rstd * xhat * mean(g * xhat)": -rstd * xhat * (g * xhat).mean(
                    axis=-1, keepdims=True)}
    if isinstance(module, layers.GELU) and module.approximate == "none":
        return {"Phi(x)": dout * normal_cdf(x), "x * phi(x)": dout * x * normal_pdf(x)}
    return {}


def _features_sum_to_zero(computed):
    sums = _row_sums(computed)
    if sums is None:
        return []
    return [f"the input gradient must sum to zero over the features of each row (adding a "
            f"constant to a row changes nothing) but its rows sum to up to {sums:.3g}"]


def _rows_sum_to_zero(computed):
    """Softmax cross-entropy's invariant: dlogits = (p - t) / B, and p and t each sum to
    1 over the classes, so every row of the logits' gradient sums to zero."""
    sums = _row_sums(computed)
    if sums is None:
        return []
    return [f"each row of the logits' gradient must sum to zero (p = softmax(z) and the target "
            f"t each sum to 1; adding a constant to a row of logits changes nothing) but its "
            f"rows sum to up to {sums:.3g}"]


def _row_sums(computed):
    """The largest sum of a row (over the last axis) of a gradient whose rows must sum
    to zero, or None where every row does, to rounding."""
    sums = np.abs(computed.sum(axis=-1)).max()
    return sums if sums > CLOSE * np.abs(computed).max() * computed.shape[-1] else None
