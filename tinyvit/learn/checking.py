"""Checking an exercise: the learner's backward against the library's, in stages that
stop at the first failure, each failure one paragraph in the learner's terms.

The stages, for every case of the exercise (several shapes, batch 1 and odd sizes
among them), in float64 on NumPy, and again on CuPy where a GPU is present:

1. not a blank: the backward is the learner's own and runs (a NotImplementedError
   means not written yet; a call to the library's own method is refused); it leaves
   its upstream gradient and the forward's output as they were;
2. shapes and types: every gradient has its array's shape and dtype, and is finite;
3. accumulation: two backward passes double every parameter's ``.grad``;
4. invariants the derivation gives (rows that sum to zero, a gradient that is zero);
5. the values against the library's reference backward on the same input and
   upstream gradient: the intermediates first where the exercise keeps them, then
   every parameter's gradient and the input's, each a row of exact, close, max
   difference and shape (as "Becoming a backprop ninja"'s cmp prints them), the first
   that differs with the gradient check's diagnosis;
6. central differences (``tinyvit.gradcheck``), with its diagnosis;

then, once, the first case in float32: every gradient stays float32. At the first
failure, the repair search (``tinyvit/gradcheck/repair.py``) edits the learner's own
code for the fix that passes every case, and the paragraph gives it first.

``check`` records each result in the workbook's progress file, for ``learn status``.
"""

import ast
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import linecache
import sys
import textwrap
import traceback
import types
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np  # the comparisons and the shape watch work on host arrays

from ..backend import (
    copied,
    cupy_available,
    default_dtype,
    get_backend,
    is_array,
    on_cpu,
    to_host,
    using_backend,
    xp,
)
from ..backend import rng as device_rng
from ..gradcheck import gradient_check
from ..gradcheck.answer import not_found, said
from ..gradcheck.check import compare, doubled
from ..gradcheck.diagnose import IN_PLACE, Context, diagnose
from ..gradcheck.repair import Probe, measure, search
from ..gradcheck.source import NotEditable, Source
from ..gradcheck.trace import in_libraries, in_tinyvit, trace
from ..nn.conv import col2im
from . import harness, pictures
from .exercises import EXERCISES, by_name, derivation

TOL = 1e-7  # the gradient check's bar (the library's backward agrees to about 1e-9)
SAME = 1e-10  # yours and the library's agree to this, relative: rounding, in float64
PROGRESS = ".learn-progress.json"  # in the workbook's folder
CHECKED = ".learn-checked.json"  # beside it: a digest of the code each check last read
MARKER = "learn.json"  # what makes a folder a workbook
HINT_COMMAND = "python -m tinyvit.learn hint"  # where a failure sends the learner for a hint


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
            with using_backend(backend), default_dtype("float32"):
                _keeps_dtype(ex, yours, ex.cases[0])
    except NotWritten:
        progress.record(ex.number, "blank")
        raise
    except ExerciseFailed as failure:
        progress.record(ex.number, "fail", fingerprint(ex, yours))
        _draw_difference(failure, ex, progress.folder)
        raise
    progress.record(ex.number, "pass", fingerprint(ex, yours))
    if progress.folder is not None:  # an earlier failure's picture is no longer true
        _difference_path(ex, progress.folder).unlink(missing_ok=True)
    print(f"exercise {ex.number} ({ex.title}): PASS, every stage of {len(ex.cases)} cases")


def _difference_path(ex, folder):
    return folder / f"{Path(ex.filename).stem}.difference.png"


def _draw_difference(failure, ex, folder):
    """Where the failure knows the gradient that differs from the library's and the
    workbook's folder is known: its difference drawn beside the exercise's file, and
    the paragraph's last line says where."""
    if getattr(failure, "difference", None) is None or folder is None:
        return
    path = _difference_path(ex, folder)
    pictures.difference(*failure.difference, path)
    failure.picture = path
    failure.args = (f"{failure.args[0]}\nThe difference, drawn: {path}",)


def _failed(paragraph, name, yours, library):
    """An ``ExerciseFailed`` that knows the gradient ``name`` that differs (host arrays)."""
    failure = ExerciseFailed(paragraph)
    failure.difference = (_tensor(name), yours, library)
    return failure


