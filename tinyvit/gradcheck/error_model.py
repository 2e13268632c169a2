"""The error model: rewrite rules for array code, each an edit a learner's mistake may
need to be undone, written once for any backward pass (none knows a layer or a bug).

A rule looks at one node of a function's tree and proposes replacements for it:

    sign         a + b for a - b and back, -e for e, -= for +=
    drop         a term of a sum or a difference left out
    name         another name of the same shape in scope: A for Ad, x for xhat, q for k
    transpose    a matmul operand transposed or not, the operands swapped
    axes         the axes of a transpose, or the sizes of a reshape, in another order
    reduction    sum for mean, another axis, keepdims (both, where a whole array's sum
                 was meant per row)
    factor       a factor in scope (self.scale, rstd, the batch size, 2) removed or
                 added, a division for a multiplication
    constant     a number's sign, double or half, an integer one more or one less
    index        :1 for 1:, 0 for :1, a neighbouring index
    swap         two arguments of a call, two items of a tuple or list
    accumulate   += for = on a gradient (or a slice) and back
    call         an elementwise function (exp, log, sqrt, tanh) applied or removed
    order        a loop over layers reversed, two statements in the other order
    discarded    a call whose value was thrown away added where the next line needs it
    backward     a layer's backward that is never called, called
    term         a term added from the code around it (or the reference's)
    product      the product rule's other term: a * x * ds + a * s, s a name ds was
                 computed from (d(x s) = s + x ds)
    reference    the reference's expression in place of one like it (the workbook's)
    copy         an array of its own where one is changed in place (x = x * m for x *= m)
    guard        a statement that reads an optional parameter (a bias) kept for when it is

Each proposal is an ``Edit`` (``edits.py``). Its ``cost`` orders the search: the mistakes
learners make most, first; ``edits`` makes dearer the edits that would leave a computed
value unused or change a statement the reference writes the same way, and cheaper those
of a statement that only names another's value.
"""

import ast
import builtins
import collections
import copy
import functools
import itertools
import math
import numbers

from ..backend import is_array
from .edits import (
    Edit,
    ListHolder,
    attribute_node,
    axes_node,
    axes_value,
    constant,
    elementwise_call,
    expressions,
    is_whole,
    located,
    name_node,
    names_in,
    number_node,
    size_node,
    slot_value,
    statements,
    takes_cache,
    term_nodes,
    term_slots,
    walk,
)

COSTS = {"accumulate": 0.5, "sign": 1.0, "name": 1.0, "transpose": 1.0, "reduction": 1.0,
         "swap": 1.0, "order": 1.0, "factor": 1.5, "axes": 1.5, "index": 1.5,
         "discarded": 1.5, "backward": 2.0, "drop": 1.5, "constant": 2.0, "call": 2.0,
         "reference": 2.5, "term": 3.0, "product": 3.0, "copy": 1.5, "guard": 1.0,
         "group": 1.5}
FAR = 1.5  # added to a rule's cost for its less likely proposals (a permutation of three
#            or more axes, an axis a reduction rarely takes, an array as a factor)
AXES = (0, 1, 2, 3, -1, -2, (0, 2, 3), (0, 1), (2, 3), (1, 2), None)
FUNCTIONS = ("exp", "log", "sqrt", "tanh")  # xp's, applied to a name or taken off it
JOINS = ("concatenate", "stack", "split", "array_split")  # xp's, along an axis= they are given
BROADCAST = tuple(ast.parse(f"x[{index}]", mode="eval").body.slice  # a length-1 axis added
                  for index in (":, None", "None", "..., None"))
MOST_PERMUTED = 6  # axes permuted in every order up to this many (720 orders)
UNKNOWN_NDIM = (3, 4)  # the dimensions tried for an array whose shape the trace does not hold
MOVED = {2: 0.0, 3: 0.5}  # added to a permutation's cost by the axes it moves (1.0 beyond)
UNUSED = 1.5  # added to the cost of an edit that leaves an assigned name unused
RIGHT = 1.0  # added to the cost of an edit of a statement the reference writes the same way
ALIAS = 0.5  # taken off the cost of an edit of a statement that only names another's value



def edits(source, scope, lines=None, holders=None):
    """Every single edit the error model proposes for ``source``'s tree, or for its
    statements that start at ``lines`` alone, each once (two rules that write the same
    statement give one edit). ``holders``: where the slots of its lists of statements are
    kept, shared by the calls that propose one function's edits in parts (so that two edits
    of one list, proposed by two calls, know they clash)."""
    found, holders = [], {} if holders is None else holders
    shared = _Shared(source)
    for statement, body, index in statements(source.tree.body):
        if lines is not None and statement.lineno not in lines:
            continue
        propose = _Proposer(source, scope, statement, found, holders, shared)
        propose.whole(body, index)
        for node, slot in expressions(statement):
            propose.expression(node, slot)
        for slot in term_slots(statement):
            propose.term(slot)
    _leaving_unused(found, source.tree)
    for edit in found:
        statement = edit.statement
        if ast.unparse(statement) in scope.right or _value_text(statement) in scope.right:
            edit.cost += RIGHT
            edit.rewrites_right = True
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Name):
            edit.cost -= ALIAS  # "dA = dAd": where a step is often missing
    return _once(found)


def _value_text(statement):
    value = getattr(statement, "value", None)
    return ast.unparse(value) if isinstance(value, ast.AST) else None


def _leaving_unused(found, tree):
    """Make dearer the edits that take away the last use of a name the function assigns:
    a fix that leaves a computed value unused routes around the mistake, not through it
    (a name for another where the two happen to hold the same value on this input)."""
    assigned = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Store)}
    loads = _loads(tree)
    replaced = _by_node(_loads)  # many edits replace the same node: read it once
    for edit in found:
        gone = collections.Counter()
        for old, new in zip(edit.old, edit.new):
            gone.update(replaced(old))
            gone.subtract(_loads(new))
        if any(count > 0 and loads[name] - count <= 0 and name in assigned
               for name, count in gone.items()):
            edit.cost += UNUSED


def _loads(value):
    """How many times each name's value is read in ``value`` (a read of its .shape, .ndim,
    .dtype or .size alone does not read its values)."""
    shape_only = {id(n.value) for n in walk(value) if isinstance(n, ast.Attribute)
                  and n.attr in ("shape", "ndim", "dtype", "size")}
    return collections.Counter(n.id for n in walk(value) if isinstance(n, ast.Name)
                               and isinstance(n.ctx, ast.Load) and id(n) not in shape_only)


def _once(found):
    """The edits that change what they replace, each change once (the cheapest)."""
    kept, replaced = {}, _by_node(_text)
    for edit in sorted(found, key=lambda e: e.cost):
        new = tuple(_text(n) for n in edit.new)
        if new == tuple(replaced(o) for o in edit.old):
            continue  # no change (two equal items swapped, a bound moved onto itself)
        kept.setdefault((tuple((id(p), f, i) for p, f, i in edit.slots), new), edit)
    return list(kept.values())


def _by_node(function):
    """``function`` of a node, computed once per node (by identity) for the edits of one
    call of ``edits``, which read the same nodes many times over. Each node is held with
    its result, so that no other node takes its id while the results are kept."""
    results = {}

    def once(node):
        if id(node) not in results:
            results[id(node)] = node, function(node)
        return results[id(node)][1]
    return once


