"""The repair search: a wrong backward answered with the edit of its own code that makes it
right (Singh, Gulwani and Solar-Lezama, "Automated Feedback Generation for Introductory
Programming Assignments", PLDI 2013: an error model of rewrite rules, searched for the
smallest correction that passes).

1. The backward runs once under a trace (``trace.py``): which functions it called, the
   names in scope at each line and their shapes, which lines ran when.
2. The error model (``error_model.py``) proposes every single edit of those functions
   (not of those the forward runs too). They are tried in order: the user's own code
   before tinyvit's, the lines that ran just before the first gradient that came out
   wrong before the rest, the cheaper edits first, at equal cost the line that ran first.
3. Each candidate is compiled into the function object and run on the same cached
   forward and the same upstream gradient (``Probe``): it is a fix when every gradient
   passes the check, a second backward doubles the parameters' (they accumulate), and
   the upstream gradient and the forward's output come out as they went in.
4. No single edit: pairs (``_pairs``), the same mistake made twice first, then two edits
   that each brought the gradients closer, two cheap edits of one line, and a promising
   edit with any other, until the time is up. A single edit of a right statement (one the
   reference, the workbook's library code, writes the same way, or one that gives its name
   the value the reference's name of that spelling holds: ``right_values``), or one that
   makes a number (a size, a coefficient) an array, is kept aside where it passes, and the
   search goes on: it makes up there for a mistake made elsewhere (dAd divided by Dh where
   dq and dk were each divided by the scale, not multiplied; B = t.shape[0] / dout where
   dout was left out of the gradient). So is a pair that rewrites one. A pair that leaves
   right statements alone comes first; else the first fix kept is the answer.

A fix is only returned once it passed; nothing is guessed.
"""

import ast
import collections
import contextlib
import copy
import dataclasses
import inspect
import math
import numbers
import time
import warnings

import numpy as np  # its floating-point warnings, silenced for candidates (CuPy gives none)

from ..backend import copied, is_array, xp
from ..nn.module import Module, Parameter
from .edits import Scope, names_in, statements, takes_cache, term_nodes
from .error_model import edits, factors_in
from .source import NotEditable, Source
from .trace import called, in_tinyvit, trace

BUDGET = 2.0  # seconds of search for one backward
# the search's clock: the CPU time of the thread that searches, which other work on the machine
# does not take away, so that the same code gets the same answer on a busy machine as on an
# idle one (where the machine is busy, the search takes longer to the eye)
clock = time.thread_time
# where a difference is within the numeric gradient's rounding, the two must still agree to this
# (relative) to count as one: a gradient wrong by a factor, however small, is not passed on the
# rounding's account
ROUNDED_AGREEMENT = 1e-4


def within_rounding(diff, error, noise):
    """Whether a worst difference ``diff`` (``error`` relative) is one the expected
    gradient's rounding, ``noise``, can make, the two agreeing to ``ROUNDED_AGREEMENT``."""
    return diff <= noise and error <= ROUNDED_AGREEMENT
# two ways of writing one value agree to this (relative to its largest element): float64's
# rounding after a few operations in another order
SAME_VALUE = 1e-9
UPSTREAM = "the upstream gradient"  # what a backward must leave as it came
OUTPUT = "the forward's output"  # and this too
CLOSER = math.log(1.5)  # an edit that shrinks the error this much (in log) is promising
MOST_PROMISING = 40  # the promising edits paired with every other edit, at most
SAME_LINE = 2.0  # edits this cheap are also paired with the others of their line
ALIKE = 3.0  # edits this cheap are also paired with the others done the same way
KIND = 0.5  # each kind of pair this much dearer than the kind before it (``_pairs``)
GROUP = 60  # the cheapest edits of a group paired with each other, at most
# the rules whose edit, made twice the same way, is one mistake made twice (the same axes,
# factor, operator, transpose); names for others, swapped statements or added terms are not
REPEATED = {"reduction", "factor", "transpose", "axes", "constant", "index", "accumulate",
            "call", "copy", "guard"}