def _exercise(yours, name):
    """The exercise ``yours`` answers: the one whose file names it so (MyGELUTanh), else
    the one whose layer it subclasses; named by the caller where neither tells."""
    if name is not None:
        return by_name(name)
    named = [ex for ex in EXERCISES if ex.yours == yours.__name__]
    if len(named) == 1:
        return named[0]
    matches = [ex for ex in EXERCISES if inspect.isclass(yours) and not ex.is_function
               and issubclass(yours, ex.reference)]
    if len(matches) != 1:
        options = " or ".join(f'check({yours.__name__}, "{ex.name}")'
                              for ex in matches or [by_name("linear")])
        raise ValueError(f"check({yours.__name__}): which exercise? name it, as {options}")
    return matches[0]


class CallsLibrary(Exception):
    """The learner's backward called the library's method it is to write again."""


@contextmanager
def _library_refused(ex):
    """Within: the library's own method of the exercise raises ``CallsLibrary``, so that a
    backward that hands its work to it (``return super().backward(dout)``) is caught."""
    if ex.is_function:
        yield
        return
    original = getattr(ex.reference, ex.method)

    def refused(self, *args, **kwargs):
        raise CallsLibrary

    setattr(ex.reference, ex.method, refused)
    try:
        yield
    finally:
        setattr(ex.reference, ex.method, original)


def _own_method(ex, yours):
    """A class that does not define the exercise's method runs the library's, which
    would pass: said as a blank."""
    if not ex.is_function and getattr(yours, ex.method) is getattr(ex.reference, ex.method):
        raise NotWritten(_paragraph(
            ex, f"exercise {ex.number} ({ex.title})", f"{yours.__name__} has no {ex.method} of "
            f"its own: it inherits {ex.reference.__name__}.{ex.method} from tinyvit; write "
            f"{yours.__name__}.{ex.method} (spelled so) between the markers of {ex.filename} "
            f"(or of {ex.notebook})"))


# -- one case -------------------------------------------------------------------------------


def _check_case(ex, yours, case, where):
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    mine, inputs, before_forward = case(yours)
    theirs, _, their_before = case(ex.reference)
    where = f"exercise {ex.number} ({ex.title}), {where}, input {_shapes(inputs)}"
    dout = _upstream(mine, inputs, before_forward)
    expected = _backward(ex, theirs, inputs, their_before, dout, where, learner=False)
    repair = _Repair(ex, yours, mine, inputs, before_forward, copied(dout),
                     {**expected, **_intermediate_grads(theirs)}, (theirs, their_before))
    computed = _backward(ex, mine, inputs, before_forward, dout, where, repair=repair)  # 1, 2
    try:
        _accumulates(ex, mine, inputs, before_forward, dout, computed, where, repair)  # 3
        against = _Against(ex, computed, expected, Context(mine, inputs[0], dout), repair)
        _invariants(ex, computed, against, where)  # stage 4
        _intermediates(ex, mine, theirs, where, repair)  # stage 5, then every gradient
        against.check(where)
        with _library_refused(ex):  # stage 6
            report = gradient_check(mine, *inputs, before_forward=before_forward, tol=TOL)
    except CallsLibrary:
        raise ExerciseFailed(_paragraph(ex, where, _calls_library(ex))) from None
    except ExerciseFailed:
        raise
    except Exception as error:  # a second run of the learner's layer, or its forward after it
        raise ExerciseFailed(_paragraph(ex, where, _after(error), _fix(repair))) from None
    for c in report.checks:
        if c.problem is not None:  # the backward raised, in this run alone
            raise ExerciseFailed(_paragraph(ex, where, c.problem, report._repair()))
        if not c.passed(TOL):
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(c.name)} disagrees with central differences (rel_err "
                f"{c.rel_err:.1e} > {TOL:g}; worst at {c.where}: yours {c.analytic:.6g}, "
                f"numeric {c.numeric:.6g})", [*report._repair(), *c.findings]))


