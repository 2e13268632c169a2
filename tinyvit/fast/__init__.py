"""The fast tier: layers rewritten for speed on one backend, and the switch to it.

Two tiers, as CS231n keeps ``layers.py`` beside ``fast_layers.py`` and llm.c
keeps ``train_gpt2.c`` as the reference of its CUDA kernels:

- the reference tier (``tinyvit/layers.py``, ``tinyvit/loss.py``): each layer in
  its plainest correct form, the math as it is derived;
- the fast tier: for some layers, a subclass per backend that overrides
  ``forward`` and ``backward`` with faster code (``cpu.py`` for NumPy, ``gpu.py``
  for CuPy) and keeps the layer's contract, parameters and names. Every fast
  kernel is tested equal to its reference (``tests/test_fast.py``).

The fast tier is on by default. ``use_reference()`` (or ``TINYVIT_REFERENCE=1``
in the environment, read at import) turns it off: layers built after that are
the reference classes. A layer's tier is fixed when it is built, like its
backend: ``Module.__new__`` asks ``kernel_class`` which class to build.
"""

import importlib
import os
from contextlib import contextmanager

from ..backend import get_backend

_MODULES = {"numpy": "cpu", "cupy": "gpu"}  # backend -> the file of its kernels
_reference = os.environ.get("TINYVIT_REFERENCE", "0") not in ("", "0")


def use_reference(on=True):
    """Build the reference layers from now on (``on=False``: the fast ones)."""
    global _reference
    _reference = bool(on)


def use_fast():
    """Build the fast kernels from now on (the default)."""
    use_reference(False)


def reference_on():
    """True when new layers are built from the reference tier."""
    return _reference


@contextmanager
def tier(name):
    """Build layers of tier ``name`` ("reference" or "fast") inside a block."""
    if name not in ("reference", "fast"):
        raise ValueError(f"tier must be 'reference' or 'fast', got {name!r}")
    previous = _reference
    use_reference(name == "reference")
    try:
        yield
    finally:
        use_reference(previous)


def kernels(backend=None):
    """``{reference class: fast class}`` of a backend (default: the active one)."""
    module = importlib.import_module(f".{_MODULES[backend or get_backend()]}", __name__)
    return module.KERNELS


def kernel_class(cls):
    """The class to build for layer class ``cls``: its fast kernel on the active
    backend when the fast tier is on and has one, else ``cls`` itself."""
    if _reference:
        return cls
    return kernels().get(cls, cls)
