"""What every layer is built on: ``Parameter``, ``Module`` and ``Sequential``.

The layer contract (CS231n's, as classes):
- ``forward(x)`` computes the output and keeps in ``self.cache`` exactly what
  ``backward`` needs, and nothing more (no array in eval mode: inference runs no
  backward);
- ``backward(dout)`` takes that cache on its first line (taking it clears it:
  each forward serves one backward), returns ``dx`` and *accumulates* (``+=``)
  its parameter gradients into ``param.grad``; one ``zero_grad()`` resets them,
  so the gradients of residual branches add up by themselves.

A layer is what its class says: ``Linear(...)`` builds the ``Linear`` of
``tinyvit/nn/layers.py``. The fast tier (``tinyvit.fast.accelerate``) swaps in
faster subclasses of built layers, in one visible step; ``tier`` and ``repr``
say which code a layer runs.
"""

from typing import NamedTuple

from ..backend import get_default_dtype, xp


class Parameter:
    """A trainable array and the gradient accumulated into it.

    ``decay`` says whether weight decay applies: to the weights of Linear and
    Conv2d layers, not to biases, norms, cls_token or pos_embed.
    """

    def __init__(self, data, decay=False):
        self.data = data
        self.grad = xp.zeros_like(data)
        self.decay = decay

    @property
    def shape(self):
        return self.data.shape


class FlatParameters(NamedTuple):
    """A module's parameters packed into contiguous 1-D buffers (``flat_parameters``)."""

    data: object  # every parameter's values, one after another
    grad: object  # their gradients, in the same order
    decay: object  # 1 where weight decay applies, 0 elsewhere


class Module:
    """Base class: parameter bookkeeping, train/eval mode, and the cache contract.

    Parameters and sub-modules are found by walking the instance's attributes in
    the order they were set (lists of modules are walked as ``name.0``, ``name.1``,
    ...), so a model's parameter names are its attribute paths, as in PyTorch.
    ``buffers`` names the attributes that hold state saved with the parameters but
    not trained (BatchNorm's running averages).
    """

    buffers = ()
    tier = "reference"  # "fast" in the kernels of tinyvit/fast

    def __init__(self):
        self.training = True
        self.cache = None
        self._flat = None

    def __call__(self, *args):
        return self.forward(*args)

    def __repr__(self):
        """The class, its parameter count and where its code is, which tells its tier:
        ``Linear(4,160 parameters; reference tinyvit.nn.layers.Linear)``."""
        kind = type(self)
        return (f"{kind.__name__}({self.num_parameters():,} parameters; "
                f"{self.tier} {kind.__module__}.{kind.__qualname__})")

    def forward(self, x):
        raise NotImplementedError

    def backward(self, dout):
        raise NotImplementedError

    def _take_cache(self):
        """The cache of the last forward, cleared here: a backward may overwrite
        it in place. A clear error if there is none (layers keep no cache in
        eval mode: inference needs no backward)."""
        cache, self.cache = self.cache, None
        if cache is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward called without a forward before it "
                "(each training-mode forward serves one backward; an eval-mode forward keeps "
                "nothing for a backward)"
            )
        return cache

    # -- walking the tree ----------------------------------------------------

    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_modules(self, prefix="", _seen=None):
        """Every module once, under its first path (a module shared by two parents
        keeps the name under the first)."""
        _seen = set() if _seen is None else _seen
        if id(self) in _seen:
            return
        _seen.add(id(self))
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, _seen)

    def named_parameters(self):
        for module_name, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Parameter):
                    yield (f"{module_name}.{name}" if module_name else name), value

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def named_buffers(self):
        """(name, module, attribute) of every buffer, named as parameters are."""
        for module_name, module in self.named_modules():
            for attribute in module.buffers:
                name = f"{module_name}.{attribute}" if module_name else attribute
                yield name, module, attribute

    def num_parameters(self):
        return sum(p.data.size for p in self.parameters())

    def describe_tier(self):
        """Which code this module's layers run, in one line: "reference layers
        (tinyvit.nn)", or the fast kernels by class and count and where they are."""
        kernels = {}
        for _, module in self.named_modules():
            if module.tier == "fast":
                kind = type(module)
                kernels.setdefault(kind.__module__, {}).setdefault(kind.__name__, 0)
                kernels[kind.__module__][kind.__name__] += 1
        if not kernels:
            return "reference layers (tinyvit.nn)"
        parts = [f"fast kernels of {where}: " + ", ".join(f"{name} x{count}"
                                                            for name, count in counts.items())
                 for where, counts in kernels.items()]
        return "; ".join(parts) + "; the other layers reference (tinyvit.nn)"

    # -- modes and gradients -------------------------------------------------

    def train(self, mode=True):
        for _, module in self.named_modules():
            module.training = mode
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        if self._flat is not None:
            self._flat.grad.fill(0)
        else:
            for p in self.parameters():
                p.grad.fill(0)

    def astype(self, dtype):
        """Convert every parameter (and its gradient) and every buffer to ``dtype``, in place."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
            p.grad = p.grad.astype(dtype)
        for _, module, attribute in self.named_buffers():
            setattr(module, attribute, getattr(module, attribute).astype(dtype))
        self._flat = None
        return self

    def flat_parameters(self):
        """All parameters as views into one contiguous buffer, gradients into another.

        Returns ``FlatParameters(data, grad, decay)``: 1-D arrays of the total parameter count;
        ``decay`` is 1 where weight decay applies. Optimizers update these in a
        few whole-buffer operations instead of a loop over tensors. Packing
        re-points every ``Parameter.data`` and ``.grad`` to a view of the buffers.
        """
        if self._flat is None:
            params = self.parameters()
            dtype = params[0].data.dtype
            total = sum(p.data.size for p in params)
            data = xp.empty(total, dtype=dtype)
            grad = xp.empty(total, dtype=dtype)
            decay = xp.empty(total, dtype=dtype)
            offset = 0
            for p in params:
                end = offset + p.data.size
                data[offset:end] = p.data.ravel()
                grad[offset:end] = p.grad.ravel()
                decay[offset:end] = 1.0 if p.decay else 0.0
                p.data = data[offset:end].reshape(p.data.shape)
                p.grad = grad[offset:end].reshape(p.grad.shape)
                offset = end
            self._flat = FlatParameters(data, grad, decay)
        return self._flat

    def flat_buffers(self):
        """All buffers as views into one contiguous 1-D array (empty without any), so
        that worker processes can exchange them in one copy (``tinyvit.train.parallel``)."""
        buffers = [(module, attribute) for _, module, attribute in self.named_buffers()]
        if not buffers:
            return xp.empty(0, dtype=get_default_dtype())
        first = getattr(*buffers[0])
        flat = xp.concatenate([getattr(m, a).ravel() for m, a in buffers]).astype(first.dtype)
        offset = 0
        for module, attribute in buffers:
            value = getattr(module, attribute)
            setattr(module, attribute, flat[offset:offset + value.size].reshape(value.shape))
            offset += value.size
        return flat


class Sequential(Module):
    """Layers applied in order; backward applies their backwards in reverse."""

    def __init__(self, *layers):
        super().__init__()
        self.layers = list(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dout):
        for layer in reversed(self.layers):
            dout = layer.backward(dout)
        return dout

