"""A fix, said: each edited line of the code as written and as the fix writes it, where it
is (file, line, function), and one sentence of why, with the derivation's formula for
what that line computes where a docstring states it.

    line 394 of tinyvit/nn/layers.py (Attention.attend_backward):
        dv = A.transpose(0, 1, 3, 2) @ dctx
     -> dv = Ad.transpose(0, 1, 3, 2) @ dctx
    the forward used Ad here, not A (ctx = Ad @ v); the derivation: dv = Ad^T dctx
"""

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path

from .edits import ListHolder, constant, walk
from .trace import PACKAGE

ONE_LINE = 100  # a change whose two sides fit in this many characters is one line


@dataclasses.dataclass
class Change:
    """One statement of the code, as written and as the fix writes it."""

    path: object
    line: int
    function: str
    before: list  # its lines
    after: list
    edits: list  # the edits on it


def changes(fix):
    """The fix as changes of statements, each statement once, in the order of the files:
    its lines as written and as the fix writes them (none where the fix takes it out)."""
    statements = {}  # id of the statement as written -> [source, statement, spans, new, edits]
    for edit in fix.edits:
        for slot, old, new, owner in zip(edit.slots, edit.old, edit.new, edit.owners):
            whole = isinstance(slot[0], ListHolder)  # the statement itself is replaced
            statement = old if whole else owner
            entry = statements.setdefault(id(statement), [edit.source, statement, [], None, []])
            if whole:
                entry[3] = new
            else:
                entry[2].append((old, new, slot[0]))
            if edit not in entry[4]:
                entry[4].append(edit)
    found = []
    for source, statement, spans, new, edits in sorted(
            statements.values(), key=lambda e: (str(e[0].path), e[1].lineno)):
        first, last = statement.lineno, statement.end_lineno
        if new is None and _in_header(statement, spans):  # the for line alone, not its block
            last = statement.body[0].lineno - 1
        for edit in fix.edits:
            edit.apply()
        try:
            after = (_statement_anew(new, source.line(first)) if new is not None
                     else _rendered(source, statement, spans, last))
        finally:
            for edit in reversed(fix.edits):
                edit.revert()
        before = [source.line(n) for n in range(first, last + 1)]
        found.append(Change(source.path, first, source.name, before, after, edits))
    return found


def said(fix, search, derivations=(), section_of=None):
    """The lines that give ``fix``: a head, then each changed statement, where it is and its
    two versions; after the statements of each edit, why and where the page derives it.
    ``derivations``: docstrings that state formulas (the reference's); ``section_of(edit)``:
    where the page derives the step an edit is in."""
    lines = [f"the fix, found by trying {_edits(search.tried)} of the code in "
             f"{search.seconds:.2f} s (it makes every gradient right):"]
    found = changes(fix)
    for i, change in enumerate(found):
        where = f"line {change.line} of {shown(change.path)} ({change.function})"
        before, after = _dedented(change.before, change.after)
        after = after or [TAKEN_OUT]
        if len(before) == len(after) == 1 and \
                len(before[0]) + len(after[0]) + len(where) + 6 <= ONE_LINE:
            lines.append(f"  {where}: {before[0]}  ->  {after[0]}")
        else:
            lines.append(f"  {where}:")
            lines += [f"        {line}" for line in before]
            lines += [f"     -> {line}" if k == 0 else f"        {line}"
                      for k, line in enumerate(after)]
        if i + 1 < len(found) and found[i + 1].edits == change.edits:
            continue  # the same edits go on in the next statement: why comes after it
        lines.append(f"  {why(change, derivations)}")
        section = section_of(change.edits[0]) if section_of else None
        if section:
            lines.append(f"  the derivation of this step: {section}")
    return lines


def not_found(search, makes, whose=""):
    """The line of a search that found no fix: none among the edits the error model makes
    (which is not to say that no edit exists), or, where the time was up first, none among
    those it had tried."""
    if search.ran_out:
        return (f"no edit of one or two lines {whose}that {makes} was found in the "
                f"{search.seconds:.2f} s the search has ({_edits(search.tried)} tried, not "
                "all of them)")
    return (f"none of the edits of one or two lines {whose}that the search tries {makes} "
            f"({search.tried} tried in {search.seconds:.2f} s)")