def _text(node):
    """A node, a list of nodes or a name, as text."""
    if isinstance(node, list):
        return ", ".join(_text(n) for n in node)
    return ast.unparse(node) if isinstance(node, ast.AST) else repr(node)


class _Shared:
    """What the proposers of one ``edits`` call would each compute alike, computed once:
    the function's own terms, a term taken of a name (``_taken_of``), a node's text."""

    def __init__(self, source):
        self.source, self.taken = source, {}
        self.text = _by_node(ast.unparse)

    @functools.cached_property
    def own_terms(self):
        return [n for _, n in term_nodes(self.source.tree) if _is_term(n)]

    def taken_of(self, term, name):
        if (id(term), name) not in self.taken:  # term: held, as _by_node holds its nodes
            self.taken[id(term), name] = term, _taken_of(term, name)
        return self.taken[id(term), name][1]


class _Proposer:
    """The rules applied to one statement and its expressions, appending to ``found``."""

    def __init__(self, source, scope, statement, found, holders, shared):
        self.source, self.scope, self.statement, self.found = source, scope, statement, found
        self.holders, self.shared = holders, shared
        self.me = scope.me  # the name of the layer it is a method of: self, by custom
        self.line = statement.lineno

    def at(self, body, index):
        """The slot of statement ``index`` of ``body``."""
        holder = self.holders.setdefault(id(body), ListHolder(body))
        return (holder, "items", index)

    def add(self, rule, slots, new, extra=0.0, owners=None, **detail):
        if not isinstance(slots, list):
            slots, new = [slots], [new]
        self.found.append(Edit(self.source, slots, new, rule, COSTS[rule] + extra, detail,
                               self.line, self.statement, self.scope, owners))

    # statements ------------------------------------------------------------------------

    def whole(self, body, index):
        s = self.statement
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and _accumulates(s.targets[0]):
            self.add("accumulate", self.at(body, index), located(
                ast.AugAssign(target=s.targets[0], op=ast.Add(), value=s.value), s),
                was="=", now="+=")
        if isinstance(s, ast.AugAssign):
            if isinstance(s.op, ast.Add) and _accumulates(s.target):
                self.add("accumulate", self.at(body, index), located(
                    ast.Assign(targets=[s.target], value=s.value), s), was="+=", now="=")
            if isinstance(s.op, (ast.Add, ast.Sub)):
                op = ast.Sub() if isinstance(s.op, ast.Add) else ast.Add()
                self.add("sign", self.at(body, index), located(
                    ast.AugAssign(target=s.target, op=op, value=s.value), s),
                    extra=1.0 if isinstance(op, ast.Sub) else 0.0)  # gradients add up: += usual
        if isinstance(s, ast.For):
            self._reversed(s)
        if isinstance(s, ast.If) and s.orelse:
            swapped = ast.If(test=s.test, body=s.orelse, orelse=s.body)
            self.add("order", self.at(body, index), located(swapped, s), what="branches")
        if index + 1 < len(body) and not isinstance(body[index + 1], (ast.Return,)):
            following = body[index + 1]
            if _movable(s) and _movable(following):
                self.add("order", [self.at(body, index), self.at(body, index + 1)],
                         [following, s], first=following.lineno)
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            self._discarded(body, index)
        self._copies(body, index)
        self._guards(body, index)
        self._swapped_layers(body, index)
        self._swapped_steps(body, index)
        self._dropped(body, index)

    def _swapped_steps(self, body, index):
        """Two steps of a chain in each other's place: g = f(A, d); g = h(g) for
        g = h(d); g = f(A, g), the dropout's backward and the softmax's in the wrong order.
        The second step's call reads the first's name; each call keeps what it is given
        but for the gradient the chain hands on."""
        s, following = self.statement, body[index + 1] if index + 1 < len(body) else None
        if not (_chain_step(s) and _chain_step(following)):
            return
        name = s.targets[0].id
        handed = [i for i, a in enumerate(following.value.args) if _is_name(a, name)]
        if len(handed) != 1:
            return
        for i, given in enumerate(s.value.args):
            if isinstance(given, ast.Name) and given.id in self.scope.arrays(self.line):
                first = copy.deepcopy(following.value)
                first.args[handed[0]] = given
                second = copy.deepcopy(s.value)
                second.args[i] = ast.Name(id=name, ctx=ast.Load())
                self.add("order", [(s, "value", None), (following, "value", None)],
                         [located(first, s.value), located(second, following.value)],
                         owners=[s, following], what="steps")

    def _dropped(self, body, index):
        """A step that does not belong: a statement that gives a name already holding an
        array a new value computed from it (t = (1 - eps) * t + eps / K done twice)."""
        s = self.statement
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(
                s.targets[0], ast.Name) and s.targets[0].id in self.scope.arrays(self.line) \
                and s.targets[0].id in names_in(s.value):
            self.add("drop", self.at(body, index), located(ast.Pass(), s), extra=0.5,
                     what="statement")

    def _copies(self, body, index):
        """An array changed in place that is another's too: x = x * m for x *= m, and
        x = y.copy() for x = y where x is then changed in place."""
        s, arrays = self.statement, self.scope.arrays(self.line)
        if isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name) and \
                s.target.id in arrays:
            value = ast.BinOp(left=ast.Name(id=s.target.id, ctx=ast.Load()), op=s.op,
                              right=s.value)
            self.add("copy", self.at(body, index), located(ast.Assign(
                targets=[ast.Name(id=s.target.id, ctx=ast.Store())], value=value), s))
        if isinstance(s, ast.Assign) and isinstance(s.value, ast.Name) and \
                s.value.id in arrays:
            copied = ast.Call(func=ast.Attribute(value=s.value, attr="copy", ctx=ast.Load()),
                              args=[], keywords=[])
            self.add("copy", (s, "value", None), located(copied, s.value))

    def _guards(self, body, index):
        """A statement that reads a parameter of self that is None in some layer (a Linear
        without bias), kept for the layers that have it."""
        s = self.statement
        for node in ast.walk(s):
            if isinstance(node, ast.Attribute) and _is_name(node.value, self.me) and any(
                    getattr(layer, node.attr, 0) is None for layer in self.scope.selves):
                test = ast.Compare(left=attribute_node(self.me, s, node.attr), ops=[ast.IsNot()],
                                   comparators=[ast.Constant(value=None)])
                self.add("guard", self.at(body, index), located(ast.If(
                    test=test, body=[s], orelse=[]), s), attribute=node.attr)
                return

    def _swapped_layers(self, body, index):
        """Two layers' backward passes called in each other's place (self.proj for
        self.proj_drop): their names swapped between two statements, or in one."""
        here = _layer_calls(self.statement, self.me)
        for later in body[index:]:
            for first in here:
                for second in _layer_calls(later, self.me):
                    if first is second or first.attr == second.attr:
                        continue
                    self.add("order", [(first, "attr", None), (second, "attr", None)],
                             [second.attr, first.attr], owners=[self.statement, later],
                             what="layers", first=first.attr, second=second.attr)

    def _reversed(self, loop):
        it = loop.iter
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "reversed" \
                and len(it.args) == 1:
            self.add("order", (loop, "iter", None), it.args[0], what="reversed")
        else:
            self.add("order", (loop, "iter", None), located(ast.Call(
                func=ast.Name(id="reversed", ctx=ast.Load()), args=[it], keywords=[]), it),
                what="reversed")

    def _discarded(self, body, index):
        """A call whose value is thrown away: its value is what a later statement lacks."""
        call = body[index].value
        for later in body[index + 1:index + 3]:
            if isinstance(later, (ast.Return, ast.Assign, ast.AugAssign)) and later.value:
                gone = located(ast.Pass(), body[index])
                plus = located(ast.BinOp(left=later.value, op=ast.Add(), right=call),
                                later.value)
                slots = [self.at(body, index), (later, "value", None)]
                self.add("discarded", slots, [gone, plus], owners=[None, later], how="added")
                self.add("discarded", slots, [gone, call], extra=0.5, owners=[None, later],
                         how="used")
                break
        arrays = self.scope.arrays(self.line)
        after = body[index + 1] if index + 1 < len(body) else None
        for name in sorted(names_in(after) & set(arrays) if after is not None else ()):
            kept = ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=call)
            self.add("discarded", self.at(body, index), located(kept, body[index]),
                     how="kept", name=name)

    # expressions -----------------------------------------------------------------------

    def expression(self, node, slot):
        if self.scope.terms:
            self.reference(node, slot)
        if isinstance(node, ast.BinOp):
            self._binop(node, slot)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            self.add("sign", slot, node.operand)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self._names(node, slot)
        elif isinstance(node, ast.Attribute) and node.attr == "T":
            self.add("transpose", slot, node.value, extra=0.5, what="untransposed")
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            self._attributes(node, slot)
        elif isinstance(node, ast.Call):
            self._call(node, slot)
        elif isinstance(node, ast.Subscript):
            self._index(node)
            if ast.unparse(node.slice) in {ast.unparse(b) for b in BROADCAST}:
                self.add("index", slot, node.value, extra=0.5, what="axis removed")
            if isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
                self._sizes(node, slot)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
                node.ops[0], (ast.Eq, ast.NotEq)):
            flipped = ast.NotEq() if isinstance(node.ops[0], ast.Eq) else ast.Eq()
            self.add("sign", slot, located(ast.Compare(left=node.left, ops=[flipped],
                                                       comparators=node.comparators), node),
                     what="comparison")
        elif isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) >= 2:
            defines = isinstance(node.ctx, ast.Store) or (
                isinstance(slot[0], ast.Assign) and isinstance(slot[0].targets[0], ast.Tuple))
            self._swaps(node, "elts", extra=1.0 if defines else 0.0)  # renames, in effect
        number = constant(node)
        if number is not None and not (isinstance(node, ast.Constant) and isinstance(
                slot[0], ast.UnaryOp)):
            self._constants(node, slot, number)

    def _binop(self, node, slot):
        op = node.op
        if isinstance(slot[0], ast.BinOp):  # an operand of arithmetic: average(g * xhat)
            self._applied(node, slot)
        self._regrouped(node, slot)
        if isinstance(op, (ast.Add, ast.Sub)):
            flipped = located(ast.BinOp(left=node.left, op=ast.Sub() if isinstance(op, ast.Add)
                                         else ast.Add(), right=node.right), node)
            self.add("sign", slot, flipped)
            if isinstance(op, ast.Sub):
                self.add("sign", slot, located(ast.BinOp(left=node.right, op=op,
                                                          right=node.left), node))
            # not / (1 - p) -> / (1): the factor rule takes the whole / (1 - p) away
            factor = isinstance(slot[0], ast.BinOp) and isinstance(slot[0].op, (ast.Mult,
                                                                              ast.Div))
            if not (factor and constant(node.left) == 1):
                self.add("drop", slot, node.left, kept="left")
            right = node.right if isinstance(op, ast.Add) else located(
                ast.UnaryOp(op=ast.USub(), operand=node.right), node.right)
            self.add("drop", slot, right, kept="right")
        elif isinstance(op, ast.MatMult):
            self.add("transpose", slot, located(ast.BinOp(left=node.right, op=op,
                                                           right=node.left), node),
                     what="swapped")
            for field in ("left", "right"):
                self._transposed((node, field, None))
            product = ast.Call(func=ast.Attribute(value=node, attr="swapaxes", ctx=ast.Load()),
                               args=[number_node(-1, node), number_node(-2, node)], keywords=[])
            self.add("transpose", slot, located(product, node), extra=0.5, what="product")
        elif isinstance(op, (ast.Mult, ast.Div)):
            for field, other in (("left", "right"), ("right", "left")):
                if isinstance(op, ast.Div) and field == "left":
                    continue  # a / f: f is the factor
                kept = getattr(node, other)
                self.add("factor", slot, kept, extra=-0.5 if _factor_like(getattr(node, field))
                         else 0.5, what="removed", factor=getattr(node, field))
            other_op = ast.Div() if isinstance(op, ast.Mult) else ast.Mult()
            self.add("factor", slot, located(ast.BinOp(left=node.left, op=other_op,
                                                        right=node.right), node), what="op",
                     extra=-0.25)  # before a factor put beside it: a / s -> a * s
        if isinstance(op, ast.FloorDiv) or (isinstance(op, ast.Div) and self._whole(node)):
            # D / NH for D // NH, and back
            other_op = ast.FloorDiv() if isinstance(op, ast.Div) else ast.Div()
            self.add("factor", slot, located(ast.BinOp(left=node.left, op=other_op,
                                                        right=node.right), node),
                     what="whole" if isinstance(op, ast.Div) else "true")
        elif isinstance(op, ast.Pow):
            pass  # its exponent is a constant, edited as one

    def _regrouped(self, node, slot):
        """The parentheses moved over an operand that is itself an operation: (1 - t) ** 2
        for 1 - t ** 2, and back; not where both groupings are the same value."""
        if not isinstance(node.op, GROUPED):
            return
        for field in ("left", "right"):
            inner = getattr(node, field)
            if not (isinstance(inner, ast.BinOp) and isinstance(inner.op, GROUPED)):
                continue
            if field == "left":  # (a first b) second c -> a first (b second c)
                first, second = inner.op, node.op
                new = ast.BinOp(left=inner.left, op=first,
                                right=ast.BinOp(left=inner.right, op=second, right=node.right))
            else:  # a first (b second c) -> (a first b) second c
                first, second = node.op, inner.op
                new = ast.BinOp(left=ast.BinOp(left=node.left, op=first, right=inner.left),
                                op=second, right=inner.right)
            if not _associative(first, second):
                self.add("group", slot, located(new, node), grouped=new)

    def _transposed(self, slot):
        """A matmul operand with its last two axes swapped, or no longer swapped."""
        operand = slot_value(slot)
        inner = _untransposed(operand)
        if inner is not None:
            self.add("transpose", slot, inner, what="untransposed")
            return
        shapes = self._shapes_of(operand)
        if shapes and all(len(s) == 2 for s in shapes):
            new = ast.Attribute(value=operand, attr="T", ctx=ast.Load())
        else:
            new = ast.Call(func=ast.Attribute(value=operand, attr="swapaxes", ctx=ast.Load()),
                           args=[number_node(-1, operand), number_node(-2, operand)], keywords=[])
        self.add("transpose", slot, located(new, operand), what="transposed")

    def _shapes_of(self, node):
        """The shapes a name, an attribute of ``self`` (self.weight.data), or an expression
        of them free of side effects held here (the last, evaluated on the traced values)."""
        if isinstance(node, ast.Name):
            return self.scope.shapes(self.line).get(node.id, set())
        if not isinstance(node, ast.Attribute):
            return self._evaluated_shapes(node)
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if not _is_name(node, self.me):
            return set()
        shapes = set()
        for value in self.scope.selves:
            for attribute in reversed(chain):
                value = getattr(value, attribute, None)
            if is_array(value):
                shapes.add(tuple(value.shape))
        return shapes

    def _cancels(self, node, op, factor):
        """Whether applying ``op`` by ``factor`` to ``node`` undoes one of the factors of
        its product: x / f * f by text; x * s * (1 - p), where s = 1 / (1 - p), by value."""
        new = self._multiplier(factor, op)
        while isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
            if type(node.op) is not type(op) and ast.unparse(node.right) == ast.unparse(factor):
                return True
            old = self._multiplier(node.right, node.op)
            if old and len(old) == len(new) and all(
                    abs(a * b - 1.0) <= 1e-12 for a, b in zip(old, new)):
                return True
            node = node.left
        return False

    def _multiplier(self, node, op):
        """What multiplying (or dividing, ``op``) by ``node`` multiplies by, on each call's
        values at this line, where those are nonzero numbers; else []."""
        values = self._evaluated(node)
        if not values or not all(isinstance(v, numbers.Real) and v for v in values):
            return []
        return [float(v) if isinstance(op, ast.Mult) else 1.0 / float(v) for v in values]

    def _whole(self, division):
        """Whether a division may be of whole numbers (sizes, indices): each side that could
        be evaluated at this line held whole numbers or arrays of them (``shape[-1] / 2`` of
        a tuple the trace does not keep may; ``argmax / kw`` may; ``1.0 / (1 - p)`` may
        not)."""
        return all(is_whole(v) or (is_array(v) and v.dtype.kind in "iu")
                   for side in (division.left, division.right) for v in self._evaluated(side))

    def _evaluated_shapes(self, node):
        """The shapes ``node`` takes on the values each call held at this line, where it
        only reads names and computes on arrays (no call of a layer's or the user's)."""
        return {tuple(value.shape) for value in self._evaluated(node) if is_array(value)}

    def _evaluated(self, node):
        """The values ``node`` takes on the values each call held at this line (those it
        could be computed on), where it is ``_pure``; else none."""
        if not _pure(node, self.me):
            return []
        code = compile(ast.fix_missing_locations(ast.Expression(body=node)), "<value>", "eval")
        names = dict(self.source.function.__globals__)
        if self.me is not None and self.scope.selves:  # self.d ** 0.5, on the layer's values
            names[self.me] = self.scope.selves[0]
        found = []
        for values in _scopes(self.scope, self.line):
            try:
                found.append(eval(code, names, values))
            except Exception:
                continue
        return found

    @functools.cached_property
    def computed_numbers(self):
        """The expressions the layer's code multiplies or divides by somewhere (the
        forward's ``np.sqrt(x.shape[-1])``, ``self.d ** 0.5``, ``x.shape[0]``) that compute
        one number from what is known here, on every call: a scale the backward may have
        left out or written as its value, offered as it is written (its value fits this
        shape alone)."""
        found = []
        for text in sorted(self.scope.factors):
            node = _unlocated(ast.parse(text, mode="eval").body)
            if not ((isinstance(node, (ast.Call, ast.BinOp)) or _is_size(node))
                    and self.known(node)):
                continue
            values = self._evaluated(node)
            if values and all(isinstance(v, (int, float)) or (is_array(v) and v.ndim == 0)
                              for v in values):
                found.append(node)
        return found

    def _numbers_called(self, like):
        """``computed_numbers``, each a node of its own placed at ``like``."""
        return [located(copy.deepcopy(node), like) for node in self.computed_numbers]

    def _names(self, node, slot):
        arrays = self.scope.shapes(self.line)
        if node.id in arrays:
            sizes = {math.prod(s) for s in arrays[node.id]}
            for other, shapes in arrays.items():
                if other != node.id and shapes & arrays[node.id]:
                    self.add("name", slot, name_node(other, node), was=node.id, now=other)
                elif other != node.id and {math.prod(s) for s in shapes} & sizes:
                    self.add("name", slot, name_node(other, node), extra=0.5, was=node.id,
                             now=other)  # the same values in another shape (a reshape)
            if not isinstance(slot[0], (ast.Subscript, ast.Attribute)):  # x[:, None]: an axis
                for index in BROADCAST:                                  # to broadcast along
                    widened = ast.Subscript(value=node, slice=copy.deepcopy(index),
                                            ctx=ast.Load())
                    self.add("index", slot, located(widened, node), extra=0.5, what="axis")
            if _argument_of_backward(slot):  # self.fc2.backward(self.drop2.backward(dout))
                for layer in self.scope.uncalled:
                    self.add("backward", slot, _backward_call(self.me, layer, node), layer=layer)
            if isinstance(slot[0], (ast.Attribute, ast.Call, ast.Subscript)):
                for other, shapes in arrays.items():  # (dout * xhat).sum() for dout.sum()
                    if other != node.id and shapes & arrays[node.id]:
                        product = ast.BinOp(left=node, op=ast.Mult(), right=name_node(other, node))
                        self.add("factor", slot, located(product, node), extra=0.5,
                                 what="added", factor=name_node(other, node))
            for function in FUNCTIONS:
                self.add("call", slot, located(ast.Call(func=ast.Attribute(
                    value=ast.Name(id="xp", ctx=ast.Load()), attr=function, ctx=ast.Load()),
                    args=[node], keywords=[]), node), extra=0.5, what="applied",
                    function=f"xp.{function}")
            self._applied(node, slot)
            return
        # a size for another size; not a size for Lo = L / k, whose / is the mistake (any
        # size that happens to equal L // k would pass)
        numbers = self.scope.numbers(self.line)
        if node.id in numbers and all(is_whole(v) for v in numbers[node.id]):
            for other, values in numbers.items():
                if other != node.id and all(isinstance(v, int) for v in values):
                    self.add("name", slot, name_node(other, node), extra=0.5, was=node.id,
                             now=other)

    def _applied(self, node, slot):
        """A function this code calls on one array elsewhere (average, normal_pdf) applied
        here too, to a name or to an operand of arithmetic."""
        for func in self.unary:
            if ast.unparse(func) in ast.unparse(node):
                continue
            self.add("call", slot, located(ast.Call(func=copy.deepcopy(func), args=[node],
                                                     keywords=[]), node),
                     what="applied", function=ast.unparse(func))

    @functools.cached_property
    def unary(self):
        """The functions this code calls with one argument and nothing else, once each (the
        functions of FUNCTIONS aside: they are applied anyway)."""
        found = {}
        for node in ast.walk(self.source.tree):
            if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords and \
                    not isinstance(node.args[0], ast.Starred):
                text = ast.unparse(node.func)
                if not text.endswith(tuple(f".{f}" for f in FUNCTIONS)) and \
                        not text.endswith(("_take_cache", ".backward")):
                    found.setdefault(text, node.func)
        return list(found.values())

    def _attributes(self, node, slot):
        """self.head_dim for self.num_heads, self.stride for self.kernel_size: another
        attribute of self of the same kind (a number, a pair)."""
        if not _is_name(node.value, self.me):
            return
        for layer in self.scope.selves[:1]:
            value = getattr(layer, node.attr, None)
            kind = _kind_of(value)
            if kind is None:
                return
            for other, held in vars(layer).items():
                if other != node.attr and not other.startswith("_") and _kind_of(held) == kind:
                    self.add("name", slot, attribute_node(self.me, node, other), extra=0.5,
                             was=f"{self.me}.{node.attr}", now=f"{self.me}.{other}")

    def _sizes(self, node, slot):
        """A size written as x.shape[i] replaced by a number in scope (V for dout.shape[0])."""
        for other, values in self.scope.numbers(self.line).items():
            if all(isinstance(v, int) for v in values):
                self.add("name", slot, name_node(other, node), extra=1.0, was=ast.unparse(node),
                         now=other)

    def _call(self, node, slot):
        func = node.func
        method = func.attr if isinstance(func, ast.Attribute) else None
        if method in ("sum", "mean"):
            self._reduction(node, slot, method)
        elif method in JOINS:
            self._join_axis(node, slot)
        elif method == "transpose" and len(node.args) >= 2:
            self._permutations(node, "args", "transpose")
        elif method == "reshape" and len(node.args) >= 2 and not any(
                isinstance(a, ast.Starred) for a in node.args):
            self._permutations(node, "args", "reshape")
            self._moved_back(node, slot)
        if method == "transpose" and node.args:
            self.add("axes", slot, func.value, extra=-0.5, what="transpose")
        if method == "reshape":
            self._transposed_first(node, slot)
        elif method == "swapaxes" and len(node.args) == 2:
            self._swapaxes(node)
        if _untransposed(node) is None and len(node.args) >= 2 and method not in (
                "transpose", "reshape", "swapaxes"):
            self._swaps(node, "args")
        inner = node.args[0] if len(node.args) == 1 else None
        if isinstance(func, ast.Attribute) and isinstance(inner, ast.Call) and len(
                inner.args) == 1 and isinstance(inner.func, ast.Attribute):
            swapped = ast.Call(func=inner.func, args=[ast.Call(
                func=func, args=inner.args, keywords=node.keywords)], keywords=inner.keywords)
            self.add("order", slot, located(swapped, node), what="nested")
        if elementwise_call(node) and isinstance(slot[0], ast.BinOp) and isinstance(
                slot[0].op, (ast.Mult, ast.Div)):  # 1 / cosh(u) for sech(u)^2 = 1 / cosh(u)^2
            squared = ast.BinOp(left=node, op=ast.Pow(), right=ast.Constant(value=2))
            self.add("factor", slot, located(squared, node), extra=0.5, what="squared")
        if method in FUNCTIONS and len(node.args) == 1 or (
                isinstance(func, ast.Name) and len(node.args) == 1 and not node.keywords):
            self.add("call", slot, node.args[0], what="removed", function=ast.unparse(func))

    def _join_axis(self, node, slot):
        """The axis arrays are joined along or split at (``axis=1`` for ``axis=-1``)."""
        axis = [k for k in node.keywords if k.arg == "axis"]
        current = constant(axis[0].value) if axis else None
        others = [k for k in node.keywords if k.arg != "axis"]
        for value in (-1, 0, 1, -2, 2):  # the last axis first: where features are joined
            if value != current:
                keyword = ast.keyword(arg="axis", value=number_node(value, node))
                self.add("axes", slot, located(ast.Call(func=node.func, args=node.args,
                                                        keywords=[*others, keyword]), node),
                         extra=0.5, what="join", now=value, was=current)

    def _reduction(self, node, slot, method):
        other = "mean" if method == "sum" else "sum"
        self.add("reduction", slot, located(ast.Call(
            func=ast.Attribute(value=node.func.value, attr=other, ctx=ast.Load()),
            args=node.args, keywords=node.keywords), node), was=method, now=other)
        axis = [k for k in node.keywords if k.arg == "axis"]
        keepdims = [k for k in node.keywords if k.arg == "keepdims"]
        receiver_args = node.args  # x.sum(axis) or xp.sum(x, axis)
        positional = 1 if (isinstance(node.func.value, ast.Name)
                           and node.func.value.id in ("xp", "np", "cp")) else 0
        current = False
        if axis:
            current = axes_value(axis[0].value)
        elif len(receiver_args) > positional:
            current = axes_value(receiver_args[positional])
        elif not axis:
            current = None
        others = [k for k in node.keywords if k.arg != "axis"]
        args = receiver_args[:positional]
        for axes in AXES:
            if current is not False and axes == current:
                continue
            keywords = others if axes is None else [ast.keyword(arg="axis", value=axes_node(
                axes, node)), *others]
            extra = 0 if isinstance(axes, int) and axes in (0, 1, -1) else FAR / 2
            self.add("reduction", slot, located(ast.Call(
                func=node.func, args=args, keywords=keywords), node), extra=0.5 + extra,
                what="axis", axes=axes)
            if current is None and axes is not None and not keepdims:  # the whole array's,
                keep = ast.keyword(arg="keepdims", value=ast.Constant(value=True))  # per row
                self.add("reduction", slot, located(ast.Call(
                    func=node.func, args=args, keywords=[*keywords, keep]), node),
                    extra=0.5 + extra, what="axis", axes=axes, keep=True)
        if keepdims:
            kept = [k for k in node.keywords if k.arg != "keepdims"]
            self.add("reduction", slot, located(ast.Call(func=node.func, args=node.args,
                                                          keywords=kept), node), extra=0.5,
                     what="keepdims", keep=False)
        else:
            keep = ast.keyword(arg="keepdims", value=ast.Constant(value=True))
            self.add("reduction", slot, located(ast.Call(func=node.func, args=node.args,
                                                          keywords=[*node.keywords, keep]), node),
                     extra=0.5, what="keepdims", keep=True)

    def _permutations(self, node, field, what):
        items = getattr(node, field)
        n = len(items)
        if n > MOST_PERMUTED:
            return
        for order in itertools.permutations(range(n)):
            if list(order) == list(range(n)):
                continue
            moved = sum(i != j for i, j in enumerate(order))
            new = located(ast.Call(func=node.func, args=[items[i] for i in order],
                                    keywords=node.keywords), node)
            self.add("axes", [(node, field, None)], [new.args], extra=MOVED.get(moved, 1.0),
                     what=what)

    def _moved_back(self, node, slot):
        """x.reshape(sizes in another order).transpose(back): the same shape, the entries
        laid out as the forward's reshape had them (the sizes swapped or turned by three)."""
        n = len(node.args)
        for order in _near_orders(n):
            moved = sum(i != j for i, j in enumerate(order))
            back = [order.index(i) for i in range(n)]
            reshaped = ast.Call(func=node.func, args=[node.args[i] for i in order],
                                keywords=node.keywords)
            moved_back = ast.Call(func=ast.Attribute(value=reshaped, attr="transpose",
                                                     ctx=ast.Load()),
                                  args=[number_node(b, node) for b in back], keywords=[])
            self.add("axes", slot, located(moved_back, node), extra=1.0 + MOVED[moved],
                     what="reshape")

    def _transposed_first(self, node, slot):
        """x.transpose(two axes swapped, or one axis moved).reshape(...): the axes laid out
        as they are to merge before the reshape merges them."""
        receiver = node.func.value
        shapes = self._shapes_of(receiver)
        for ndim in {len(s) for s in shapes} if shapes else UNKNOWN_NDIM:
            for order in _near_orders(ndim, cycles=False) + _moves(ndim):
                turned = ast.Call(func=ast.Attribute(value=receiver, attr="transpose",
                                                     ctx=ast.Load()),
                                  args=[number_node(i, node) for i in order], keywords=[])
                new = ast.Call(func=ast.Attribute(value=turned, attr="reshape", ctx=ast.Load()),
                               args=node.args, keywords=node.keywords)
                self.add("axes", slot, located(new, node), extra=1.0, what="transpose first")

    def _swapaxes(self, node):
        pairs = [(-1, -2), (0, 1), (1, 2), (2, 3), (1, 3), (0, 2)]
        current = tuple(constant(a) for a in node.args)
        for pair in pairs:
            if set(pair) != set(current):
                self.add("axes", [(node, "args", None)], [[number_node(pair[0], node.args[0]),
                                                          number_node(pair[1], node.args[1])]],
                         what="swapaxes")

    def _swaps(self, node, field, extra=0.0):
        items = getattr(node, field)
        if any(isinstance(item, ast.Starred) for item in items):
            return
        for i, j in itertools.combinations(range(len(items)), 2):
            swapped = list(items)
            swapped[i], swapped[j] = items[j], items[i]
            self.add("swap", [(node, field, None)], [swapped], extra=extra,
                     first=ast.unparse(items[i]), second=ast.unparse(items[j]))

    def _index(self, node):
        """:1 for 1:, 0 for :1 and back, a neighbouring index."""
        index = node.slice
        elts = index.elts if isinstance(index, ast.Tuple) else [index]
        field = (index, "elts") if isinstance(index, ast.Tuple) else (node, "slice")
        shape = isinstance(node.value, ast.Attribute) and node.value.attr == "shape"
        for i, item in enumerate(elts):
            slot = (field[0], field[1], i if isinstance(index, ast.Tuple) else None)
            for new in _index_variants(item):
                detail = dict(what="shape", was=ast.unparse(item), now=ast.unparse(new)) if \
                    shape else dict(what="bound") if getattr(item, "step", None) else {}
                self.add("index", slot, located(new, item), **detail)

    def _constants(self, node, slot, number):
        parent = slot[0]
        if isinstance(parent, (ast.Subscript, ast.Slice, ast.keyword, ast.Tuple)) or (
                isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute)
                and parent.func.attr in ("transpose", "reshape", "swapaxes")):
            return  # indices and axes have rules of their own
        for computed in self._numbers_called(node):  # 2 where the code means sqrt(D)
            self.add("constant", slot, computed, was=number, now=ast.unparse(computed))
        values = [-number] if number else []
        values += [2 * number, number / 2] if isinstance(number, float) else [number + 1,
                                                                               number - 1]
        for value in values:
            if value != number:
                self.add("constant", slot, number_node(value, node), was=number, now=value)

    # terms -----------------------------------------------------------------------------

    def term(self, slot):
        """Terms and factors added, signs flipped, a layer's backward applied. A factor of
        a product takes none of these but a term, where it is a sum: what a factor would
        get, the whole product gets."""
        node, parent = slot_value(slot), slot[0]
        if node is None or constant(node) is not None:
            return  # a number: the constant rule edits it
        factor_of = isinstance(parent, ast.BinOp) and isinstance(parent.op, (ast.Mult, ast.Div))
        is_sum = isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub))
        if not factor_of:
            self.add("sign", slot, located(ast.UnaryOp(op=ast.USub(), operand=node), node),
                     extra=0.5)
            for factor, extra in self.factors:
                for op in (ast.Mult(), ast.Div()):
                    if self._cancels(node, op, factor):
                        continue  # x / f * f: the factor rule takes / f away instead
                    self.add("factor", slot, located(ast.BinOp(left=node, op=op, right=factor),
                                                      node), extra=extra, what="added",
                             factor=factor, op=type(op).__name__)
        for layer in self.scope.uncalled:
            call = _backward_call(self.me, layer, node)
            self.add("backward", slot, call, layer=layer)
            self.add("backward", slot, located(ast.BinOp(left=node, op=ast.Add(), right=call),
                                                node), extra=0.5, layer=layer)
        if factor_of and not is_sum:
            return
        self.product_rule(slot, node)
        text = ast.unparse(node)
        for term, own in self.terms:
            if ast.unparse(term) == text:
                continue
            term = copy.deepcopy(term) if own else term  # it may hold the slot it goes into
            for op in (ast.Add(), ast.Sub()):
                self.add("term", slot, located(ast.BinOp(left=node, op=op, right=term), node),
                         term=ast.unparse(term))

    def product_rule(self, slot, node):
        """The product rule's other term, where a product has one alone: ``a * x * ds``,
        for the derivative of x s, with ``+ a * s`` added (d(x s) = s + x ds): a run of its
        factors written as a name that one of them was computed from (``ds = s * (1 - s)``
        reads s), an array in scope."""
        factors = _factors_of(node)
        if len(factors) < 2:
            return
        arrays = set(self.scope.arrays(self.line))
        for i, j in itertools.combinations(range(len(factors) + 1), 2):
            if j - i == len(factors):
                continue  # the whole product: the term rule adds a name on its own
            run = set().union(*(names_in(f) for f in factors[i:j]))
            sources = set().union(*(_read_by(self.source.tree, n) for n in run)) - run
            for name in sorted(sources & arrays):
                name = name_node(name, self.statement)
                other = functools.reduce(
                    lambda left, right: ast.BinOp(left=left, op=ast.Mult(), right=right),
                    [*factors[:i], name, *factors[j:]])
                self.add("product", slot, located(ast.BinOp(left=node, op=ast.Add(), right=copy
                                                            .deepcopy(other)), node),
                         term=ast.unparse(other), run=" * ".join(map(ast.unparse,
                                                                     factors[i:j])))

    @functools.cached_property
    def factors(self):
        return self._factors()

    @functools.cached_property
    def terms(self):
        """(term, whether it is a node of this statement) for the terms ``_terms`` offers."""
        here = {id(n) for n in ast.walk(self.statement)}
        return [(term, id(term) in here) for term in self._terms()]

    def _factors(self):
        """(a factor node, the extra cost) for every factor in scope at this line: the
        numbers among the names and ``self``'s attributes, 2, then the arrays (the names,
        and the parameters of ``self``)."""
        line, like = self.line, self.statement
        numbers = self.scope.numbers(line)
        found = [name_node(name, like) for name in numbers]
        found += [located(ast.BinOp(left=ast.Name(id=name, ctx=ast.Load()), op=ast.Sub(),
                                     right=ast.Constant(value=1)), like)
                  for name, values in numbers.items() if all(isinstance(v, int) for v in values)]
        found += [attribute_node(self.me, like, attribute) for attribute in self.scope.attributes]
        found += self._numbers_called(like)
        found += [number_node(2, like), number_node(3, like)]
        found += [size_node(name, axis, like) for name in self.scope.inputs
                  if name in self.scope.arrays(line) for axis in (0, -1)]
        arrays = [name_node(name, like) for name in self.scope.arrays(line)]
        arrays += [attribute_node(self.me, like, attribute, "data")
                   for attribute in self.scope.parameters]
        own = {ast.unparse(n) for n in ast.walk(self.source.tree)}
        theirs = [copy.deepcopy(t) for t in self.scope.products if ast.unparse(t) not in own
                  and self.known(t)]  # the reference's, where the code has no such factor
        return [(f, self._usual(f)) for f in found] + [(f, self._usual(f) + FAR / 2)
                                                      for f in arrays] + [(f, FAR) for f in theirs]

    def _usual(self, factor):
        """No extra cost for a factor the layer's code multiplies or divides by somewhere
        (the forward's self.scale), a little for one it does not (self.num_heads)."""
        return 0.0 if ast.unparse(factor) in self.scope.factors else 0.5

    def _terms(self):
        """Terms to add at this line: the names in scope; the terms of this function's sums
        and of the reference's (``scope.sums``) whose names are all known here; and each
        reduction among them (a mean over the features) taken of another name in scope."""
        seen, found = set(), []
        arrays = list(self.scope.arrays(self.line))
        candidates = [name_node(n, self.statement) for n in arrays]
        terms = self.shared.own_terms + list(self.scope.sums)
        candidates += terms
        for term in terms:
            candidates += [t for t in (self.shared.taken_of(term, name) for name in arrays)
                           if t is not None]
        for term in candidates:
            text = self.shared.text(term)
            if text not in seen and self.known(term):
                seen.add(text)
                found.append(term)
        return found

    def known(self, node):
        """Whether every name ``node`` reads is bound here: a local in scope at this line,
        self, or a global or builtin of the function's module."""
        return names_in(node) <= self.bound

    @functools.cached_property
    def bound(self):
        return set(self.scope.names(self.line)) | {self.me} | set(
            self.source.function.__globals__) | set(dir(builtins))

    def reference(self, node, slot):
        """The reference's expression in place of this one where its names are known here:
        one of the same kind (the same function called, the same operator); for the whole
        value of a statement, one that reads every name this one reads; for a name, a call
        of the reference's made on it (dx.reshape(...) for dx)."""
        kind, text = _kind(node), ast.unparse(node)
        whole = slot[1] == "value" and isinstance(slot[0], ast.stmt)
        names = names_in(node)
        for term in self.scope.terms:
            if ast.unparse(term) == text:
                continue
            if not self.known(term):  # dx.reshape(*dout.shape[:-1], self.in_features), on
                made = _called_on(term, node)  # the code's own dX for the reference's dx
                if made is not None and self.known(made) and ast.unparse(made) != text:
                    self.add("reference", slot, made, extra=0.5, term=ast.unparse(made))
                continue
            if kind is not None and _kind(term) == kind:
                self.add("reference", slot, copy.deepcopy(term), term=ast.unparse(term))
            elif whole and names and names <= names_in(term):
                self.add("reference", slot, copy.deepcopy(term), extra=0.5,
                         term=ast.unparse(term))
        if isinstance(node, ast.Name) and node.id in self.scope.arrays(self.line):
            for term in self.scope.terms:
                made = _taken_of(term, node.id, first=True)
                if made is not None and self.known(made) and not self._made_so(node.id, made):
                    self.add("reference", slot, made, extra=0.5, term=ast.unparse(made))

    def _made_so(self, name, call):
        """Whether the code gives ``name`` its value by a call of ``call``'s method already
        (dwin = dwin.reshape(...)): a second one around it where it is read would stack on
        the first, whose own arguments are the ones to edit."""
        method = getattr(call.func, "attr", None) if isinstance(call, ast.Call) else None
        return method is not None and any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                              for t in n.targets)
            and isinstance(n.value, ast.Call) and getattr(n.value.func, "attr", None) == method
            for n in ast.walk(self.source.tree))