@dataclasses.dataclass
class Outcome:
    """A candidate's gradients against the expected ones: per tensor, the max-norm error
    relative to the larger of the two (the check's rel_err) and to the expected alone."""

    errors: dict  # name -> rel_err, as the check computes it
    distance: float  # sum of log errors, relative to the expected: smaller is closer
    doubled: bool = True

    def passes(self, tol):
        return self.doubled and all(e <= tol for e in self.errors.values())


class Probe:
    """A module after one forward, whose backward can run again and again on the same
    cache and the same upstream gradient, each time from zero gradients."""

    def __init__(self, module, forward, dout, outputs=None):
        """``forward()`` runs the forward (with its dropout masks seeded); ``outputs(module)``
        adds gradients kept elsewhere than ``.grad`` ({"dxhat": ...})."""
        self.module, self.dout, self.outputs = module, dout, outputs
        self.output, self.forward_codes = called(forward)
        self.output_values = self.output.copy() if is_array(self.output) else None
        self.layers = [m for _, m in module.named_modules()]
        # the caches and the output copied together, so that a cache that is the output
        # (Tanh's y) is still the output in every copy
        self.saved = copy.deepcopy(([m.cache for m in self.layers], self.output))
        self.names = {id(p): name for name, p in module.named_parameters()}
        # each parameter's arrays, and its values: a candidate may write over either
        self.arrays = [(p, p.data, p.data.copy(), p.grad) for p in module.parameters()]

    def forward_values(self):
        """The arrays the forward computed and left: its output, and its caches' arrays."""
        caches, output = self.saved
        items = [output] + [item for cache in caches
                            for item in (cache if isinstance(cache, (tuple, list)) else [cache])]
        return [item for item in items if is_array(item)]

    def restore(self):
        """The forward's caches, and every parameter's own arrays and values, back."""
        caches, self.output = copy.deepcopy(self.saved)
        for layer, cache in zip(self.layers, caches):
            layer.cache = cache
        for p, data, values, grad in self.arrays:
            p.data, p.grad = data, grad
            data[...] = values

    def run(self):
        """{"input": dx, each parameter's name: its gradient, and ``outputs``'s} of one
        backward from zero gradients."""
        self.start()
        return self.backward()

    def start(self):
        """The cache of the forward back in every layer, every gradient zero."""
        self.restore()
        self.module.zero_grad()

    def backward(self):
        """The backward from where ``start`` left it, and the gradients it gives; under
        ``UPSTREAM``, the upstream gradient as the backward left it (a backward that
        changes it in place changes its caller's gradient)."""
        dout = copied(self.dout)
        dx = self.module.backward(dout)
        grads = {"input": dx, **({UPSTREAM: dout} if is_array(dout) else {})}
        if self.output_values is not None:
            grads[OUTPUT] = self.output
        grads.update((self.names[id(p)], p.grad.copy()) for p in self.module.parameters())
        if self.outputs:
            grads.update(self.outputs(self.module))
        return grads

    def accumulates(self, once):
        """Whether a second backward, without zero_grad, doubles every parameter's gradient."""
        return not self.not_doubled(once)

    def not_doubled(self, once):
        """The parameters whose gradient a second backward, without zero_grad, does not
        double (``once``: the gradients of the first)."""
        self.restore()
        self.module.backward(copied(self.dout))
        found = []
        for p in self.module.parameters():
            first = once[self.names[id(p)]]
            if float(xp.abs(p.grad - 2 * first).max()) > 1e-12 * float(xp.abs(first).max()):
                found.append(self.names[id(p)])
        return found

    def pending(self):
        """The layers whose forward left a cache that the backward never took."""
        return [m for m in self.layers if m.cache is not None]


FAILS = Outcome({}, math.inf, doubled=False)  # a gradient missing, misshapen or not finite