def _edits(count):
    return f"{count} edit{'' if count == 1 else 's'}"


TAKEN_OUT = "(taken out)"  # what a statement that the fix removes becomes
HEADED = (ast.For, ast.While, ast.If, ast.With)  # statements a line heads a block of


def _dedented(before, after):
    """Both versions without the indent they share."""
    both = textwrap.dedent("\n".join(before + after)).split("\n")
    return both[:len(before)], both[len(before):]


def shown(path):
    """A file as a reader finds it: relative to the folder they are in, or to tinyvit's
    checkout for tinyvit's own files; code typed in a Jupyter cell (which the kernel keeps
    in a file of its own, /tmp/ipykernel_<pid>/<hash>.py) as the cell."""
    path = Path(path)
    if path.parent.name.startswith("ipykernel_"):
        return "your notebook's cell"
    for root in (Path.cwd(), PACKAGE.parent):
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return str(path)


# -- the learner's line, rewritten -------------------------------------------------------------


def _in_header(statement, spans):
    """Whether every edit of a statement with a block (for, while, if, with) is in the line
    that heads the block: its loop's range, its test."""
    return isinstance(statement, HEADED) and all(
        isinstance(old, ast.expr) and old.end_lineno < statement.body[0].lineno
        for old, _, _ in spans)


def _rendered(source, statement, spans, last):
    """A statement's lines up to ``last`` (its own last, or the last of the line that heads
    its block) as the applied fix writes them: the user's text with each replaced
    expression written anew, checked to parse to the edited statement (or, failing that,
    the statement written anew)."""
    first = statement.lineno
    lines = [source.line(n) for n in range(first, last + 1)]
    if any(not isinstance(old, (ast.expr, list)) or not isinstance(new, (ast.expr, list))
           or old == [] for old, new, _ in spans):
        return _statement_anew(statement, lines[0])
    text, offsets = "\n".join(lines), _offsets(lines)
    for parenthesize in (False, True):
        attempt = text
        for old, new, parent in sorted(spans, key=lambda s: _start(s[0]), reverse=True):
            begin = offsets[_first(old).lineno - first] + _first(old).col_offset
            finish = offsets[_last(old).end_lineno - first] + _last(old).end_col_offset
            attempt = attempt[:begin] + _written(new, parenthesize) + attempt[finish:]
        if _same_tree(attempt, statement, last < statement.end_lineno):
            return attempt.splitlines()
    return _statement_anew(statement, lines[0])


def _written(new, parenthesize):
    """``new`` as text: a list of nodes joined by commas; an operation in parentheses where
    asked (where the text around it would bind tighter)."""
    if isinstance(new, list):
        return ", ".join(ast.unparse(n) for n in new)
    text = ast.unparse(new)
    if parenthesize and isinstance(new, (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare)):
        return f"({text})"
    return text


def _statement_anew(statement, first_line):
    """A statement written anew, indented as its first line was; nothing for a statement
    the fix takes out."""
    if isinstance(statement, ast.Pass):
        return []
    indent = first_line[:len(first_line) - len(first_line.lstrip())]
    return [indent + line for line in ast.unparse(statement).splitlines()]


def _first(old):
    return old[0] if isinstance(old, list) else old


def _last(old):
    return old[-1] if isinstance(old, list) else old


def _start(old):
    node = _first(old)
    return (node.lineno, node.col_offset)


def _offsets(lines):
    offsets, total = [], 0
    for line in lines:
        offsets.append(total)
        total += len(line) + 1
    return offsets


def _same_tree(text, statement, header=False):
    """Whether ``text`` parses to ``statement`` (locations aside); with ``header``, text
    is the line that heads its block, and parses to it with any block."""
    try:
        parsed = ast.parse(textwrap.dedent(text) + ("\n    pass" if header else "")).body
    except SyntaxError:
        return False
    if header:
        return len(parsed) == 1 and _dump(_heading(parsed[0])) == _dump(_heading(statement))
    return len(parsed) == 1 and _dump(parsed[0]) == _dump(statement)