class _Repair:
    """The repair search on one case of an exercise, run once, at its first failure: the
    learner's own code edited (tinyvit's is right), every candidate run on this case's
    cached forward and upstream gradient against the library's gradients, a fix checked
    on every case of the exercise before it is said."""

    def __init__(self, ex, yours, module, inputs, before_forward, dout, expected, library):
        self.ex, self.yours, self.expected, self.library = ex, yours, expected, library
        self.module, self.inputs, self.before_forward, self.dout = (module, inputs,
                                                                    before_forward, dout)
        self._search = False  # not run yet

    @property
    def search(self):
        """The ``Search`` (None where it could not run)."""
        if self._search is False:
            self._search = self._run()
        return self._search

    def _run(self):
        def forward():
            if self.before_forward:
                self.before_forward()
            return self.module.forward(*self.inputs)

        self.wanted = [_gradients(case, self.ex.reference) for case in self.ex.cases]
        reference = _reference_tree(self.ex)  # read before the library's method is refused
        right_values = self._library_values()
        with _library_refused(self.ex):
            try:
                probe = Probe(self.module, forward, self.dout, _intermediate_grads)
            except Exception:  # the forward is the library's: it runs
                return None
            return search(probe, self.expected, SAME, own_only=True, reference=reference,
                          verify=self._every_case, right_values=right_values)

    def _library_values(self):
        """{name: [arrays]}: what the library's backward and the functions it calls held
        at their end on this case (a statement of yours that gives a name the value the
        library's name of that spelling has is right, whatever its text)."""
        theirs, before_forward = self.library
        if before_forward:
            before_forward()
        theirs.forward(*self.inputs)
        dout = copied(self.dout)
        _, recorded = trace(lambda: theirs.backward(dout))
        values = {}
        for _, name, value in recorded.arrays():
            values.setdefault(name, []).append(value)
        return values

    def _every_case(self):
        """Whether the code as it stands now passes every case of the exercise."""
        for case, want in zip(self.ex.cases, self.wanted):
            mine, inputs, before_forward = case(self.yours)
            dout = _upstream(mine, inputs, before_forward)
            try:
                got = _plain_backward(mine, inputs, before_forward, dout)
                once = {n: p.grad.copy() for n, p in mine.named_parameters()}
                if before_forward:
                    before_forward()
                mine.forward(*inputs)
                mine.backward(dout)
            except Exception:
                return False
            if any(not doubled(p.grad, once[n]) for n, p in mine.named_parameters()):
                return False
            outcome = measure(got, want)
            if outcome is None or not outcome.passes(SAME):
                return False
        return self._keeps_float32()

    def _keeps_float32(self):
        """Whether the code as it stands passes the last stage: case 1's gradients in
        float32 come back float32 (``/ (1.0 - p)`` on a bool mask gives float64)."""
        with default_dtype("float32"):
            mine, inputs, before_forward, dout = _in_float32(self.ex.cases[0], self.yours)
            try:
                grads = _plain_backward(mine, inputs, before_forward, dout)
            except Exception:
                return False
        return _widened(grads, inputs[0].dtype) is None

    def lines(self):
        """The fix, said, or how far the search looked where it found none."""
        found = self.search
        if found is None:
            return []
        if found.fix is None:
            return [not_found(found, "makes every case right", "of yours ")]
        return said(found.fix, found, _derivations(self.ex),
                    section_of=lambda edit: derivation(self.ex.section))


def _plain_backward(module, inputs, before_forward, dout):
    """{"input": dx, each parameter's gradient, the intermediates'} of one forward and
    backward from zero gradients."""
    module.zero_grad()
    if before_forward:
        before_forward()
    module.forward(*inputs)
    grads = {"input": module.backward(dout)}
    grads.update((n, p.grad.copy()) for n, p in module.named_parameters())
    grads.update(_intermediate_grads(module))
    return grads


def _intermediate_grads(module):
    """The gradients of the intermediates a layer keeps (exercise 8's), named d + name."""
    kept = getattr(module, "intermediate_grads", None)
    return {f"d{name}": value for name, value in kept.items()} if isinstance(kept, dict) else {}


