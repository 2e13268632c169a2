"""Set (a) of the repair search's measurement: every single-edit mutant of every reference
backward that the error model (tinyvit/gradcheck/error_model.py) can produce and that changes the
gradient.

For each case of ``python -m tinyvit.gradcheck`` (every layer, the loss, a ViT, a hybrid),
the reference tier's backward runs once under the trace; each function it runs (but those
its forward runs too, which a mutant would change under the check) is mutated in the first
case that runs it, by every edit the error model proposes, one at a time. A
mutant is planted as if its file said so (``planted``: the file's text, as Python's
``linecache`` serves it to the search, and the function's code), then:

- its gradients are compared with the reference's: a mutant that raises, or that leaves
  every gradient as it was (to 1e-7), is counted and left out of the set;
- ``gradient_check`` (central differences computed once per case) must fail it;
- the search must return a fix whose gradients are the reference's, at the mutated line
  ("at the right line") or elsewhere ("any passing fix").
"""

import contextlib
import dataclasses
import inspect
import linecache
import time

from tinyvit import backend
from tinyvit.gradcheck import gradient_check, numeric_gradient
from tinyvit.gradcheck.answer import changes
from tinyvit.gradcheck.cases import cases
from tinyvit.gradcheck.error_model import edits
from tinyvit.gradcheck.repair import BUDGET, Fix, Probe, measure, scope_of
from tinyvit.gradcheck.trace import trace

TOL = 1e-7


@contextlib.contextmanager
def planted(function, changes):
    """Within: ``function``'s file reads, for each (line, before, after) of ``changes``,
    ``after`` where lines ``line``.. read ``before`` (padded with blank lines to as many
    lines, so that the lines below keep their numbers; a statement taken out is ``pass``),
    for ``inspect`` and the search, and the function runs that code."""
    filename = inspect.getsourcefile(function)
    text = list(linecache.getlines(filename))
    first = inspect.getsourcelines(function)[0][0]
    indent = first[:len(first) - len(first.lstrip())]  # what the function's text is dedented by
    for line, before, after in changes:
        if len(after) > len(before):
            raise ValueError("a mutant that writes more lines than it replaces")
        after = after or [before[0][:len(before[0]) - len(before[0].lstrip())] + "pass"]
        new = [indent + t + "\n" for t in after] + ["\n"] * (len(before) - len(after))
        text[line - 1:line - 1 + len(before)] = new
    saved = linecache.cache.get(filename)
    linecache.cache[filename] = (sum(map(len, text)), None, text, filename)  # kept: no mtime
    code = function.__code__
    try:
        function.__code__ = _compiled(function, filename)
        yield
    finally:
        function.__code__ = code
        if saved is None:
            linecache.cache.pop(filename, None)
        else:
            linecache.cache[filename] = saved


def _compiled(function, filename):
    """The function's code compiled from its file's text as linecache has it now."""
    from tinyvit.gradcheck.source import Source
    source = Source(function)
    code = source.compile()
    if code is None:
        raise ValueError(f"{source.name}: the mutant changes its free variables")
    return code


@dataclasses.dataclass
class Mutant:
    case: str
    function: str
    line: int  # the first line it changes
    rule: str
    changes: list  # (line, the lines before, the lines after) of each statement it changes
    outcome: str = ""  # "raises", "no effect", or what the search did
    check_failed: bool = False
    fixed: bool = False
    right_line: bool = False
    restores: bool = False
    seconds: float = 0.0
    tried: int = 0
    fix: str = ""


def generate(names=None):
    """Every mutant, case by case (of the cases ``names``, or all): (case name, build,
    Mutant, the edit's function). A function is mutated in the first case that runs it."""
    seen = set()
    with backend.default_dtype("float64"):
        for name, build in cases():
            if names and name not in names:
                continue
            module, inputs, before_forward = build()
            probe = _probe(module, inputs, before_forward)
            probe.start()
            _, recorded = trace(probe.backward)
            pending = {id(m) for m in probe.pending()}
            for source in recorded.sources:
                if source.code in seen or source.code in probe.forward_codes:
                    continue  # once each; and not what the forward runs too (normal_cdf)
                seen.add(source.code)
                for edit in edits(source, scope_of(recorded, source, pending)):
                    found = [(c.line, c.before, c.after) for c in changes(Fix([edit], 0, 0.0))]
                    if any(len(after) > len(before) for _, before, after in found):
                        continue
                    yield name, build, Mutant(name, source.name, found[0][0], edit.rule,
                                              found), source.function


def _probe(module, inputs, before_forward):
    def forward():
        if before_forward is not None:
            before_forward()
        return module.forward(*inputs)

    y = forward()
    draw = backend.rng((0, 1)).standard_normal(y.shape)  # gradient_check's, seed 0
    return Probe(module, forward, float(draw) if y.ndim == 0 else draw)


class Case:
    """A case built once: its module, the reference's gradients and central differences."""

    def __init__(self, build):
        self.module, self.inputs, self.before_forward = build()
        self.probe = _probe(self.module, self.inputs, self.before_forward)
        self.reference = self.probe.run()
        self.numeric = self._numeric()

    def _numeric(self):
        module, inputs = self.module, self.inputs

        def loss():
            if self.before_forward is not None:
                self.before_forward()
            return float((module.forward(*inputs) * self.probe.dout).sum())

        found = {"input": numeric_gradient(loss, inputs[0])}
        found.update((n, numeric_gradient(loss, p.data)) for n, p in module.named_parameters())
        return found


def run(case, mutant, function, budget=BUDGET):
    """Plant the mutant, check it and search it; fills in ``mutant``."""
    with backend.default_dtype("float64"), planted(function, mutant.changes):
        try:
            grads = case.probe.run()
        except Exception:
            mutant.outcome = "raises"
            return mutant
        outcome = measure(grads, case.reference)
        if outcome is not None and outcome.passes(TOL) and _accumulates(case, grads):
            mutant.outcome = "no effect"
            return mutant
        started = time.perf_counter()
        report = gradient_check(case.module, *case.inputs, before_forward=case.before_forward,
                                expected=case.numeric, tol=TOL, seed=0, repair=budget)
        mutant.seconds = time.perf_counter() - started
        mutant.check_failed = not report.passed
        mutant.tried = report.search.tried if report.search else 0
        fix = report.fix
        mutant.outcome = "fixed" if fix else "no fix"
        if fix:
            mutant.fixed = True
            found = changes(fix)
            mutant.fix = "; ".join(f"{c.function} line {c.line}: " + " ".join(
                s.strip() for s in c.after) for c in found)
            mutated = {line for line, _, _ in mutant.changes}
            mutant.right_line = any(c.function == mutant.function and c.line in mutated
                                    for c in found)
            mutant.restores = _restores(case, fix)
    return mutant


def _accumulates(case, grads):
    return case.probe.accumulates(grads)


def _restores(case, fix):
    """Whether the fix, put in, gives the reference's gradients."""
    from tinyvit.gradcheck.repair import installed
    with installed(fix):
        outcome = measure(case.probe.run(), case.reference)
    return outcome is not None and outcome.passes(TOL)