def _heading(statement):
    """A statement with a block, its block (and else block) left out."""
    return type(statement)(**{field: [] if field in ("body", "orelse") else
                              getattr(statement, field) for field in statement._fields})


def _dump(node):
    return ast.dump(node, annotate_fields=False, include_attributes=False)


# -- why ---------------------------------------------------------------------------------------


def why(change, derivations=()):
    """One sentence: what each edit on the line does, said as the derivation says it."""
    reasons = []
    for edit in change.edits:
        reason = REASONS[edit.rule](edit)
        if reason not in reasons:
            reasons.append(reason)
    formula = _formula(change.edits[0], derivations)
    return "; ".join(reasons) + (f"; the derivation: {formula}" if formula else "")


def _text(node):
    return ast.unparse(node) if isinstance(node, ast.AST) else str(node)


def _name_reason(edit):
    was, now = edit.detail["was"], edit.detail["now"]
    used = _where_used(edit, now)
    return (f"{now}, not {was}, is what the forward used here"
            + (f" ({used})" if used else "") if used else
            f"{now} in place of {was}")


def _where_used(edit, name):
    """A line of the layer's forward (or of the function) that reads ``name``'s value in
    its own terms: ctx = Ad @ v for Ad. Where the edited line computes the gradient of a
    value (``drstd = ...``, of rstd), the line that reads both comes first: xhat = xmu * rstd
    for xmu, not var = (xmu * xmu).mean(...)."""
    found = []
    for tree in _forward_trees(edit):
        for statement in ast.walk(tree):
            if isinstance(statement, (ast.Assign, ast.Return)) and statement.value is not None:
                read = {n.id for n in ast.walk(statement.value) if isinstance(n, ast.Name)}
                if name in read and not _is_cache(statement):
                    found.append((read, statement))
    target = _gradient_of(edit.statement)
    found.sort(key=lambda item: target not in item[0])  # stable: else in the forward's order
    return _one_line(found[0][1]) if found else None


def _gradient_of(statement):
    """``rstd`` for a statement ``drstd = ...``: the value whose gradient it computes."""
    targets = getattr(statement, "targets", [])
    if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id.startswith("d"):
        return targets[0].id[1:]
    return None


def _forward_trees(edit):
    layers = [m for m in edit.scope.selves if m is not None]
    trees = []
    for layer in layers[:1]:
        for klass in type(layer).__mro__:
            for name, value in vars(klass).items():
                if inspect.isfunction(value) and not name.endswith("backward"):
                    try:
                        source = inspect.getsource(value)
                        trees.append(ast.parse(textwrap.dedent(source)))
                    except (OSError, TypeError, SyntaxError):
                        continue
    return trees


def _is_cache(statement):
    return any(isinstance(t, ast.Attribute) and t.attr == "cache"
               for t in getattr(statement, "targets", []))


def _one_line(statement):
    if isinstance(statement, ast.Return):
        return f"returns {ast.unparse(statement.value)}"
    return ast.unparse(statement)


def _reduction_reason(edit):
    what = edit.detail.get("what")
    if what == "axis" and edit.detail.get("keep"):
        return (f"a value per row: the reduction over axis {edit.detail['axes']} alone, kept "
                "as length 1 (keepdims=True) so that it lines up with the rows it is combined "
                "with, not over the whole array")
    if what == "axis":
        axes = edit.detail["axes"]
        return (f"the sum runs over axis {axes}: every axis along which the forward used the "
                "same value (broadcast it), and no other") if axes is not None else (
            "the sum runs over every axis")
    if what == "keepdims":
        return ("keepdims=True keeps the summed axes as length 1, so the result lines up with "
                "the rows it is combined with" if edit.detail["keep"] else
                "without keepdims, the summed axes go, as the shape it is added to has them")
    if edit.detail["now"] == "sum":
        return ("a value used by every row takes the sum of their gradients, not their mean")
    return "the forward takes a mean here, so each entry gets 1/n of the gradient"