def _reference_tree(ex):
    """The tree of the library's own code for the exercise (None where it cannot be read)."""
    target = getattr(ex.reference, ex.method) if ex.method else ex.reference
    try:
        return Source(target).tree
    except NotEditable:
        return None


def _derivations(ex):
    """The docstrings that state the exercise's formulas: its reference's and its forward's."""
    target = getattr(ex.reference, ex.method) if ex.method else ex.reference
    return [d for d in (target.__doc__, getattr(ex.forward, "__doc__", None)) if d]


def comparison(yours, exercise=None):
    """The rows of "Becoming a backprop ninja"'s cmp for your gradients against the
    library's on the exercise's first case in float64 (or what your backward raised)."""
    ex = _exercise(yours, exercise)
    with using_backend("numpy"), default_dtype("float64"):
        want = _gradients(ex.cases[0], ex.reference)
        try:
            got = _gradients(ex.cases[0], yours)
        except Exception as error:
            return [_raised(error)]
    width = max(len(name) for name in want)
    rows = []
    for name, value in want.items():
        shape = getattr(got.get(name), "shape", None)
        rows.append(_cmp(name, to_host(got[name]), to_host(value), width)[0]
                    if shape == value.shape else
                    f"{name:<{width}} yours has shape {shape}, the library's {value.shape}")
    return rows


def _gradients(case, make):
    """The gradients of one forward and backward of ``make``'s layer (or function) built
    by ``case``, from a random upstream gradient."""
    module, inputs, before_forward = case(make)
    return _plain_backward(module, inputs, before_forward, _upstream(module, inputs,
                                                                     before_forward))


