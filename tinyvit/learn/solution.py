"""An exercise's solution: tinyvit's own code for it, the whole of what runs.

The library's backward runs once on the exercise's first case under the repair search's
trace (``tinyvit/gradcheck/trace.py``), which records every function of tinyvit's math it
calls and reads each one's source (``tinyvit/gradcheck/source.py``). The solution is the
exercise's method, then the body of every function it calls, its own or through a helper
of its own (``standardize_backward``, ``column_sum``), in the order they first ran; the
backward passes of the layers inside it are exercises of their own, and are named.
"""

import textwrap

from ..gradcheck.trace import trace
from .exercises import EXERCISES


def solution(ex):
    """tinyvit's code for exercise ``ex``: its method's source, then the functions it
    calls, each headed by where it is, then the layers whose backward it calls."""
    target = getattr(ex.reference, ex.method) if ex.method else ex.reference
    sources, layers = _called(ex, target.__code__)
    parts = [_headed(source) for source in sources]
    if layers:
        said = "the backward passes of the layers it calls, each an exercise of its own: "
        parts.append(textwrap.fill(said + ", ".join(layers), 88, initial_indent="# ",
                                   subsequent_indent="# ", break_on_hyphens=False))
    return "\n\n".join(parts) + "\n"


def _headed(source):
    where = f"{source.function.__module__}.{source.function.__qualname__}"
    return f"# {where}\n" + "\n".join(source.lines)


def _called(ex, code):
    """The sources of ``code`` and of what it called outside the layers inside it, in the
    order they first ran; and those layers' backward passes, named with their exercise."""
    _, recorded = ex.first_case(lambda module, inputs, out: trace(
        lambda: module.backward(_ones(out))))
    ours = [call for call in recorded.calls if call.code is code][0]
    inside = [(layer, start, end) for layer, start, end in recorded.layers
              if ours.start < start and end < ours.end and layer is not ours.module]
    outer = [(layer, start, end) for layer, start, end in inside
             if not any(s < start and end < e for _, s, e in inside)]

    def shown(call):
        return (ours.start <= call.start <= ours.end
                and not any(start <= call.start <= end for _, start, end in outer))

    codes = [call.code for call in sorted(recorded.calls, key=lambda c: c.start) if shown(call)]
    sources = [s for c in dict.fromkeys(codes) for s in recorded.sources if s.code is c]
    names = dict.fromkeys(_exercise_of(type(layer)) for layer, _, _ in outer)
    return sources, list(names)


def _ones(out):
    """An upstream gradient for the forward's output (a loss's is a number)."""
    return 1.0 if not hasattr(out, "shape") or out.shape == () else out * 0 + 1


def _exercise_of(layer_class):
    """"Linear.backward (exercise 1)", or the class alone where no exercise writes it."""
    for ex in EXERCISES:
        if ex.method == "backward" and ex.reference is layer_class:
            return f"{layer_class.__name__}.backward (exercise {ex.number})"
    return f"{layer_class.__name__}.backward"
