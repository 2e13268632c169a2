"""The fast tier: faster kernels of some layers, applied to a built model in one step.

    model = tinyvit.create_model("mnist")   # the reference layers of tinyvit/nn: the code to read
    tinyvit.fast.accelerate(model)          # now with the fast kernels of the active backend

Two tiers, as CS231n keeps ``layers.py`` beside ``fast_layers.py`` and llm.c
keeps ``train_gpt2.c`` as the reference of its CUDA kernels:

- the reference tier (``tinyvit/nn/``): each layer in its plainest correct form,
  the math as it is derived. Building a layer builds exactly that class.
- the fast tier: for some layers, a subclass per backend that overrides the
  methods holding the work with faster code (``cpu.py``, ``cpu_attention.py`` and
  ``cpu_conv.py`` for NumPy, their elementwise work in cache-sized blocks over the
  cores, ``blocks.py``, GELU, LayerNorm and the softmax compiled by Numba
  where it is installed, ``cpu_numba*.py``, Linear's larger products by MKL where it is
  installed on an Intel processor, ``mkl.py``; ``gpu.py``'s table of ``gpu_*.py``
  for CuPy, with the CUDA C of ``kernels/``, which ``compile.py`` compiles) and keeps
  the layer's contract, parameters and names; on a GPU the loss and AdamW too.
  Every kernel is tested equal to its reference (``tests/test_fast.py``).

``accelerate`` is the one place where a model's layers become fast kernels: the
trainer calls it (unless asked for the reference layers; ``for_tier`` gives it or
nothing), and a layer's ``tier`` and ``repr`` say which code it runs.
"""

from ..backend import get_backend
from ..nn.module import Module
from ..nn.optim import Optimizer
from . import blocks, cpu, cpu_numba, gpu, mkl

KERNELS = {"numpy": cpu.KERNELS, "cupy": gpu.KERNELS}  # backend -> {reference class: kernel}


def kernels(backend=None):
    """``{reference class: fast class}`` of a backend (default: the active one)."""
    return KERNELS[backend or get_backend()]


def accelerate(model):
    """Swap every layer of ``model`` that has a fast kernel on the active backend for
    it, in place, and return ``model``. A kernel is a subclass of its layer's class
    with the same attributes, so the swap changes which methods run and nothing
    else: the parameters, their names, the optimizer's view of them stay. Call it
    on a model built on the active backend, before a forward (caches are dropped).
    A loss or an optimizer (on a GPU they have kernels too) is swapped the same way."""
    if not isinstance(model, (Module, Optimizer)):
        what = f"the class {model.__name__}" if isinstance(model, type) else type(model).__name__
        raise TypeError(f"accelerate: expected a built model, layer or loss (a Module) or an "
                        f"optimizer, got {what}")
    table = kernels()
    parts = [m for _, m in model.named_modules()] if isinstance(model, Module) else [model]
    for part in parts:
        kernel = table.get(type(part))
        if kernel is not None:
            part.__class__ = kernel
            if isinstance(part, Module):
                part.cache = None
    return model


def for_tier(tier):
    """What makes a part run in ``tier``: ``accelerate`` for "fast", and for
    "reference" nothing (the part as it was built)."""
    if tier not in ("fast", "reference"):
        raise ValueError(f"tier must be 'fast' or 'reference', got {tier!r}")
    return accelerate if tier == "fast" else (lambda part: part)


def check_environment():
    """Read ``TINYVIT_NUM_THREADS``, ``TINYVIT_NUMBA`` and ``TINYVIT_MKL`` again (the
    kernels read them once, at their first call): a ValueError naming the variable if
    one holds a value the kernels would refuse, also where ``set_num_threads``,
    ``set_compiled`` or ``set_enabled`` has chosen for now."""
    for setting in (blocks.from_environment, cpu_numba.from_environment, mkl.from_environment):
        setting.read_again()  # a value refused leaves the reading kept