def _keeps_dtype(ex, yours, case):
    """The last stage: in float32, every gradient comes back in float32 (an array made
    without a dtype, xp.zeros(shape), is float64, and doubles a model's memory)."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    mine, inputs, before_forward, dout = _in_float32(case, yours)
    where = f"exercise {ex.number} ({ex.title}), case 1 in float32, input {_shapes(inputs)}"
    grads, ran = trace(lambda: _plain_backward(mine, inputs, before_forward, dout))
    if isinstance(grads, Exception):
        raise ExerciseFailed(_paragraph(ex, where, _after(grads))) from None
    widened = _widened(grads, inputs[0].dtype)
    if widened is not None:
        name, value = widened
        raise ExerciseFailed(_paragraph(
            ex, where, f"{_tensor(name)} is {value.dtype} where the input is "
            f"{inputs[0].dtype}{_widened_at(ran, inputs[0].dtype)}: an array made without "
            "dtype= (xp.zeros(shape) is float64: give it dtype=dout.dtype, or use "
            "zeros_like), or a NumPy float64 number (xp.sqrt(2 * xp.pi) is one: a float "
            "of Python's, math.sqrt(2 * math.pi), keeps the array's dtype)"))


def _widened(grads, dtype):
    """(name, gradient) of the first gradient not of ``dtype``, or None."""
    return next(((name, g) for name, g in grads.items() if is_array(g) and g.dtype != dtype),
                None)


def _in_float32(case, yours):
    """(layer, inputs, before_forward, dout) of ``case`` in float32: the layer built under
    float32 (the caller's default dtype), its float inputs and the upstream gradient cast."""
    mine, inputs, before_forward = case(yours)
    inputs = tuple(a.astype(xp.float32) if is_array(a) and a.dtype.kind == "f" else a
                   for a in inputs)
    dout = _upstream(mine, inputs, before_forward)
    return mine, inputs, before_forward, dout.astype(xp.float32) if is_array(dout) else dout


def _widened_at(ran, dtype):
    """", first at line N of FILE (function): `text` made NAME wider" where the trace
    ``ran`` shows the line that first made a value wider than ``dtype``."""
    found = ran.widened(dtype)
    if found is None:
        return ""
    code, line, name = found
    text = linecache.getline(code.co_filename, line).strip()
    return (f", first at line {line} of {Path(code.co_filename).name} ({code.co_name}): "
            f"`{text}` made {name if ' ' in name else f'`{name}`'} wider")


def _upstream(module, inputs, before_forward):
    """A random upstream gradient shaped as the output."""
    if before_forward:
        before_forward()
    y = module.forward(*inputs)
    draw = device_rng((7, 1)).standard_normal(y.shape)  # a loss's: a number other than 1
    return float(draw) if y.ndim == 0 else draw


def _backward(ex, module, inputs, before_forward, dout, where, learner=True, repair=None):
    """{"input": dx, parameter name: its gradient} of one forward and backward from
    zero gradients (copies, on the active backend); the learner's exceptions become
    paragraphs, with the fix where the repair search finds one."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    module.zero_grad()
    if on_cpu():
        _watch(module)
    if before_forward:
        before_forward()
    y = module.forward(*inputs)
    output = copied(y)  # what the forward gave its caller
    given = copied(dout)
    try:
        with _library_refused(ex) if learner else nullcontext():
            dx = module.backward(dout)
    except NotImplementedError:
        raise NotWritten(_paragraph(
            ex, where, f"not written yet: write {ex.yours}{'.' + ex.method if ex.method else ''} "
            f"between the markers of {ex.filename} (or of {ex.notebook})")) from None
    except CallsLibrary:
        raise ExerciseFailed(_paragraph(ex, where, _calls_library(ex))) from None
    except WrongShape as error:
        raise ExerciseFailed(_paragraph(ex, where, str(error), _fix(repair))) from None
    except Exception as error:  # the learner's code, any mistake: said where it is
        raise ExerciseFailed(_paragraph(ex, where, _raised(error), _fix(repair))) from None
    if is_array(dout) and not bool((dout == given).all()):
        raise ExerciseFailed(_paragraph(
            ex, where, f"your backward {IN_PLACE}", _fix(repair)))
    if learner and is_array(y) and not bool((y == output).all()):
        raise ExerciseFailed(_paragraph(
            ex, where, "your backward changes the forward's output in place (a cached array "
            "that is also what the forward returned, changed with **=, *= or a slice "
            "written): compute into an array of your own", _fix(repair)))
    computed = {"input": dx}
    computed.update((name, p.grad) for name, p in module.named_parameters())
    shapes = {"input": inputs[0].shape, **{n: p.data.shape for n, p in module.named_parameters()}}
    if dx is None or isinstance(dx, (tuple, list)):  # stage 2: no search, the cause is plain
        returned = "None" if dx is None else f"a {type(dx).__name__} of {len(dx)}"
        raise ExerciseFailed(_paragraph(
            ex, where, f"your backward returned {returned}, where the input's gradient, one "
            f"array of shape {tuple(inputs[0].shape)}, is expected"
            f"{': is a return missing at its end?' if dx is None else ''}"))
    for name, value in computed.items():  # stage 2
        shape = getattr(value, "shape", None)
        if shape != shapes[name]:
            raise ExerciseFailed(_paragraph(ex, where, _wrong_shape(name, shape, shapes[name]),
                                            _fix(repair)))
        if not is_array(value):
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(name)} is a {type(value).__module__}."
                f"{type(value).__name__}, not an array of the active backend "
                f"({get_backend()}): compute it with xp (tinyvit.backend.xp), not numpy"))
        if learner and value.dtype != inputs[0].dtype:
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(name)} is {value.dtype}, not {inputs[0].dtype} like the "
                "input and the parameters: an array made with another dtype, or converted, on "
                "the way", _fix(repair)))
        if learner and not bool(xp.isfinite(value).all()):
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(name)} has entries that are not finite (nan or inf): a "
                "division by zero or an overflow on the way", _fix(repair)))
    return {name: value.copy() for name, value in computed.items()}


def _fix(repair):
    """The lines of the fix the repair search finds, if it runs and finds one."""
    return repair.lines() if repair is not None else []


def _calls_library(ex):
    return (f"{ex.yours}.{ex.method} calls tinyvit's own {ex.reference.__name__}.{ex.method} "
            f"(as super().{ex.method}(...) or {ex.reference.__name__}.{ex.method}(self, ...)), "
            "which would pass without a line of yours: compute the gradients yourself")


def _accumulates(ex, module, inputs, before_forward, dout, once, where, repair):
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    if before_forward:
        before_forward()
    module.forward(*inputs)
    with _library_refused(ex):
        module.backward(dout)
    for name, p in module.named_parameters():
        if not doubled(p.grad, once[name]):
            one, two = to_host(once[name]), to_host(p.grad)
            at = np.unravel_index(np.abs(two - 2 * one).argmax(), one.shape)
            raise ExerciseFailed(_paragraph(
                ex, where, f"{_tensor(name)} is assigned, not accumulated: a second backward "
                "without zero_grad left it as it was instead of doubling it (at "
                f"{tuple(int(i) for i in at)}: {one[at]:.6g} after one backward, {two[at]:.6g} "
                f"after two, where {2 * one[at]:.6g} was due); add to it (param.grad += ...), "
                "so that gradients from several uses sum", _fix(repair)))


def _invariants(ex, computed, against, where):
    """What the derivation says must hold, said as the derivation says it, with where
    the gradients part from the library's."""
    __tracebackhide__ = True  # pytest shows the paragraph, not these frames
    host = {name: to_host(value) for name, value in computed.items()}
    for broken, why in INVARIANTS.get(ex.name, ()):
        what = broken(host)
        if what:
            failure = ExerciseFailed(_paragraph(ex, where, f"{what}: {why}", against.findings()))
            first = against.first_difference()
            if first is not None:
                failure.difference = (_tensor(first[0]), *first[1:])
            raise failure


def _intermediates(ex, mine, theirs, where, repair):
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
                value, "shape", None), want.shape), _fix(repair)))
        row, close = _cmp(f"d{name}", value, want, 6)
        rows.append(row)
        if not close:
            raise _failed(_paragraph(ex, where, f"d{name} differs from the library's (each "
                                     "intermediate's gradient, the last step first):",
                                     [*_fix(repair), *rows]), f"d{name}", value, want)