def measure(grads, expected, noise=None):
    """The ``Outcome`` of ``grads`` against ``expected`` ({name: array}); None when a
    gradient is missing, of another shape or dtype, or not finite. ``noise`` ({name:
    float}): the error an expected gradient may carry; a difference ``within_rounding``
    counts as none (as in ``TensorCheck.passed``)."""
    noise = noise or {}
    errors, distance = {}, 0.0
    for name, want in expected.items():
        got = grads.get(name)
        if not is_array(got) or got.shape != want.shape or got.dtype != want.dtype:
            return None
        diff = float(xp.abs(got - want).max()) if want.size else 0.0
        if not math.isfinite(diff):
            return None
        top = float(xp.abs(want).max()) if want.size else 0.0
        larger = max(top, float(xp.abs(got).max()) if got.size else 0.0)
        error = diff / larger if larger > 0 else 0.0
        errors[name] = 0.0 if within_rounding(diff, error, noise.get(name, 0.0)) else error
        distance += math.log(max(diff / top if top > 0 else diff, 1e-12))
    return Outcome(errors, distance)


# -- the search -------------------------------------------------------------------------------


@dataclasses.dataclass
class Fix:
    """The edits that make a backward right, as they apply to the code."""

    edits: list
    tried: int  # candidates run before it
    seconds: float


@dataclasses.dataclass
class Search:
    """What a search did: the fix, if one passed, and what it tried."""

    fix: object  # a Fix or None
    tried: int
    seconds: float
    trace: object  # the Trace of the backward as written
    sources: list  # the functions it edited
    ran_out: bool = False  # the time was up before every candidate was tried


def search(probe, expected, tol, budget=None, own_only=False, reference=None, verify=None,
           noise=None, right_values=None):
    """Search edits of the code ``probe``'s backward runs for one that makes its gradients
    match ``expected`` (each within ``tol``) and accumulate. ``own_only``: edit the code
    outside tinyvit alone (the workbook's: the library's is right). ``reference``: the tree
    of a right version of the code (the workbook's: the library's), whose expressions the
    error model may put in, and whose statements are likely right where the code writes
    them the same way. ``verify()``: a further check a fix must pass (the workbook's other
    cases). ``noise``: what each expected gradient may be off by (``measure``).
    ``right_values``: {name: [arrays]} that a right version of the code held at its end on
    the same input (the workbook's: the library's); a statement that gives a name the value
    the right code's name of the same spelling has is right, whatever its text.
    ``budget``: seconds of ``clock``, ``BUDGET`` by default. Returns a ``Search``."""
    started = clock()
    deadline = started + (BUDGET if budget is None else budget)
    if is_array(probe.dout):
        expected = {**expected, UPSTREAM: probe.dout}
    if probe.output_values is not None:
        expected = {**expected, OUTPUT: probe.output_values}
    probe.start()
    grads, recorded = trace(probe.backward, own_only)
    baseline = None if isinstance(grads, Exception) else measure(grads, expected, noise)
    not_doubled = [] if baseline is None else probe.not_doubled(grads)
    if baseline is not None and baseline.passes(tol) and not not_doubled:
        return Search(None, 0, clock() - started, recorded, [])  # nothing wrong
    pending = {id(m) for m in probe.pending()}
    sources = [s for s in recorded.sources if s.code not in probe.forward_codes]
    if own_only:
        sources = [s for s in sources if not in_tinyvit(s.path)]
    ranking = _Ranking(recorded, probe, grads, expected, not_doubled, tol, noise)
    singles = []  # the edits tried, in order
    proposed = _in_order(sources, lambda s: scope_of(recorded, s, pending, reference),
                         ranking, recorded.first_run(), singles)
    tried = 0
    promising = []
    runner = _Runner(probe, expected, tol, verify, noise)
    once = list(_assigned_once(recorded, sources))
    right = _right_statements(once, right_values or {}, probe.forward_values())
    numbers = _numbers(once)

    def rewrites_right(edit):
        """Whether it rewrites a statement written as the reference writes it, or one that
        holds a right value, or makes a number (a size, a coefficient) an array."""
        return (edit.rewrites_right or id(edit.statement) in right
                or (id(edit.statement) in numbers and _made_array(edit)))

    kept = None  # a fix that rewrites a right statement

    def found(candidate):
        return Search(Fix(candidate, tried, clock() - started), tried,
                      clock() - started, recorded, sources)

    for edit in proposed:
        if clock() > deadline:
            break
        tried += 1
        outcome = runner.outcome([edit])
        if outcome is None:
            continue
        if runner.fixes([edit], outcome):
            if not rewrites_right(edit):
                return found([edit])
            kept = kept or [edit]  # it makes up here for a mistake made elsewhere: look on
            continue
        if baseline is None or outcome.distance < baseline.distance - CLOSER:
            promising.append((outcome.distance, edit))  # closer, or runs where it raised
    promising = [e for _, e in sorted(promising, key=lambda item: (item[0], item[1].cost))]
    time_left = clock() < deadline  # and so every single edit was tried
    pairs = _pairs(promising[:MOST_PROMISING], singles) if time_left else []
    for first, second in pairs:
        if clock() > deadline:
            break
        right_rewritten = rewrites_right(first) or rewrites_right(second)
        if kept and right_rewritten:
            continue  # no better than the fix kept
        tried += 1
        outcome = runner.outcome([first, second])
        if outcome is not None and runner.fixes([first, second], outcome):
            if not right_rewritten:
                return found([first, second])
            kept = [first, second]  # as a single edit of a right statement is: look on
    if kept:
        return found(kept)
    return Search(None, tried, clock() - started, recorded, sources,
                  ran_out=clock() > deadline)