GROUPED = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)


def _associative(first, second):
    """Whether a first (b second c) and (a first b) second c are the same value: a + b - c,
    a * b / c, either way."""
    return (isinstance(first, ast.Add) and isinstance(second, (ast.Add, ast.Sub))) or (
        isinstance(first, ast.Mult) and isinstance(second, (ast.Mult, ast.Div)))


def _called_on(term, node):
    """The reference's method call ``term`` made on ``node``'s receiver, where both call
    the same method (x.reshape(...)); else None."""
    if not (isinstance(term, ast.Call) and isinstance(term.func, ast.Attribute)
            and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and term.func.attr == node.func.attr):
        return None
    call = ast.Call(func=ast.Attribute(value=node.func.value, attr=term.func.attr,
                                       ctx=ast.Load()),
                    args=copy.deepcopy(term.args), keywords=copy.deepcopy(term.keywords))
    return located(call, node)


def _kind(node):
    """What makes two expressions alike for the "reference" rule: the function a call
    calls, the operator of an operation; None for names and numbers."""
    if isinstance(node, ast.Call):
        return ("call", ast.unparse(node.func) if not isinstance(node.func, ast.Attribute)
                else node.func.attr)
    if isinstance(node, ast.BinOp):
        return ("op", type(node.op).__name__)
    if isinstance(node, ast.Subscript):
        return ("index", ast.unparse(node.value))
    return None


