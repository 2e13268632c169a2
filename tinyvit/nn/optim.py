"""Optimizers, the learning-rate schedule and gradient clipping.

Optimizers work on a module's flat parameter buffers (``Module.flat_parameters``):
every update is a handful of whole-buffer, in-place operations, whatever the
number of tensors. ``decay`` (1 for the weights of Linear and Conv2d layers, 0
for biases, norms, cls_token and pos_embed) masks weight decay.
"""

import math

from ..backend import xp


class Optimizer:
    """Holds the flat (data, grad, decay) buffers, the step count, lr and weight_decay."""

    def __init__(self, module, lr, weight_decay, **nonnegative):
        """``nonnegative``: the subclass's other settings that must be >= 0, by name."""
        for name, value in dict(lr=lr, weight_decay=weight_decay, **nonnegative).items():
            if value < 0:
                raise ValueError(f"{type(self).__name__}: {name} must be at least 0, got {value}")
        self.data, self.grad, self.decay = module.flat_parameters()
        self.lr, self.weight_decay = lr, weight_decay
        self.t, self.step_lr = 0, lr
        self._scratch = xp.empty_like(self.data)

    def step(self, lr=None):
        """One update with learning rate ``lr`` (default: ``self.lr``): the host's part,
        then the arrays'."""
        self.advance(lr)
        self.update()

    def advance(self, lr=None):
        """Count the step and set its learning rate, ``step_lr``."""
        self.t += 1
        self.step_lr = self.lr if lr is None else lr

    def update(self):
        """Update the parameters from their gradients with ``step_lr``."""
        raise NotImplementedError

    def state_dict(self):
        """A copy of the optimizer's state: the step count and its buffers."""
        return {"t": xp.asarray(self.t), **{k: getattr(self, k).copy() for k in self._buffers}}

    def load_state_dict(self, state):
        """Check every key and shape first, then copy: a bad state changes nothing."""
        name = type(self).__name__
        expected = sorted(["t", *self._buffers])
        if sorted(state) != expected:
            raise ValueError(f"{name} state: expected keys {expected}, got {sorted(state)}")
        for k in self._buffers:
            shape = getattr(self, k).shape
            if tuple(state[k].shape) != shape:
                raise ValueError(
                    f"{name} state {k!r}: expected shape {shape}, got {tuple(state[k].shape)}"
                )
        self.t = int(state["t"])
        for k in self._buffers:
            buffer = getattr(self, k)
            buffer[...] = xp.asarray(state[k], dtype=buffer.dtype)


class SGD(Optimizer):
    """SGD with momentum (optionally Nesterov), as torch.optim.SGD (dampening 0):
        g = grad + weight_decay * decay * p
        buf = g                    at the first step,   momentum * buf + g after
        p -= lr * (g + momentum * buf)   with Nesterov,  lr * buf without.
    """

    _buffers = ("buf",)

    def __init__(self, module, lr=0.1, momentum=0.9, nesterov=False, weight_decay=0.0):
        super().__init__(module, lr, weight_decay, momentum=momentum)
        if nesterov and momentum <= 0:
            raise ValueError("SGD: Nesterov momentum needs momentum > 0")
        self.momentum, self.nesterov = momentum, nesterov
        self.buf = xp.zeros_like(self.data)

    def update(self):
        g, lr = self._scratch, self.step_lr
        xp.multiply(self.data, self.decay, out=g)
        g *= self.weight_decay
        g += self.grad
        if self.momentum:
            if self.t == 1:
                self.buf[...] = g
            else:
                self.buf *= self.momentum
                self.buf += g
            if self.nesterov:
                g += self.momentum * self.buf
            else:
                g[...] = self.buf
        g *= lr
        self.data -= g


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW:
        p -= lr * weight_decay * decay * p
        m = b1 m + (1 - b1) g,   v = b2 v + (1 - b2) g^2
        p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)
    """

    _buffers = ("m", "v")

    def __init__(self, module, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(module, lr, weight_decay, eps=eps)
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"AdamW: betas must each be in [0, 1), got {betas}")
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.m = xp.zeros_like(self.data)
        self.v = xp.zeros_like(self.data)

    def update(self):
        b1, b2, s, lr = self.beta1, self.beta2, self._scratch, self.step_lr
        xp.multiply(self.data, self.decay, out=s)
        s *= lr * self.weight_decay
        self.data -= s  # decoupled weight decay
        self.m *= b1
        self.m += (1 - b1) * self.grad
        self.v *= b2
        xp.multiply(self.grad, self.grad, out=s)
        s *= 1 - b2
        self.v += s
        xp.sqrt(self.v, out=s)
        s *= 1 / math.sqrt(1 - b2**self.t)
        s += self.eps
        xp.divide(self.m, s, out=s)
        s *= lr / (1 - b1**self.t)
        self.data -= s


def warmup_cosine(step, total_steps, warmup_steps, peak_lr, min_lr=0.0):
    """Linear warmup from peak_lr / warmup_steps to peak_lr over ``warmup_steps``,
    then cosine decay to ``min_lr`` at ``total_steps`` (``step`` counts from 0)."""
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def grad_norm(grad):
    """The global L2 norm of the flat gradient, as a 0-d array (no host transfer; a
    sum of squares, not a dot product, which on a GPU would be a cuBLAS call that a
    CUDA graph cannot capture through CuPy)."""
    return xp.sqrt(xp.square(grad).sum())


def clip_grad_norm(grad, max_norm):
    """Scale the flat gradient in place so its global L2 norm is at most ``max_norm``,
    as torch.nn.utils.clip_grad_norm_ (factor max_norm / (norm + 1e-6), capped at 1).
    Returns the norm before clipping, as a 0-d array (no host transfer)."""
    norm = grad_norm(grad)
    grad *= xp.minimum(1.0, max_norm / (norm + 1e-6)).astype(grad.dtype)
    return norm