def _assigned_once(recorded, sources):
    """(statement, {name: its value at the function's end}) for each statement of
    ``sources`` that gives a name a value, or unpacks values into names (c, a = TANH_C,
    TANH_A), each name assigned nowhere else in its function and never written into, so
    that its value at the end is the statement's."""
    for source in sources:
        at_end = next((call.scopes.get("return", {}) for call in recorded.calls
                       if call.code is source.code), {})
        stores = collections.Counter(n.id for n in ast.walk(source.tree)
                                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
        written = {n.value.id for n in ast.walk(source.tree) if isinstance(n, ast.Subscript)
                   and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)}
        for statement, _, _ in statements(source.tree.body):
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
                continue
            target = statement.targets[0]
            names = [target] if isinstance(target, ast.Name) else getattr(target, "elts", [None])
            if all(isinstance(n, ast.Name) and stores[n.id] == 1 and n.id not in written
                   and n.id in at_end for n in names):
                yield statement, {n.id: at_end[n.id] for n in names}


def _right_statements(once, values, forward):
    """{id(statement)}: the statements of ``once`` (``_assigned_once``) that give one name
    the value that the right code's name of that spelling held (``values``, {name:
    [arrays]}), or that compute again a value the forward computed (``forward``: y = x *
    normal_cdf(x) in GELU's backward, where the mistake is y read for x; not a name for
    one, p = log_probs, whose mistake may be the name)."""
    found = set()
    for statement, named in once:
        if len(named) != 1 or not isinstance(statement.targets[0], ast.Name):
            continue
        (name, value), = named.items()
        computed = not isinstance(statement.value, (ast.Name, ast.Attribute, ast.Subscript))
        rights = [*values.get(name, ()), *(forward if computed else ())]
        if is_array(value) and any(_same_values(value, right) for right in rights):
            found.add(id(statement))
    return found


def _numbers(once):
    """{id(statement)}: the statements of ``once`` (``_assigned_once``) that give each of
    their names a number, not an array nor a truth value (a size, B = t.shape[0];
    coefficients, c, a = TANH_C, TANH_A)."""
    return {id(statement) for statement, named in once
            if all(_is_number(value) for value in named.values())}


