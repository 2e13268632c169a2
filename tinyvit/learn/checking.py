"""Checking an exercise: the learner's backward against the library's, in stages that
stop at the first failure, each failure one paragraph in the learner's terms.

The stages, for every case of the exercise (several shapes, batch 1 and odd sizes
among them), in float64 on NumPy, and again on CuPy where a GPU is present:

1. not a blank: the backward runs (a NotImplementedError means not written yet);
2. shapes: every gradient has its array's shape;
3. accumulation: two backward passes double every parameter's ``.grad``;
4. invariants the derivation gives (rows that sum to zero, a gradient that is zero);
5. the values against the library's reference backward on the same input and
   upstream gradient: the intermediates first where the exercise keeps them
   (exact, close, max difference, as "Becoming a backprop ninja" compares), then the
   input's gradient and every parameter's, with the gradient check's diagnosis;
6. central differences (``tinyvit.gradcheck``), with its diagnosis.

``check`` records each result in the workbook's progress file, for ``learn status``.
"""

import importlib.util
import inspect
import json
import sys
import traceback
from pathlib import Path

import numpy as np  # the comparisons and the shape watch work on host arrays

from ..backend import (
    cupy_available,
    default_dtype,
    get_backend,
    is_array,
    on_cpu,
    to_host,
    using_backend,
)
from ..backend import rng as device_rng
from ..gradcheck import gradient_check
from ..gradcheck.check import compare, doubled
from ..gradcheck.diagnose import Context, diagnose
from .exercises import EXERCISES, by_name, derivation

TOL = 1e-7  # the gradient check's bar (the library's backward agrees to about 1e-9)
SAME = 1e-10  # yours and the library's agree to this, relative: rounding, in float64
PROGRESS = ".learn-progress.json"  # in the workbook's folder
MARKER = "learn.json"  # what makes a folder a workbook
PACKAGE = Path(__file__).resolve().parent.parent  # tinyvit's own files, in a traceback


class ExerciseFailed(AssertionError):
    """An exercise's check failed; the message is one paragraph saying why."""


class NotWritten(ExerciseFailed):
    """The exercise's blank is still blank."""


