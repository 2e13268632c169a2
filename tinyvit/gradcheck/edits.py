"""What an edit of a function's tree is, and the tree it edits: the error model
(``error_model.py``) proposes ``Edit``s, the search (``repair.py``) applies, compiles and
reverts them.

An ``Edit`` is one or more slots of the tree (a node's field, or an item of a list field)
and what goes there: ``apply`` puts it in, ``revert`` takes it out; the tree is edited in
place and compiled (``Source.compile``) between the two. A statement list is a slot's
parent through a ``ListHolder``, so that statements are edited as expressions are.
``Scope`` is what the trace tells about a function, for the rules to read. The rest are
small helpers: walking a function's statements and expressions, and building nodes.
"""

import ast
import dataclasses
import functools
import numbers

from ..backend import is_array


@dataclasses.dataclass(eq=False)
class Edit:
    """One rewrite of a function's tree: ``slots`` [(parent, field, index)], each given its
    node of ``new``; ``old`` keeps what was there."""

    source: object  # the Source whose tree it edits
    slots: list
    new: list
    rule: str
    cost: float
    detail: dict  # what the answer says of it: {"old": ..., "new": ...} and the like
    line: int = 0  # the statement's line in the file
    statement: object = None  # that statement
    scope: object = None  # the Scope it was proposed in
    owners: list = None  # the statement each slot is in (``statement`` for all by default)
    rewrites_right: bool = False  # it rewrites a statement the reference writes the same way
    old: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.owners = self.owners or [self.statement] * len(self.slots)
        self.old = [slot_value(slot) for slot in self.slots]

    @functools.cached_property
    def touched(self):
        """The ids of every node it replaces."""
        return {id(n) for old in self.old for n in walk(old)}

    @functools.cached_property
    def keeps(self):
        """Whether what it replaces stays inside what it puts in (a node wrapped)."""
        return all(any(o is n for n in walk(new)) for o, new in zip(self.old, self.new))

    def statements(self):
        """The statements the edit writes, as they stand (applied or not)."""
        found = []
        for slot, owner in zip(self.slots, self.owners):
            statement = slot_value(slot) if isinstance(slot[0], ListHolder) else owner
            if all(statement is not s for s in found):
                found.append(statement)
        return found

    def span(self):
        """The first and last line of the statements it writes, as written."""
        written = [old if isinstance(slot[0], ListHolder) else owner
                   for slot, old, owner in zip(self.slots, self.old, self.owners)]
        return (min(s.lineno for s in written), max(s.end_lineno for s in written))

    def apply(self):
        for slot, new in zip(self.slots, self.new):
            put(slot, new)

    def revert(self):
        for slot, old in zip(self.slots, self.old):
            put(slot, old)

    def clashes(self, other):
        """Whether two edits cannot go in together: the same slot (or a whole list and an
        item of it), or one inside a node the other replaces without keeping (one that
        wraps it, ``(p - t) / K`` into ``(p - t) / K * dout``, keeps it: ``/ B`` goes in)."""
        for a, b in ((self, other), (other, self)):
            for parent, _, _ in b.slots:
                if not a.keeps and (id(parent) in a.touched
                                    or any(parent is old for old in a.old)):
                    return True
        for p, f, i in self.slots:
            for q, g, j in other.slots:
                if p is q and f == g and (i == j or i is None or j is None):
                    return True
        return False


def walk(value):
    """Every node of a node, or of a list of nodes."""
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, ast.AST):
            yield from ast.walk(item)


def slot_value(slot):
    parent, field, index = slot
    value = getattr(parent, field)
    return value if index is None else value[index]


def put(slot, node):
    parent, field, index = slot
    if index is None:
        setattr(parent, field, node)
    else:
        getattr(parent, field)[index] = node


@dataclasses.dataclass
class Scope:
    """What the trace says about a function: at each line, the local names and what they
    held (``names(line)``: {name: [values]}); the layer it is a method of, by name
    (``me``); the numbers among ``self``'s attributes; the
    layers below ``self`` whose backward ran in the forward's cache but is never called
    here; subexpressions of other code (the reference's) offered as terms."""

    names: object  # line -> {name: [values over the calls]}
    attributes: dict = dataclasses.field(default_factory=dict)  # self's numbers
    uncalled: tuple = ()  # attribute names of layers whose backward the code never calls
    terms: tuple = ()  # expression nodes from elsewhere, offered as terms to add
    selves: tuple = ()  # the layers the function ran as a method of
    me: str = None  # the parameter they came in as (``self`` by custom, any name by Python)
    parameters: tuple = ()  # the attribute names of ``self``'s parameters
    factors: frozenset = frozenset()  # what the layer's code multiplies or divides by
    inputs: tuple = ()  # the names the function is given: its arguments, its cache's items
    right: frozenset = frozenset()  # statements, as text, that the reference writes too
    sums: tuple = ()  # the terms of the reference's sums (and its whole values)
    products: tuple = ()  # the factors of the reference's products

    def arrays(self, line):
        return {n: v for n, v in self.names(line).items() if all(is_array(a) for a in v)}

    def numbers(self, line):
        return {n: v for n, v in self.names(line).items()
                if all(isinstance(a, (int, float)) for a in v)}

    def shapes(self, line):
        return {n: {tuple(a.shape) for a in v} for n, v in self.arrays(line).items()}