def _is_number(value):
    """A Python or NumPy number, not a truth value."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _made_array(edit):
    """Whether an edit brings an array into what it writes (a size divided by dout)."""
    arrays = edit.scope.arrays(edit.line) if edit.scope is not None else {}
    nodes = [node for new in edit.new for node in (new if isinstance(new, list) else [new])]
    return any(isinstance(n, ast.Name) and n.id in arrays for node in nodes for n in ast.walk(node))


def _same_values(a, b):
    """Whether two arrays hold the same values but for rounding (not all zero: a zero array
    says little of the formula that made it)."""
    if not (is_array(b) and a.shape == b.shape and a.dtype.kind == b.dtype.kind == "f"):
        return False
    scale = float(xp.abs(b).max()) if b.size else 0.0
    return scale > 0 and float(xp.abs(a - b).max()) <= SAME_VALUE * scale


def _in_order(sources, scope, ranking, ran, given):
    """The single edits of ``sources`` in the order they are tried, each also added to
    ``given``: by rank, then cost, then the line that ran first. The edits of a rank are
    proposed when it comes up, for the statements of that rank alone: a search that ends
    within the likeliest ranks never proposes the edits of a whole model's other lines,
    which outnumber those of the layer at fault many times."""
    scopes, holders = {}, {}
    for rank in range(RANKS):
        group = []
        for source in sources:
            lines = ranking.lines(source, rank)
            if lines:
                if id(source) not in scopes:
                    scopes[id(source)], holders[id(source)] = scope(source), {}
                group += edits(source, scopes[id(source)], lines, holders[id(source)])
        group.sort(key=lambda e: (e.cost, ran.get((e.source.code, e.line), math.inf)))
        for edit in group:
            given.append(edit)
            yield edit


def _pairs(promising, singles):
    """Pairs of edits, the likelier first: the same mistake made twice (one rule, the same
    way, on two lines or two places of one: both means over the wrong axes, both products
    divided by the scale), or two names exchanged (the stride given where the padding
    goes, and the padding where the stride goes); two promising edits; two cheap edits of
    one line (two mistakes that each alone still fail: ``ho * kh, wo * kw`` for ``ho * sh,
    wo * sw``); a promising edit with any other. Ordered by their costs added, each kind of
    pair a little dearer than the kind before it."""
    alike, lines = {}, {}
    for e in singles:
        if e.cost <= ALIKE and e.rule in REPEATED:
            alike.setdefault(_how(e), []).append(e)
        if e.cost <= ALIKE and e.rule == "name":  # two names exchanged, either way round
            exchanged = frozenset((e.detail["was"], e.detail["now"]))
            alike.setdefault(("exchange", exchanged), []).append(e)
        if e.cost <= SAME_LINE:
            lines.setdefault(e.line, []).append(e)
    kinds = ([group[:GROUP] for group in alike.values()], [promising],
             [group[:GROUP] for group in lines.values()])
    pairs, seen = [], set()

    def add(first, second, rank):
        key = frozenset((id(first), id(second)))
        if first is not second and key not in seen and not first.clashes(second):
            seen.add(key)
            # the same mistake twice costs little more than once
            cost = max(first.cost, second.cost) + KIND if rank == 0 else first.cost + second.cost
            pairs.append((cost + KIND * rank, len(pairs), first, second))

    for rank, groups in enumerate(kinds):
        for group in groups:
            for i, first in enumerate(group):
                for second in group[i + 1:]:
                    add(first, second, rank)
    for first in promising[:GROUP // 4]:
        for second in singles[:GROUP * 4]:
            add(first, second, len(kinds))
    pairs.sort(key=lambda item: item[:2])
    return [(first, second) for *_, first, second in pairs]


def _how(edit):
    """The way an edit is done, beside where: its rule, and its axes, operator, factor or
    replacement."""
    keys = ("what", "axes", "now", "factor", "op", "layer")
    return (edit.rule, *(ast.unparse(v) if isinstance(v, ast.AST) else v
                         for v in (edit.detail.get(k) for k in keys)))


class _Runner:
    """Compiles a candidate into the functions, runs the probe, and puts the code back."""

    def __init__(self, probe, expected, tol, verify, noise):
        self.probe, self.expected, self.tol, self.verify = probe, expected, tol, verify
        self.noise = noise

    def outcome(self, candidate):
        for edit in candidate:
            edit.apply()
        try:
            codes = {}
            for edit in candidate:
                codes.setdefault(id(edit.source), (edit.source, edit.source.compile()))
            if any(code is None for _, code in codes.values()):
                return None
        except (SyntaxError, ValueError, TypeError):
            return None
        finally:
            for edit in reversed(candidate):
                edit.revert()
        with _installed(list(codes.values())), _quiet():
            try:
                grads = self.probe.run()
            except Exception:  # a candidate that does not run is no fix
                return None
            outcome = measure(grads, self.expected, self.noise)
            if outcome is not None and outcome.passes(self.tol):
                try:
                    outcome.doubled = self.probe.accumulates(grads)
                except Exception:
                    outcome.doubled = False
            return outcome

    def fixes(self, candidate, outcome):
        """Whether the candidate passes here and wherever else ``verify`` checks it."""
        if not outcome.passes(self.tol):
            return False
        if self.verify is None:
            return True
        with installed(Fix(candidate, 0, 0.0)), _quiet():
            return self.verify()


@contextlib.contextmanager
def installed(fix):
    """Within: the fix's edits compiled into the functions they edit."""
    for edit in fix.edits:
        edit.apply()
    try:
        codes = [(e.source, e.source.compile()) for e in _by_source(fix.edits)]
    finally:
        for edit in reversed(fix.edits):
            edit.revert()
    with _installed(codes):
        yield