def check(yours, exercise=None):
    """Check your version of an exercise's backward (a class or a function) against
    the library's, in stages; raise ``ExerciseFailed`` with a paragraph at the first
    failure, else print PASS. ``exercise`` is its name ("linear") where ``yours``
    alone does not tell it. Works the same from pytest and from a notebook cell."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    ex = _exercise(yours, exercise)
    progress = Progress.of(yours)
    try:
        _own_method(ex, yours)  # stage 1 before any case: not tinyvit's backward inherited
        for backend in ("numpy", "cupy") if cupy_available() else ("numpy",):
            with using_backend(backend), default_dtype("float64"):
                for index, case in enumerate(ex.cases):
                    _check_case(ex, yours, case, f"case {index + 1} of {len(ex.cases)}")
    except NotWritten:
        progress.record(ex.number, "blank")
        raise
    except ExerciseFailed:
        progress.record(ex.number, "fail")
        raise
    progress.record(ex.number, "pass")
    print(f"exercise {ex.number} ({ex.title}): PASS, every stage of {len(ex.cases)} cases")


def _exercise(yours, name):
    if name is not None:
        return by_name(name)
    matches = [ex for ex in EXERCISES if (ex.yours == yours.__name__)
               or (inspect.isclass(yours) and not ex.is_function
                   and issubclass(yours, ex.reference))]
    if len(matches) != 1:
        raise ValueError(f"check({yours.__name__}): name the exercise, as check({yours.__name__}, "
                         f"\"{matches[0].name if matches else 'linear'}\")")
    return matches[0]


def _own_method(ex, yours):
    """A class that does not define the exercise's method runs the library's, which
    would pass: said as a blank."""
    if not ex.is_function and getattr(yours, ex.method) is getattr(ex.reference, ex.method):
        raise NotWritten(_paragraph(
            ex, f"exercise {ex.number} ({ex.title})", f"{yours.__name__} has no {ex.method} of "
            f"its own: it inherits {ex.reference.__name__}.{ex.method} from tinyvit; write "
            f"{yours.__name__}.{ex.method} (spelled so) between the markers of {ex.filename}"))


# -- one case -------------------------------------------------------------------------------


def _check_case(ex, yours, case, where):
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    mine, inputs, before_forward = case(yours)
    theirs, _, their_before = case(ex.reference)
    where = f"exercise {ex.number} ({ex.title}), {where}, input {_shapes(inputs)}"
    dout = _upstream(mine, inputs, before_forward)
    computed = _backward(ex, mine, inputs, before_forward, dout, where)  # stages 1 and 2
    _accumulates(ex, mine, inputs, before_forward, dout, computed, where)  # stage 3
    expected = _backward(ex, theirs, inputs, their_before, dout, where)
    context = Context(mine, inputs[0], dout)
    _invariants(ex, computed, where)  # stage 4
    _intermediates(ex, mine, theirs, where)  # stage 5, then the parameters', then the input's
    for name in [*list(computed)[1:], "input"]:
        _same_as_library(ex, name, computed[name], expected[name], context, where)
    report = gradient_check(mine, *inputs, before_forward=before_forward, tol=TOL)  # stage 6
    for c in report.checks:
        if not c.passed(TOL):
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(c.name)} disagrees with central differences (rel_err "
                f"{c.rel_err:.1e} > {TOL:g}; worst at {c.where}: yours {c.analytic:.6g}, "
                f"numeric {c.numeric:.6g})", c.findings))


def _upstream(module, inputs, before_forward):
    """A random upstream gradient shaped as the output."""
    if before_forward:
        before_forward()
    y = module.forward(*inputs)
    return 1.0 if y.ndim == 0 else device_rng((7, 1)).standard_normal(y.shape)


def _backward(ex, module, inputs, before_forward, dout, where):
    """{"input": dx, parameter name: its gradient} of one forward and backward from
    zero gradients (copies, on the active backend); the learner's exceptions become
    paragraphs."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    module.zero_grad()
    if on_cpu():
        _watch(module)
    if before_forward:
        before_forward()
    module.forward(*inputs)
    try:
        dx = module.backward(dout)
    except NotImplementedError:
        raise NotWritten(_paragraph(
            ex, where, f"not written yet: write {ex.yours}{'.' + ex.method if ex.method else ''} "
            f"between the markers of {ex.filename}")) from None
    except WrongShape as error:
        raise ExerciseFailed(_paragraph(ex, where, str(error))) from None
    except Exception as error:  # the learner's code, any mistake: said where it is
        raise ExerciseFailed(_paragraph(ex, where, _raised(error))) from None
    computed = {"input": dx}
    computed.update((name, p.grad) for name, p in module.named_parameters())
    shapes = {"input": inputs[0].shape, **{n: p.data.shape for n, p in module.named_parameters()}}
    for name, value in computed.items():  # stage 2
        shape = getattr(value, "shape", None)
        if shape != shapes[name]:
            raise ExerciseFailed(_paragraph(ex, where, _wrong_shape(name, shape, shapes[name])))
        if not is_array(value):
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(name)} is a {type(value).__module__}."
                f"{type(value).__name__}, not an array of the active backend "
                f"({get_backend()}): compute it with xp (tinyvit.backend.xp), not numpy"))
    return {name: value.copy() for name, value in computed.items()}


def _accumulates(ex, module, inputs, before_forward, dout, once, where):
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    if before_forward:
        before_forward()
    module.forward(*inputs)
    module.backward(dout)
    for name, p in module.named_parameters():
        if not doubled(p.grad, once[name]):
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(name)} is assigned, not accumulated: a second backward "
                "without zero_grad left it as it was instead of doubling it; add to it "
                "(param.grad += ...), so that gradients from several uses sum"))