def statements(body):
    """(statement, the list it is in, its index) for every statement of ``body``, nested
    bodies included, the docstring and nested defs left out."""
    for i, statement in enumerate(body):
        if i == 0 and _is_docstring(statement):
            continue
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield statement, body, i
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                yield from statements(inner)


def _is_docstring(statement):
    return (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
            and isinstance(statement.value.value, str))


def expressions(node):
    """(expression, slot) of every expression below ``node``, not crossing into nested
    statements or functions."""
    for field, value in ast.iter_fields(node):
        items = [(value, None)] if not isinstance(value, list) else [
            (item, i) for i, item in enumerate(value)]
        for item, index in items:
            if isinstance(item, ast.expr) and not isinstance(item, ast.Lambda):
                yield item, (node, field, index)
                yield from expressions(item)
            elif isinstance(item, (ast.keyword, ast.comprehension, ast.arg)):
                yield from expressions(item)


def term_slots(statement):
    """The slots of the terms of a statement's value: the value itself (each item of a
    returned tuple), every operand of its sums, differences, products and quotients, the
    gradient a layer's backward is called on, and the argument of an elementwise function
    (``xp.exp(-x * x)``, whose / 2 may be missing)."""
    if isinstance(statement, (ast.Assign, ast.AugAssign, ast.Return)) and statement.value:
        roots = [(statement, "value", None)]
        if isinstance(statement.value, ast.Tuple):
            roots = [(statement.value, "elts", i) for i in range(len(statement.value.elts))]
        for slot in roots:
            yield from _operands(slot)


def term_nodes(tree):
    """(slot, node) of every term of every statement of a function's tree."""
    for statement, _, _ in statements(tree.body):
        for slot in term_slots(statement):
            yield slot, slot_value(slot)


def _operands(slot):
    yield slot
    node = slot_value(slot)
    # self.fc2.backward(alpha * dout), xp.exp(-x * x): the argument is a term too
    if _backward_call_of_one(node) or elementwise_call(node):
        yield from _operands((node, "args", 0))
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ARITHMETIC):
        yield from _operands((node, "left", None))
        yield from _operands((node, "right", None))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        yield from _operands((node, "operand", None))


ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div)


def _backward_call_of_one(node):
    """Whether ``node`` calls a layer's backward on one gradient: ``self.fc2.backward(d)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "backward" and len(node.args) == 1 and not node.keywords
            and not isinstance(node.args[0], ast.Starred))


def is_whole(value):
    """Whether a value is a whole number (Python's or NumPy's), not a truth value: a size."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def elementwise_call(node):
    """Whether ``node`` calls one of xp's elementwise functions on one argument."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "xp"
            and node.func.attr in ELEMENTWISE and len(node.args) == 1 and not node.keywords)


ELEMENTWISE = ("exp", "log", "sqrt", "tanh", "cosh", "sinh", "cos", "sin", "erf")


def located(new, old):
    ast.copy_location(new, old)
    return ast.fix_missing_locations(new)


def name_node(identifier, like):
    return located(ast.Name(id=identifier, ctx=ast.Load()), like)


def number_node(value, like):
    if isinstance(value, (int, float)) and value < 0:
        return located(ast.UnaryOp(op=ast.USub(), operand=ast.Constant(value=-value)), like)
    return located(ast.Constant(value=value), like)


def axes_node(axes, like):
    if axes is None or isinstance(axes, int):
        return number_node(axes, like)
    return located(ast.Tuple(elts=[number_node(a, like) for a in axes], ctx=ast.Load()), like)


def constant(node):
    """The number a node writes (2, -1, 0.5), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = constant(node.operand)
        return None if inner is None else -inner
    return None


def axes_value(node):
    """The axes an axis= argument writes (an int, a tuple of ints, None), or False."""
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    number = constant(node)
    if isinstance(number, int):
        return number
    if isinstance(node, ast.Tuple):
        values = [constant(e) for e in node.elts]
        if all(isinstance(v, int) for v in values):
            return tuple(values)
    return False


def takes_cache(node):
    return isinstance(node, ast.Call) and ast.unparse(node.func).endswith("_take_cache")


def names_in(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


class ListHolder:
    """A statement list as a slot's parent (its ``items``), so that statements are edited
    in the same way as expressions."""

    def __init__(self, items):
        self.items = items


def size_node(name, axis, like):
    """name.shape[axis] as a node: the size of one of its axes (the batch, the features)."""
    shape = ast.Attribute(value=ast.Name(id=name, ctx=ast.Load()), attr="shape", ctx=ast.Load())
    return located(ast.Subscript(value=shape, slice=number_node(axis, like), ctx=ast.Load()), like)


def attribute_node(owner, like, *attributes):
    """owner.a.b... as a node (``self.weight.data``), located as ``like``."""
    node = ast.Name(id=owner, ctx=ast.Load())
    for attribute in attributes:
        node = ast.Attribute(value=node, attr=attribute, ctx=ast.Load())
    return located(node, like)
