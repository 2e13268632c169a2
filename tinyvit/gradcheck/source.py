"""A function's source as a tree that can be edited and run: the unit the repair search
(``repair.py``) works on.

``Source(function)`` parses a Python function (a layer's method, or a function such as
``softmax_backward``) from its file. ``install()`` compiles the tree as it stands now and
swaps the compiled code into the function object itself, so that every caller, a
layer's class or another module that imported the function by name, runs the edited
code; the original code comes back when the ``with`` block ends. Nodes keep the line
numbers of the file, so an edit is quoted on the learner's own line.
"""

import ast
import inspect
import textwrap
from contextlib import contextmanager
from pathlib import Path

FACTORY = "__tinyvit_edited__"


class NotEditable(Exception):
    """A function whose source cannot be read or parsed (a builtin, a lambda in an
    expression, code typed at a prompt)."""


class Source:
    """One function's tree: ``tree`` (its ``FunctionDef``), where it is (``path``,
    ``first_line``), its text line by line, and the function object it compiles into."""

    def __init__(self, function):
        self.function = function
        self.code = function.__code__
        try:
            lines, first_line = inspect.getsourcelines(function)
        except (OSError, TypeError) as error:
            raise NotEditable(f"{function.__qualname__}: {error}") from None
        text = "".join(lines)
        dedented = textwrap.dedent(text)
        self.indent = len(lines[0]) - len(lines[0].lstrip())
        try:
            module = ast.parse(dedented)
        except SyntaxError as error:
            raise NotEditable(f"{function.__qualname__}: {error}") from None
        if not module.body or not isinstance(module.body[0], ast.FunctionDef):
            raise NotEditable(f"{function.__qualname__} is not defined by a def statement")
        self.tree = module.body[0]
        self.tree.decorator_list = []  # the code alone: the function object keeps the rest
        ast.increment_lineno(self.tree, first_line - 1)
        self.first_line = first_line
        self.lines = dedented.splitlines()
        self.path = Path(inspect.getsourcefile(function) or self.code.co_filename)
        self._module = ast.Module(body=[self._factory()], type_ignores=[])

    @property
    def name(self):
        return self.function.__qualname__

    def _factory(self):
        """def __tinyvit_edited__(<the function's free variables>): <def>; return it. Compiled
        inside it, the edited function has the closure cells the original has."""
        freevars = self.code.co_freevars
        args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=v) for v in freevars],
                             kwonlyargs=[], kw_defaults=[], defaults=[])
        ret = ast.Return(value=ast.Name(id=self.tree.name, ctx=ast.Load()))
        factory = ast.FunctionDef(name=FACTORY, args=args, body=[self.tree, ret],
                                  decorator_list=[], returns=None, type_params=[])
        ast.copy_location(factory, self.tree)
        ast.copy_location(ret, self.tree)
        ast.fix_missing_locations(factory)
        return factory

    def compile(self):
        """The code object of the tree as it stands, or None when it cannot replace the
        original's (another set of free variables)."""
        code = compile(self._module, str(self.path), "exec")
        namespace = {}
        exec(code, self.function.__globals__, namespace)
        edited = namespace[FACTORY](*[None] * len(self.code.co_freevars)).__code__
        return edited if edited.co_freevars == self.code.co_freevars else None

    @contextmanager
    def install(self, code):
        """Within: the function runs ``code`` (from ``compile``)."""
        self.function.__code__ = code
        try:
            yield
        finally:
            self.function.__code__ = self.code

    # -- quoting ------------------------------------------------------------------------

    def line(self, lineno):
        """The text of line ``lineno`` of the file, as the function's source has it
        (dedented)."""
        return self.lines[lineno - self.first_line]

    def segment(self, node):
        """The source text of ``node``, as written."""
        start, end = node.lineno - self.first_line, node.end_lineno - self.first_line
        if start == end:
            return self.lines[start][node.col_offset:node.end_col_offset]
        parts = [self.lines[start][node.col_offset:], *self.lines[start + 1:end],
                 self.lines[end][:node.end_col_offset]]
        return "\n".join(parts)

    def statement_lines(self, statement):
        """The lines of ``statement`` as written, joined."""
        return [self.line(n) for n in range(statement.lineno, statement.end_lineno + 1)]


def instance_of(frame):
    """What a frame's function got as its first positional argument (a method's
    instance, whatever the parameter is called), or None where it takes none."""
    code = frame.f_code
    return frame.f_locals.get(code.co_varnames[0]) if code.co_argcount else None


def function_of(code, frame_self=None, frame_globals=None):
    """The function object that runs ``code``: a method found on ``type(frame_self)``'s
    classes, or a function of the module whose globals the frame has; None if not found."""
    if frame_self is not None:
        for klass in type(frame_self).__mro__:
            found = _unwrap(vars(klass).get(code.co_name))
            if found is not None and getattr(found, "__code__", None) is code:
                return found
    for value in (frame_globals or {}).values():
        found = _unwrap(value)
        if getattr(found, "__code__", None) is code:
            return found
        if inspect.isclass(value):
            for klass in value.__mro__:
                method = _unwrap(vars(klass).get(code.co_name))
                if getattr(method, "__code__", None) is code:
                    return method
    return None


def _unwrap(value):
    """The plain function of a function, staticmethod or classmethod; else None."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    return value if inspect.isfunction(value) else None