def _invariants(ex, computed, where):
    """What the derivation says must hold, said as the derivation says it."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    host = {name: to_host(value) for name, value in computed.items()}
    for broken, why in INVARIANTS.get(ex.name, ()):
        what = broken(host)
        if what:
            raise ExerciseFailed(_paragraph(ex, where, f"{what}: {why}"))


def _intermediates(ex, mine, theirs, where):
    """The gradient of every intermediate the exercise keeps, against the library's:
    a "Becoming a backprop ninja" table, and a failure at the first that differs."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    ours, library = getattr(mine, "intermediate_grads", None), getattr(theirs,
                                                                       "intermediate_grads", None)
    if library is None:
        return
    if not isinstance(ours, dict) or set(ours) != set(library):
        raise ExerciseFailed(_paragraph(
            ex, where, f"self.intermediate_grads must be a dict of the gradients of "
            f"{', '.join(library)}, got {type(ours).__name__}"
            + (f" with {', '.join(ours)}" if isinstance(ours, dict) else "")))
    rows = []
    for name in library:
        value, want = to_host(ours[name]), to_host(library[name])
        if getattr(value, "shape", None) != want.shape:
            raise ExerciseFailed(_paragraph(ex, where, _wrong_shape(f"d{name}", getattr(
                value, "shape", None), want.shape)))
        diff = float(np.abs(value - want).max())
        close = diff <= SAME * max(float(np.abs(want).max()), 1e-300)
        rows.append(f"d{name:<6} exact: {bool(np.array_equal(value, want))!s:<5} | "
                    f"close: {close!s:<5} | max diff {diff:.1e} | shape {want.shape}")
        if not close:
            raise ExerciseFailed(_paragraph(ex, where, f"d{name} differs from the library's "
                                            "(each intermediate's gradient, the last step "
                                            "first):", rows))


def _same_as_library(ex, name, value, expected, context, where):
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    c = compare(name, value, expected)
    if c.rel_err <= SAME:
        return
    findings = diagnose(c, to_host(value), to_host(expected), context, SAME)
    raise ExerciseFailed(_paragraph(
        ex, where, f"{_tensor(name)} differs from the library's (rel_err {c.rel_err:.1e}; worst "
        f"at {c.where}: yours {c.analytic:.6g}, the library's {c.numeric:.6g})", findings))


# -- shapes ----------------------------------------------------------------------------------


class WrongShape(ValueError):
    """An addition to a parameter's gradient of another shape."""


class _WatchedGrad(np.ndarray):
    """A parameter's gradient that names an addition of the wrong shape, where NumPy's
    own error would say only that two shapes do not broadcast."""

    def __iadd__(self, other):
        shape = np.shape(other)
        try:
            fits = np.broadcast_shapes(shape, self.shape) == self.shape
        except ValueError:
            fits = False
        if not fits:
            raise WrongShape(_wrong_shape(self.param_name, shape, self.shape, "you add to it"))
        return super().__iadd__(other)


def _watch(module):
    """Give every parameter a watched zero gradient (NumPy only)."""
    for name, p in module.named_parameters():
        p.grad = np.zeros_like(p.data).view(_WatchedGrad)
        p.grad.param_name = name


def _wrong_shape(name, got, want, what="yours has"):
    if got is not None and tuple(got) == tuple(want)[::-1] and len(want) == 2:
        return (f"{_tensor(name)} must have its array's shape {tuple(want)}, but {what} shape "
                f"{tuple(got)}, the transpose: dW = dy^T x (out, in), not x^T dy")
    return f"{_tensor(name)} must have its array's shape {tuple(want)}, but {what} shape {got}"


# -- invariants ----------------------------------------------------------------------------------


ROUNDING = 1e-9  # what is zero in exact arithmetic is this small, relative, in float64