def _taken_of(term, name, first=False):
    """``term`` taken of another name, or None. Where the term is a reduction (or a call of
    one array), or one divided or multiplied by something, the reduction applied to
    ``name``: ``g.mean(axis=-1)`` from ``(g * xhat).mean(axis=-1)``, ``average(g) / V``
    from ``average(g * xhat) / V``. With ``first``, where the term is a call of any
    function, the call with ``name`` as its first argument (or receiver):
    ``dx.reshape(*dout.shape[:-1], D)`` from ``dx2.reshape(...)``."""
    scaled = not first and isinstance(term, ast.BinOp) and isinstance(term.op, (ast.Mult,
                                                                                 ast.Div))
    call = term.left if scaled else term
    if not isinstance(call, ast.Call) or takes_cache(call):
        return None
    func = call.func
    on_receiver = isinstance(func, ast.Attribute) and (func.attr in ("sum", "mean") or first) \
        and not _is_module(func.value)
    if not on_receiver and not (call.args and (len(call.args) == 1 or first)):
        return None
    made = copy.deepcopy(term)  # copied only now: most terms are no such call
    call = made.left if scaled else made
    argument = ast.Name(id=name, ctx=ast.Load())
    if on_receiver:
        call.func = ast.Attribute(value=argument, attr=func.attr, ctx=ast.Load())
    else:
        call.args = [argument, *call.args[1:]]
    return located(made, term)