def _cmp(label, value, want, width):
    """One row of "Becoming a backprop ninja"'s cmp: exact, close, max difference, shape;
    and whether the two are close."""
    diff = float(np.abs(value - want).max()) if want.size else 0.0
    close = diff <= SAME * max(float(np.abs(want).max()) if want.size else 0.0, 1e-300)
    row = (f"{label:<{width}} exact: {bool(np.array_equal(value, want))!s:<5} | "
           f"close: {close!s:<5} | max diff {diff:.1e} | shape {want.shape}")
    return row, close


class _Against:
    """The learner's gradients against the library's, on the same input and upstream
    gradient: the check of stage 5, and the findings a broken invariant adds."""

    def __init__(self, ex, computed, expected, context, repair):
        self.ex, self.context, self.repair = ex, context, repair
        self.names = [*list(computed)[1:], "input"]  # the parameters' first, as a backward ends
        self.host = {name: (to_host(computed[name]), to_host(expected[name]))
                     for name in self.names}
        self.checks = {name: compare(name, computed[name], expected[name]) for name in self.names}
        width = max(len(name) for name in self.names)
        self.table = [_cmp(name, *self.host[name], width)[0] for name in self.names]

    def differs(self, name):
        return self.checks[name].rel_err > SAME

    def diagnosis(self, name):
        """The exercise's own findings, then the gradient check's."""
        yours, library = self.host[name]
        own = SPECIFIC.get(self.ex.name, lambda *_: [])(self.context, yours, library)
        context = dataclasses.replace(self.context, search=self.repair.search)
        return own + diagnose(self.checks[name], yours, library, context, SAME)

    def findings(self):
        """Where the gradients part from the library's, for a broken invariant: the fix,
        each differing gradient's diagnosis by name, then the table."""
        found = [f"{_tensor(name)}: {finding}" for name in self.names if self.differs(name)
                 for finding in self.diagnosis(name)]
        return [*self.repair.lines(), *found, "yours against the library's:", *self.table]

    def check(self, where):
        """Stage 5: a failure at the first gradient that differs from the library's."""
        __tracebackhide__ = True  # pytest shows the paragraph, not these frames
        for name, c in self.checks.items():
            if self.differs(name):
                raise _failed(_paragraph(
                    self.ex, where, f"{_tensor(name)} differs from the library's (rel_err "
                    f"{c.rel_err:.1e}; worst at {c.where}: yours {c.analytic:.6g}, the "
                    f"library's {c.numeric:.6g})",
                    [*self.repair.lines(), *self.diagnosis(name), "yours against the library's:",
                     *self.table]), name, *self.host[name])

    def first_difference(self):
        """(name, yours, library) of the first gradient that differs, or None."""
        return next(((name, *self.host[name]) for name in self.names if self.differs(name)),
                    None)


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
    said = f"{_tensor(name)} must have its array's shape {tuple(want)}, but {what} shape "
    if got is None or tuple(got) != tuple(want)[::-1] or len(want) != 2:
        return said + str(got)
    if name.endswith("weight"):
        return said + f"{tuple(got)}, the transpose: dW = dy^T x (out, in), not x^T dy"
    return said + f"{tuple(got)}, the transpose of its shape: a product taken in the wrong order"


