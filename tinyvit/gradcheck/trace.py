"""What a backward pass ran, recorded once: the functions of Python source it called (its
own method, the layers' backward passes below it, helpers such as ``softmax_backward``),
in order; at each line, the names in scope and their shapes; and, for each layer's
backward, when it started and ended. The repair search reads it to know which code to
edit, which names may stand for which (the same shape at that line), and which code ran
just before the first gradient that came out wrong.
"""

import dataclasses
import functools
import sys
import sysconfig
from pathlib import Path

from ..backend import is_array
from ..nn.module import Module
from .source import NotEditable, Source, function_of, instance_of

PACKAGE = Path(__file__).resolve().parents[1]  # tinyvit/
# tinyvit's files whose functions are math a backward runs (the rest is plumbing: the
# backend, argument checks, the cache's bookkeeping, the workbook's harness)
MATH = ("nn", "models", "fast", "learn/steps.py")
# of those, the files whose functions hand arrays to code that checks no bounds (Numba's
# compiled loops, gemm by pointer): an edit there could write past an array's end and take
# the process down, so the search leaves them as they are
UNCHECKED = ("fast/cpu_numba.py", "fast/cpu_numba_gelu.py", "fast/cpu_numba_norm.py",
             "fast/cpu_numba_softmax.py", "fast/mkl.py", "fast/cublas.py")
PLUMBING = {"_take_cache", "check_gradient"}  # the cache taken, the gradient's shape checked
LIBRARIES = {Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
             if (p := sysconfig.get_paths().get(key))}


@functools.lru_cache(maxsize=None)
def in_tinyvit(filename):
    return Path(filename).resolve().is_relative_to(PACKAGE)


@functools.lru_cache(maxsize=None)
def in_libraries(filename):
    """Whether ``filename`` is in Python's libraries (its standard library, NumPy's)."""
    path = Path(filename).resolve()
    return any(path.is_relative_to(library) for library in LIBRARIES)


def editable_code(code, own_only):
    """Whether ``code`` is a function the search may edit: the user's own (any file outside
    Python's libraries), or tinyvit's math unless ``own_only``."""
    filename = code.co_filename
    if filename.startswith("<") or code.co_name in PLUMBING or code.co_name == "<lambda>":
        return False
    path = Path(filename).resolve()
    if path.is_relative_to(PACKAGE):
        inside = path.relative_to(PACKAGE).as_posix()
        return (not own_only and inside not in UNCHECKED
                and any(inside == m or inside.startswith(m + "/") for m in MATH))
    return not in_libraries(filename)


@dataclasses.dataclass
class Call:
    """One call of an editable function during the backward."""

    code: object
    start: int  # the event counter when it was called and when it returned
    end: int = -1
    module: object = None  # ``self`` where it is a layer's method
    globals: dict = None  # the globals it ran with (a function is found among them)
    scopes: dict = dataclasses.field(default_factory=dict)  # line -> {name: value} before it ran
    returned: object = None
    line: tuple = None  # (the event counter when it began, the line) of the line running


@dataclasses.dataclass
class Trace:
    """The editable functions a backward called (``sources``, first called first), and
    every call of them."""

    calls: list
    sources: list
    layers: list  # (layer, start, end) of every layer's backward, editable or not
    lines: list  # (event counter, the next line's counter, code, line) of every line an
    #              editable function ran: a line runs until the next line of its call starts

    def scope(self, code, line):
        """{name: [values]}: what each local name held just before ``line`` ran, over
        every call of ``code``."""
        found = {}
        for call in self.calls:
            if call.code is code:
                for name, value in call.scopes.get(line, {}).items():
                    found.setdefault(name, []).append(value)
        return found

    def self_of(self, code):
        """The layers whose method ``code`` is, one per call (None for a function)."""
        return [call.module for call in self.calls if call.code is code]

    def arrays(self):
        """(function, name, array) for what each local name held when its call returned,
        once per function and name (for the measured difference)."""
        seen, found = set(), []
        for call in self.calls:
            for name, value in call.scopes.get("return", {}).items():
                key = (call.code, name)
                if is_array(value) and key not in seen:
                    seen.add(key)
                    found.append((call.code.co_name, name, value))
        return found

    def backward_calls(self):
        """(layer, start, end) of every layer's backward, in the order they ended."""
        return sorted(self.layers, key=lambda item: item[2])

    def first_run(self):
        """{(code, line): the event counter when it first ran}."""
        found = {}
        for counter, _, code, line in self.lines:
            found.setdefault((code, line), counter)
        return found

    def widened(self, dtype):
        """(code, line, name) of the first line that made a value wider than ``dtype``
        (a float64 array in a float32 backward): the name it assigned, or "the value
        returned"; None where no line did."""
        for call in self.calls:
            ran = sorted((began, line) for began, _, code, line in self.lines
                         if code is call.code and call.start <= began <= call.end)
            after = [call.scopes.get(line, {}) for _, line in ran[1:]] + [
                {**call.scopes.get("return", {}), "the value returned": call.returned}]
            for (_, line), before, now in zip(ran, [{}] + after, after):
                for name, value in now.items():
                    if _wider(value, dtype) and not _wider(before.get(name), dtype):
                        return call.code, line, name
        return None

    def ran_between(self, start, end):
        """{(code, line)}: the lines of editable code that ran, in part at least, between
        two events (a line that calls a layer runs while the layer does)."""
        return {(code, line) for began, ended, code, line in self.lines
                if began < end and ended > start}

    def ran_by(self, layer, start, end):
        """{(code, line)}: the lines of ``layer``'s own methods that ran between two events
        (those of the layers it holds left out)."""
        codes = {call.code for call in self.calls if call.module is layer}
        return {(code, line) for began, _, code, line in self.lines
                if code in codes and start <= began <= end}