def _is_module(node):
    """Whether a call's receiver is a module (xp.sum(...)), not an array (g.sum(...))."""
    return isinstance(node, ast.Name) and node.id in ("xp", "np", "cp")


def _read_by(tree, name):
    """The names that the assignments of ``name`` in ``tree`` read."""
    return set().union(*(names_in(n.value) for n in ast.walk(tree)
                                if isinstance(n, ast.Assign) and any(
                                    isinstance(t, ast.Name) and t.id == name
                                    for t in n.targets)))


def _factors_of(node):
    """The factors of a product written a * b * c (its multiplications alone), in order."""
    found = []
    while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        found.append(node.right)
        node = node.left
    return [node, *reversed(found)] if found else []


def _is_term(node):
    return isinstance(node, (ast.BinOp, ast.Call)) and not isinstance(
        getattr(node, "op", None), ast.Pow) and not takes_cache(node)


def _accumulates(target):
    """Whether a target is one that gradients are added into: a .grad, or a slice."""
    return (isinstance(target, ast.Attribute) and target.attr == "grad") or isinstance(
        target, ast.Subscript)


def _movable(statement):
    return isinstance(statement, (ast.Assign, ast.AugAssign, ast.Expr))


def _factor_like(node):
    """A name, an attribute, a number, an entry, or one of these and a number added or
    subtracted (N - 1, 1 - p): what a factor usually is."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        return (_factor_like(node.left) and constant(node.right) is not None
                or constant(node.left) is not None and _factor_like(node.right))
    return isinstance(node, (ast.Name, ast.Attribute, ast.Constant)) or constant(
        node) is not None or isinstance(node, ast.Subscript)


def _untransposed(node):
    """``x`` for ``x.T``, ``x.swapaxes(-1, -2)`` or a ``transpose`` that swaps the last two
    axes; else None."""
    if isinstance(node, ast.Attribute) and node.attr == "T":
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        values = [constant(a) for a in node.args]
        if node.func.attr == "swapaxes" and set(values) == {-1, -2}:
            return node.func.value
        if node.func.attr == "transpose" and len(values) >= 2 and None not in values:
            n = len(values)
            if values == [*range(n - 2), n - 1, n - 2]:
                return node.func.value
    return None


def _index_variants(item):
    """:1 for 1:, 1: for :-1, 0 for :1, a bound one more or less, a neighbouring index; with
    a step, a bound dropped (::-1 for :0:-1, which stops before the first entry)."""
    if isinstance(item, ast.Slice) and item.step is not None:
        for bound in ("lower", "upper"):
            if constant(getattr(item, bound)) is not None:
                yield ast.Slice(**{"lower": item.lower, "upper": item.upper, "step": item.step,
                                   bound: None})
    if isinstance(item, ast.Slice) and item.step is None:
        lower = constant(item.lower) if item.lower is not None else None
        upper = constant(item.upper) if item.upper is not None else None
        if item.lower is None and isinstance(upper, int):
            for value in {upper, -upper}:
                yield ast.Slice(lower=number_node(value, item.upper), upper=None)
            for value in (upper + 1, upper - 1):
                yield ast.Slice(lower=None, upper=number_node(value, item.upper))
            if upper == 1:
                yield ast.Constant(value=0)
        if item.upper is None and isinstance(lower, int):
            for value in {lower, -lower}:
                yield ast.Slice(lower=None, upper=number_node(value, item.lower))
            for value in (lower + 1, lower - 1):
                yield ast.Slice(lower=number_node(value, item.lower), upper=None)
    number = constant(item)
    if isinstance(number, int):
        for value in (number + 1, number - 1):
            yield number_node(value, item)
        if number == 0:
            yield ast.Slice(lower=None, upper=ast.Constant(value=1))


def factors_in(trees):
    """The text of every operand of a multiplication or a division in ``trees``."""
    found = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Div)):
                found.update(ast.unparse(side) for side in (node.left, node.right))
    return frozenset(found)


def _pure(node, me):
    """Whether an expression only reads names and computes on arrays: arithmetic,
    subscripts, attributes, and calls of array methods, of xp or of ``len`` (not of the
    layer ``me`` names, or of its layers)."""
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call):
            func = inner.func
            if isinstance(func, ast.Name) and func.id == "len":
                continue
            if not isinstance(func, ast.Attribute) or _is_name(func.value, me):
                return False
            if isinstance(func.value, ast.Attribute):  # self.layer.method(...)
                return False
        elif not isinstance(inner, (ast.expr, ast.expr_context, ast.operator, ast.unaryop,
                                    ast.keyword, ast.cmpop)):
            return False
    return True


def _is_size(node):
    """Whether ``node`` reads one size of an array: ``x.shape[0]``."""
    return (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
            and node.value.attr == "shape")


def _unlocated(node):
    """``node`` with no positions (a node parsed from text, to be placed in the code)."""
    for inner in ast.walk(node):
        for field in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
            if hasattr(inner, field):
                delattr(inner, field)
    return node


def _scopes(scope, line):
    """The locals each call held just before ``line`` ran, one dict per call."""
    names = scope.names(line)
    calls = max((len(v) for v in names.values()), default=0)
    return [{name: values[i] for name, values in names.items() if i < len(values)}
            for i in range(calls)]


def _moves(n):
    """The orders of n axes with one axis moved to another place (the others kept in
    order), beyond two swapped."""
    found = []
    for i in range(n):
        for j in range(n):
            if abs(i - j) >= 2:
                order = [a for a in range(n) if a != i]
                order.insert(j, i)
                found.append(order)
    return found


def _near_orders(n, cycles=True):
    """The orders of n axes with two swapped, and (``cycles``) three turned round."""
    found = []
    for i, j in itertools.combinations(range(n), 2):
        order = list(range(n))
        order[i], order[j] = j, i
        found.append(order)
    if cycles:
        for i, j, k in itertools.combinations(range(n), 3):
            for a, b, c in ((j, k, i), (k, i, j)):
                order = list(range(n))
                order[i], order[j], order[k] = a, b, c
                found.append(order)
    return found


def _kind_of(value):
    """What kind of attribute value can stand for another: a number, a pair, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
        return ("tuple", len(value))
    return None