# -- invariants ----------------------------------------------------------------------------------


ROUNDING = 1e-9  # what is zero in exact arithmetic is this small, relative, in float64


def _sums_to_zero(axes, what):
    """An invariant: the input's gradient sums to zero over ``axes`` (``what`` names
    them). Returns a function of the gradients: None where it holds, else what broke."""
    def broken(computed):
        dx = computed["input"]
        sums = np.abs(dx.sum(axis=axes))
        if sums.max() > ROUNDING * float(np.abs(dx).max()) * dx.size:
            at = tuple(int(i) for i in np.unravel_index(sums.argmax(), sums.shape))
            return f"{what} must sum to zero, but yours sum to up to {sums.max():.3g} (at {at})"
        return None

    return broken


def _key_bias_is_zero(computed):
    bias = computed["qkv.bias"]  # q, k, v stacked: the middle third is the key's
    third = len(bias) // 3
    key = np.abs(bias[third:2 * third])
    if key.max() > ROUNDING * float(np.abs(bias).max()):
        return (f"the key bias's gradient must be exactly zero, but yours reaches "
                f"{key.max():.3g} (at entry {third + int(key.argmax())} of qkv.bias)")
    return None


def _overlaps(context, yours, library):
    """col2im: each window's gradient written over the pixels (=), not added (+=): said
    where yours is what that gives, and not on the strength of the pixels one window
    reads alone being right (i and j swapped are right there too for a 3x3 kernel of
    stride 2, whose single-read pixels sit at i = j = 1)."""
    layer = context.module
    counter = harness.Windows(col2im, layer.kernel, layer.stride, layer.padding)
    windows = counter.forward(xp.ones_like(context.x))
    reads = to_host(counter.backward(xp.ones_like(windows)))  # how many windows read each pixel
    if not (reads > 1).any():
        return []
    over = harness.Windows(_written_over, layer.kernel, layer.stride, layer.padding)
    over.forward(context.x)
    written = to_host(over.backward(context.dout))
    if np.abs(yours - written).max() <= SAME * float(np.abs(library).max()):
        return ["right at the pixels that one window reads, wrong where windows overlap: "
                "each window's gradient is added into its pixels (+=), not written over "
                "what the windows before it left there (=)"]
    return []


def _written_over(dwindows, dxpad, stride):
    """col2im with = for += (the mistake ``_overlaps`` names)."""
    *_, kh, kw, Ho, Wo = dwindows.shape
    sh, sw = stride
    for i in range(kh):
        for j in range(kw):
            dxpad[..., i : i + sh * Ho : sh, j : j + sw * Wo : sw] = dwindows[..., i, j, :, :]
    return dxpad


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
                        "the key bias adds the same q.b to every score of a row, and "
                        "dk = dS^T q scale sums each row of dS, which sums to zero"),),
    "batchnorm": ((_sums_to_zero((0, 2, 3), "the input's gradient over (B, H, W), per channel,"),
                   "adding a constant to a channel changes nothing once its mean is taken out"),),
}


# per exercise: findings of its own, before the gradient check's diagnosis
SPECIFIC = {"col2im": _overlaps}


# -- what a failure says ----------------------------------------------------------------------