def trace(run, own_only=False):
    """Run ``run()`` (a backward) once, recording what it ran; returns (its result, or the
    exception it raised, and the Trace)."""
    calls, stack, counter, editable, layers, lines = [], [], [0], {}, [], []

    def local(frame, event, arg):
        if not stack or stack[-1][0] is not frame:
            return None
        _, call, _, layer = stack[-1]
        counter[0] += 1
        if event == "return":
            stack.pop()
            if layer is not None:
                layers.append((layer[0], layer[1], counter[0]))
        if call is None:  # a layer's backward that is not to be edited: its end alone
            return local
        if event in ("line", "return") and call.line is not None:
            lines.append((call.line[0], counter[0], call.code, call.line[1]))  # the last ended
        if event == "line":
            call.line = (counter[0], frame.f_lineno)
            call.scopes.setdefault(frame.f_lineno, _snapshot(frame.f_locals))
        elif event == "return":
            call.end = counter[0]
            call.returned = arg
            call.scopes.setdefault("return", _snapshot(frame.f_locals))
        return local

    def tracer(frame, event, arg):
        if event != "call":
            return None
        code = frame.f_code
        if code not in editable:
            editable[code] = editable_code(code, own_only)
        owner = instance_of(frame)
        root = isinstance(owner, Module) and "backward" in code.co_name
        if not (root or (stack and stack[-1][2])):
            return None  # a layer's backward, or a function one of them calls: no deeper
        counter[0] += 1
        call = None
        if editable[code]:
            call = Call(code, counter[0], module=owner if isinstance(owner, Module) else None,
                        globals=frame.f_globals)
            calls.append(call)
        stack.append((frame, call, root, (owner, counter[0]) if root else None))
        return local

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        result = run()
    except Exception as error:  # a backward that raises is searched too
        result = error
    finally:
        sys.settrace(previous)
    return result, Trace(calls, _sources(calls), layers, lines)


def called(run):
    """Run ``run()``; returns (its result, the code objects of every Python function it
    called): the forward's, whose functions the search leaves alone (a fix of a function
    the forward shares, ``normal_cdf``, would change the forward it is checked on)."""
    codes = set()

    def tracer(frame, event, arg):
        codes.add(frame.f_code)

    previous = sys.getprofile()
    sys.setprofile(tracer)
    try:
        result = run()
    finally:
        sys.setprofile(previous)
    return result, codes


def _wider(value, dtype):
    return is_array(value) and value.dtype.kind == "f" and value.dtype.itemsize > dtype.itemsize


def _snapshot(local_names):
    """The arrays and numbers among a frame's locals (arrays as they are: the search
    reads their shapes; the measured difference their values, copied on return)."""
    kept = {}
    for name, value in local_names.items():
        if is_array(value):
            kept[name] = value.copy()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            kept[name] = value
    return kept


def _sources(calls):
    """The ``Source`` of each function called, first called first, once each."""
    sources, seen = [], set()
    for call in calls:
        if call.code in seen:
            continue
        seen.add(call.code)
        function = function_of(call.code, call.module, call.globals)
        if function is None:
            continue
        try:
            sources.append(Source(function))
        except NotEditable:
            continue
    return sources