def _factor_reason(edit):
    what = edit.detail.get("what")
    factor = _text(edit.detail.get("factor", ""))
    if what == "added" and _text(edit.old[0]) == factor and isinstance(
            edit.new[0].op, ast.Mult):  # t for t * t
        return (f"{factor} squared: the derivation has a square here (tanh(u)' = 1 - "
                "tanh(u)^2, (u^2)' = 2 u)")
    if what == "added":
        op = edit.new[0].op if isinstance(edit.new[0], ast.BinOp) else None
        missing = "a division by" if isinstance(op, ast.Div) else "a factor of"
        return (f"{missing} {factor} was missing here (by the chain rule, each factor the "
                "forward applied on the way multiplies the gradient too)")
    if what == "removed":
        return f"{factor} is not a factor of this gradient"
    if what == "squared":
        return ("squared, as the derivation has it (tanh(u)' = 1 - tanh(u)^2 = 1 / cosh(u)^2; "
                "(u^2)' = 2 u)")
    if what == "whole":
        return "a division in whole numbers (//): sizes and indices are whole numbers"
    if what == "true":
        return "a true division (/): // rounds down to a whole number"
    return "a division where the derivation multiplies (or the other way round)"


def _transpose_reason(edit):
    if edit.detail.get("what") == "swapped":
        return ("the operands in the order of the matmul rule: Y = X Z gives dX = dY Z^T "
                "and dZ = X^T dY")
    parent = edit.slots[0][0]
    if edit.detail.get("what") == "untransposed" and not (
            isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.MatMult)):
        return ("no transpose here: the matmul rule transposes a matrix product's operands "
                "(Y = X Z gives dX = dY Z^T); elsewhere each entry stays where it is")
    return "by the matmul rule, Y = X Z gives dX = dY Z^T and dZ = X^T dY"


def _off_by_one(edit):
    """The reason where a dropped term is a whole number ("kh, not kh - 1: one off");
    else None."""
    old, new = edit.old[0], edit.new[0]
    if not isinstance(old, ast.BinOp):
        return None
    dropped = old.right if new is old.left else old.left
    if isinstance(constant(dropped), int):
        return f"{ast.unparse(new)}, not {ast.unparse(old)}: one off"
    return None


def _swap_reason(edit):
    first, second = edit.detail["first"], edit.detail["second"]
    return f"{second} and {first} in the other order"


def _order_reason(edit):
    if edit.detail.get("what") == "branches":
        return "the two branches of the if in each other's place"
    if edit.detail.get("what") == "layers":
        me = edit.scope.me
        return (f"{me}.{edit.detail['second']} and {me}.{edit.detail['first']} in each other's "
                "place: the backward passes run in the reverse order of the forward's layers")
    if edit.detail.get("what") == "reversed":
        return "a backward calls its layers' backward passes in the reverse order of the forward"
    return ("each step's backward needs the gradient of the step after it: the reverse order "
            "of the forward")


def _accumulate_reason(edit):
    if edit.detail.get("now") == "+=":
        return ("gradients add up (+=): a value used several times, or a parameter over "
                "several backward passes, collects the sum of every share")
    return "this value is written once here, not added to"