def _paragraph(ex, where, what, details=()):
    lines = [f"{where}: {what}"]
    lines += [f"    {d}" for d in details]
    lines.append(f"The derivation: {derivation(ex.section)}; a hint: {HINT_COMMAND} {ex.number}")
    return "\n".join(lines)


def _tensor(name):
    return "the input's gradient" if name == "input" else f"{name}'s gradient"


def _shapes(inputs):
    return ", ".join(str(tuple(a.shape)) for a in inputs)


def _after(error):
    """An exception of a later stage: the learner's backward, run again, raised; or the
    library's forward did, after the learner's backward changed the layer."""
    if _learners_frames(error):
        return _raised(error)
    return (f"the layer's forward raises after your backward ran ({type(error).__name__}: "
            f"{error}): your backward changes the layer itself (its list of layers reversed "
            "in place, a parameter or a setting assigned); a backward leaves the layer as it "
            "found it")


def _learners_frames(error):
    """The frames of the learner's own code: neither tinyvit's nor a library's (NumPy's
    ``xp.diag`` raised at a line of NumPy's file, which named it)."""
    return [f for f in traceback.extract_tb(error.__traceback__)
            if not in_tinyvit(f.filename) and not in_libraries(f.filename)]


def _raised(error):
    """The learner's exception, with the line of their file it came from."""
    frames = _learners_frames(error)
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


def notebook_code(path):
    """The code of an exercise's notebook that is the learner's module: its cells tagged
    "setup" and "answer" (``notebook.py``), as one file's text."""
    cells = json.loads(Path(path).read_text())["cells"]
    return "\n\n".join("".join(cell["source"]) for cell in cells
                       if {"setup", "answer"} & set(cell["metadata"].get("tags", ())))


def load_notebook(path):
    """The module of the learner's code in an exercise's notebook (``notebook_code``),
    run as one file."""
    source = notebook_code(path)
    name = f"workbook_{Path(path).stem}_notebook"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    linecache.cache[str(path)] = (len(source), None, source.splitlines(True), str(path))
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


class Progress:
    """The workbook's record of each exercise's last check: "pass", "fail" or "blank"."""

    def __init__(self, folder):
        self.folder = folder

    @classmethod
    def of(cls, yours):
        """The progress of the workbook that ``yours`` was written in; for code typed in
        a notebook (a cell has no file of the workbook), the workbook the notebook runs
        in (Jupyter runs a notebook in its folder); None outside a workbook."""
        try:
            folder = Path(inspect.getfile(yours)).resolve().parent
        except (TypeError, OSError):
            folder = None
        for found in (folder, Path.cwd()):
            if found is not None and (found / MARKER).is_file():
                return cls(found)
        return cls(None)

    def read(self):
        path = self.folder / PROGRESS
        if not path.is_file():
            return {}
        return {int(k): v for k, v in json.loads(path.read_text()).items()}

    def record(self, number, result, code=None):
        """``result`` of exercise ``number``; ``code``, where it passed or failed, the
        digest of the code checked (``fingerprint``)."""
        if self.folder is None:
            return
        results = {**self.read(), number: result}
        (self.folder / PROGRESS).write_text(json.dumps(results, indent=1, sort_keys=True))
        digests = {**self.checked_code(), number: code}
        (self.folder / CHECKED).write_text(json.dumps(digests, indent=1, sort_keys=True))

    def checked_code(self):
        """{number: the digest of the code its last check passed or failed, or None}."""
        path = self.folder / CHECKED
        if not path.is_file():
            return {}
        return {int(k): v for k, v in json.loads(path.read_text()).items()}


def fingerprint(ex, yours):
    """A digest of the learner's code for exercise ``ex`` (its method's or its function's
    syntax tree, so that comments, blank lines and spacing do not count), or None where
    the source cannot be read."""
    try:
        source = inspect.getsource(getattr(yours, ex.method) if ex.method else yours)
        tree = ast.dump(ast.parse(textwrap.dedent(source)))
    except (OSError, TypeError, AttributeError, SyntaxError):
        return None
    return hashlib.sha256(tree.encode()).hexdigest()[:16]