@contextlib.contextmanager
def _quiet():
    """Within: a candidate's overflows and invalid values are not warned of."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


def _by_source(candidate):
    seen, first = set(), []
    for edit in candidate:
        if id(edit.source) not in seen:
            seen.add(id(edit.source))
            first.append(edit)
    return first


class _installed:
    """Within: each (source, code) installed."""

    def __init__(self, codes):
        self.contexts = [source.install(code) for source, code in codes]

    def __enter__(self):
        for context in self.contexts:
            context.__enter__()

    def __exit__(self, *exc):
        for context in reversed(self.contexts):
            context.__exit__(*exc)


# -- what the search edits, and in which order ------------------------------------------------


def scope_of(recorded, source, pending, reference=None):
    """The ``Scope`` the error model sees for one function, from the trace."""
    selves = [m for m in recorded.self_of(source.code) if m is not None]
    attributes = {}
    for layer in selves[:1]:
        attributes = {name: value for name, value in vars(layer).items()
                      if isinstance(value, (int, float)) and not isinstance(value, bool)}
    uncalled = []
    for layer in selves[:1]:
        uncalled = [name for name, value in vars(layer).items()
                    if isinstance(value, Module) and id(value) in pending]
    parameters = [name for name, value in vars(selves[0]).items()
                  if isinstance(value, Parameter)] if selves else []
    positional = _positional(source.tree)
    me = positional[0] if selves and positional else None  # what it calls its layer
    terms, right, sums, products = (), frozenset(), (), ()
    if reference is not None:  # its parameters named as this code names them
        reference = _renamed(reference, positional)
        terms = tuple(n for n in ast.walk(reference) if isinstance(
            n, (ast.Call, ast.BinOp, ast.Subscript)) and not takes_cache(n))
        right = frozenset(ast.unparse(n) for n in ast.walk(reference) if isinstance(n, ast.stmt))
        sums = tuple(n for _, n in term_nodes(reference) if not isinstance(n, ast.Name))
        products = _factors_of(reference)
    return Scope(lambda line: recorded.scope(source.code, line), attributes, tuple(uncalled),
                 terms, tuple(selves), me, tuple(parameters),
                 factors_in([source.tree, *_class_trees(selves[:1])]), _inputs(source.tree, me),
                 right, sums, products)





def _factors_of(tree):
    """The factors of a tree's products that are products or calls themselves, a name
    standing for such a factor counted as its value (``du_dx = TANH_C * (...)``)."""
    values = {n.targets[0].id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                side = values.get(side.id, side) if isinstance(side, ast.Name) else side
                if isinstance(side, (ast.BinOp, ast.Call)):
                    found.append(side)
    return tuple(found)


def _positional(tree):
    """The names of a def's positional parameters."""
    return [a.arg for a in tree.args.posonlyargs + tree.args.args]