REASONS = {
    "accumulate": _accumulate_reason,
    "sign": lambda edit: ("the other comparison: the branch meant for the other case ran"
                          if edit.detail.get("what") == "comparison" else "the other sign"),
    "drop": lambda edit: ("this step does not belong to the backward: it changes a value "
                          "that is right as it is" if edit.detail.get("what") == "statement"
                          else _off_by_one(edit) or "this term is not part of the derivation"),
    "name": _name_reason,
    "transpose": _transpose_reason,
    "axes": lambda edit: (
        f"along axis {edit.detail['now']}: the axis along which the forward took the arrays "
        "apart (or put them together)" if edit.detail.get("what") == "join" else
        "the axes in the order that undoes the forward's reshape and transpose, the last "
        "step of the forward undone first"),
    "reduction": _reduction_reason,
    "factor": _factor_reason,
    "constant": lambda edit: f"{edit.detail['now']} where it says {edit.detail['was']}",
    "index": lambda edit: {
        "axis": "a length-1 axis added, so that the value spreads along it as the forward's did",
        "axis removed": "no length-1 axis here: the value already has the shape it meets",
        "bound": "the bound dropped, so that the slice runs to the end (:0:-1 stops before "
                 "entry 0; ::-1 takes every entry)",
        "shape": f"the length of axis {edit.detail.get('now')}, not of axis "
                 f"{edit.detail.get('was')}"}.get(
        edit.detail.get("what"), "the entries the forward read"),
    "swap": _swap_reason,
    "group": lambda edit: (f"grouped as {ast.unparse(edit.detail['grouped'])}: the "
                           "parentheses decide which operation applies first"),
    "order": _order_reason,
    "discarded": lambda edit: (
        f"the value of this call is the gradient the next line reads: keep it in "
        f"{edit.detail['name']}" if edit.detail.get("how") == "kept" else
        "the value of this call was thrown away; it is a share of the gradient: a value used "
        "twice collects both gradients"),
    "backward": lambda edit: (f"{edit.scope.me}.{edit.detail['layer']}'s forward ran, "
                              "so its backward must run too: the gradient passes through it"),
    "call": lambda edit: (f"{edit.detail['function']} applied, as the forward applies it"
                          if edit.detail["what"] == "applied" else
                          f"{edit.detail['function']} is not applied here"),
    "term": lambda edit: f"the term {edit.detail['term']} was missing here",
    "product": lambda edit: (f"the product rule's other term, {edit.detail['term']}, was "
                             f"missing: d(u v) = du v + u dv, and {edit.detail['run']} is one "
                             "of its two terms alone"),
    "reference": lambda edit: f"{edit.detail['term']} is what tinyvit's own backward computes here",
    "copy": lambda edit: ("an array of its own: changed in place, a name shared with another "
                          "(the upstream gradient, a cached value) changes that one too"),
    "guard": lambda edit: (f"{edit.scope.me}.{edit.detail['attribute']} is None in a "
                           "layer without it: its gradient is there only when the parameter is"),
}


# -- the derivation's formula ----------------------------------------------------------------


SEGMENT = re.compile(r"\s+->\s+|\s{2,}|,\s+(?=d\w*\s*=)|;\s+")


def _formula(edit, derivations):
    """The formula a docstring gives for what ``edit``'s statement computes, or None. A
    return of an expression is read as dx or dS in the edited function's own docstrings
    alone: Attention.backward's return is no dS of attend_backward's."""
    names = _targets(edit)
    value = getattr(edit.statement, "value", None)
    unnamed = isinstance(edit.statement, ast.Return) and not isinstance(value, (ast.Name,
                                                                                ast.Tuple))
    texts = [*derivations, *(_docstrings(edit) if not unnamed else [
        edit.source.function.__doc__])]
    for name in names:
        for text in texts:
            for line in (text or "").splitlines():
                for segment in SEGMENT.split(line.strip()):
                    if re.match(rf"{re.escape(name)}\s*=\s*\S", segment):
                        return segment.strip().rstrip(",.;")
    return None


def _docstrings(edit):
    found = [edit.source.function.__doc__]
    for layer in [m for m in edit.scope.selves if m is not None][:1]:
        for klass in type(layer).__mro__:
            found += [getattr(v, "__doc__", None) for v in vars(klass).values()
                      if inspect.isfunction(v)]
    return [d for d in found if d]


def _targets(edit):
    """The names a derivation may give what the edited statement computes: dv for
    ``dv = ...``, dW for ``self.weight.grad += ...``, dx for a backward's return."""
    statement = edit.statement
    if isinstance(statement, (ast.Assign, ast.AugAssign)):
        target = statement.targets[0] if isinstance(statement, ast.Assign) else statement.target
        while isinstance(target, ast.Subscript):
            target = target.value
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, ast.Attribute) and target.attr == "grad":
            owner = target.value.attr if isinstance(target.value, ast.Attribute) else ""
            return {"weight": ["dW", "dgamma"], "bias": ["db", "dbeta"]}.get(
                owner, [f"d{owner}"])
    if isinstance(statement, ast.Return) and statement.value is not None:
        value = statement.value
        if isinstance(value, ast.Tuple):
            edited = [n for old in edit.old for n in walk(old)]
            for item in value.elts:
                if isinstance(item, ast.Name) and any(item is n for n in edited):
                    return [item.id]
        if isinstance(value, ast.Name):
            return [value.id]
        return ["dx", "dS"]
    return []