def _sums_to_zero(axes, what):
    """An invariant: the input's gradient sums to zero over ``axes`` (``what`` names
    them). Returns a function of the gradients: None where it holds, else what broke."""
    def broken(computed):
        dx = computed["input"]
        sums = float(np.abs(dx.sum(axis=axes)).max())
        if sums > ROUNDING * float(np.abs(dx).max()) * dx.size:
            return f"{what} must sum to zero, but yours sum to up to {sums:.3g}"
        return None

    return broken


def _key_bias_is_zero(computed):
    bias = computed["qkv.bias"]  # q, k, v stacked: the middle third is the key's
    third = len(bias) // 3
    largest = float(np.abs(bias[third:2 * third]).max())
    if largest > ROUNDING * float(np.abs(bias).max()):
        return f"the key bias's gradient must be exactly zero, but yours reaches {largest:.3g}"
    return None


# per exercise: (what breaks the invariant, why it holds)
INVARIANTS = {
    "layernorm_steps": ((_sums_to_zero(-1, "the rows of the input's gradient (over the features)"),
                         "adding a constant to a row of x changes nothing once the mean is "
                         "taken out"),),
    "layernorm": ((_sums_to_zero(-1, "the rows of the input's gradient (over the features)"),
                   "adding a constant to a row of x changes nothing once the mean is taken out; "
                   "the -mean(g) term keeps it so"),),
    "softmax_jacobian": ((_sums_to_zero(-1, "the rows of dS"),
                          "softmax does not change when the same number is added to a row of S"),),
    "softmax": ((_sums_to_zero(-1, "the rows of dS"),
                 "softmax does not change when the same number is added to a row of S; the "
                 "row-sum term keeps it so"),),
    "attention_core": ((_key_bias_is_zero,
                        "it adds the same q.b to every score of a row, and each row of dS sums "
                        "to zero (the softmax backward's row-sum term)"),),
    "batchnorm": ((_sums_to_zero((0, 2, 3), "the input's gradient over (B, H, W), per channel,"),
                   "adding a constant to a channel changes nothing once its mean is taken out"),),
}


# -- what a failure says ----------------------------------------------------------------------


def _paragraph(ex, where, what, details=()):
    lines = [f"{where}: {what}"]
    lines += [f"    {d}" for d in details]
    lines.append(f"The derivation: {derivation(ex.section)}; a hint: "
                 f"python -m tinyvit.learn hint {ex.number}")
    return "\n".join(lines)


def _tensor(name):
    return "the input's gradient" if name == "input" else f"{name}'s gradient"


def _shapes(inputs):
    return ", ".join(str(tuple(a.shape)) for a in inputs)


def _raised(error):
    """The learner's exception, with the line of their file it came from."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if not Path(f.filename).resolve().is_relative_to(PACKAGE)]
    at = (f" at line {frames[-1].lineno} of {Path(frames[-1].filename).name}: {frames[-1].line}"
          if frames else "")
    return f"your backward raised {type(error).__name__}: {error}{at}"


# -- progress ----------------------------------------------------------------------------------


def load_exercise(path):
    """The module of an exercise's file, imported as pytest would (so that ``check``
    finds the workbook its classes were written in)."""
    name = f"workbook_{Path(path).stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class Progress:
    """The workbook's record of each exercise's last check: "pass", "fail" or "blank"."""

    def __init__(self, folder):
        self.folder = folder

    @classmethod
    def of(cls, yours):
        """The progress of the workbook that ``yours`` was written in (none for a notebook)."""
        try:
            folder = Path(inspect.getfile(yours)).resolve().parent
        except (TypeError, OSError):
            return cls(None)
        return cls(folder if (folder / MARKER).is_file() else None)

    def read(self):
        path = self.folder / PROGRESS
        if not path.is_file():
            return {}
        return {int(k): v for k, v in json.loads(path.read_text()).items()}

    def record(self, number, result):
        if self.folder is None:
            return
        results = {**self.read(), number: result}
        (self.folder / PROGRESS).write_text(json.dumps(results, indent=1, sort_keys=True))