def _renamed(tree, names):
    """``tree``, or where its positional parameters are as many as ``names`` and named
    otherwise, a copy that calls them by ``names`` (a reference's ``self, dout`` as the
    code's ``this, grad``)."""
    own = _positional(tree)
    if len(own) != len(names) or own == names or set(names) & (names_in(tree) - set(own)):
        return tree  # (a name the tree uses for something else is not given to a parameter)
    renames = dict(zip(own, names))
    tree = copy.deepcopy(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in renames:
            node.id = renames[node.id]
    return tree


def _inputs(tree, me):
    """The names a function is given: its arguments (``me``, its layer, aside), and what
    it unpacks from its cache."""
    names = [a.arg for a in tree.args.posonlyargs + tree.args.args + tree.args.kwonlyargs
             if a.arg != me]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and takes_cache(node.value):
            for target in node.targets:
                names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return tuple(names)


def _class_trees(selves):
    """The trees of the methods of a layer's classes (its forward among them)."""
    trees = []
    for layer in selves:
        for klass in type(layer).__mro__:
            if klass in (Module, object):
                break
            for value in vars(klass).values():
                if inspect.isfunction(value):
                    try:
                        trees.append(Source(value).tree)
                    except NotEditable:
                        continue
    return trees


RANKS = 4  # the user's code at a suspect line, elsewhere; tinyvit's at one, elsewhere


class _Ranking:
    """An edit's rank in the search: the user's own code before tinyvit's, then the lines
    that ran between the last layer whose gradients are right and the first whose gradients
    are wrong (a backward runs from the output down: the mistake is in what ran just before
    the first wrong gradient), then the rest."""

    def __init__(self, recorded, probe, grads, expected, not_doubled, tol, noise):
        self.suspects = _suspects(recorded, probe, grads, expected, not_doubled, tol, noise)

    def lines(self, source, rank):
        """The lines of ``source``'s statements whose edits have ``rank``."""
        if rank // 2 != in_tinyvit(source.path):
            return set()
        every = {statement.lineno for statement, _, _ in statements(source.tree.body)}
        suspect = {line for code, line in self.suspects if code == source.code}
        return every & suspect if rank % 2 == 0 else every - suspect


def _suspects(recorded, probe, grads, expected, not_doubled, tol, noise):
    """{(code, line)} that ran in the window before the first wrong gradient (every line
    that ran, where the gradients say nothing narrower); where the backward raised, the
    line that raised and the lines that called it; where every value is right, the window
    before the first gradient that a second backward does not double (``not_doubled``,
    names). A layer that holds others (a ViT, its patch embedding) may set its own
    gradients before its inner layers run: its end does not open the window, and where its
    own gradients are the first wrong, the lines of its own methods are suspect too."""
    everything = recorded.ran_between(0, math.inf)
    if isinstance(grads, Exception):
        raised = max((began for began, *_ in recorded.lines), default=0)
        return recorded.ran_between(raised, math.inf) or everything
    wrong = {name for name, want in expected.items()
             if not (measure({name: grads.get(name)}, {name: want}, noise) or FAILS).passes(tol)}
    wrong = wrong or set(not_doubled)  # every value right: those a second backward misses
    spans = [(began, finished) for _, began, finished in recorded.layers]
    start, end, holder = 0, math.inf, None
    for layer, began, finished in recorded.backward_calls():
        own = [probe.names[id(p)] for p in vars(layer).values() if id(p) in probe.names]
        if not own:
            continue
        outer = any(began < b and e < finished for b, e in spans)
        if any(name in wrong for name in own):
            end, holder = finished, (layer, began) if outer else None
            break
        if not outer:
            start = finished
    found = recorded.ran_between(start, end)
    if holder is not None:
        found |= recorded.ran_by(*holder, end)
    return found or everything