def _is_name(node, name):
    """Whether ``node`` is the name ``name`` (None: no name is)."""
    return isinstance(node, ast.Name) and name is not None and node.id == name


def _chain_step(statement):
    """Whether a statement gives one name the value of a call: a step a chain may take."""
    return (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name)
            and isinstance(statement.value, ast.Call))


def _layer_calls(statement, me):
    """The ``self.<layer>`` nodes (``me`` for self) of the layers' backward passes a
    statement calls."""
    if isinstance(statement, (ast.For, ast.If, ast.While, ast.With)):
        return []
    return [n.func.value for n in ast.walk(statement) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "backward"
            and isinstance(n.func.value, ast.Attribute)
            and _is_name(n.func.value.value, me)]


def _argument_of_backward(slot):
    """Whether a slot is the argument of a layer's backward call."""
    parent, field, _ = slot
    return (isinstance(parent, ast.Call) and field == "args" and isinstance(
        parent.func, ast.Attribute) and parent.func.attr == "backward")


def _backward_call(me, layer, argument):
    """self.<layer>.backward(argument), ``me`` for self."""
    func = ast.Attribute(value=attribute_node(me, argument, layer), attr="backward",
                         ctx=ast.Load())
    return located(ast.Call(func=func, args=[argument], keywords=[]), argument)
