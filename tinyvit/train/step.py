"""One training step: forward, loss, backward and the optimizer's update."""

from contextlib import nullcontext

from ..backend import host_rng, quiet_overflow, xp
from ..data import augment
from ..fast import for_tier
from ..fast.graphs import Captured
from ..nn.loss import SoftmaxCrossEntropy
from ..nn.optim import SGD, AdamW, clip_grad_norm, grad_norm, warmup_cosine
from .distributed import MPIParallel, check_launch, communicator, launched
from .gradients import forward_backward
from .parallel import DataParallel
from .signals import Stop


class Trainer:
    """Model, loss, optimizer and schedule for one run; ``step`` is one update.

    The model's layers, the loss and the optimizer become the fast kernels here
    (``tinyvit.fast.accelerate``) unless the run asks for the reference tier. As a
    context manager the trainer also splits each batch of training steps and
    evaluation over processes: the worker processes of a run with ``workers > 1``
    (``parallel.py``), or the processes that mpiexec started (``distributed.py``),
    of which the first, ``primary``, writes and prints for all. Without ``with``,
    everything runs in this process.
    """

    def __init__(self, config, model, stop=None):
        self.config = config
        tiered = for_tier(config.tier)
        self.model = tiered(model)
        self.criterion = tiered(SoftmaxCrossEntropy(config.label_smoothing))
        if config.optimizer == "adamw":
            self.optimizer = AdamW(self.model, config.lr, weight_decay=config.weight_decay)
        else:
            self.optimizer = SGD(self.model, config.lr, momentum=0.9, nesterov=True,
                                 weight_decay=config.weight_decay)
        self.optimizer = tiered(self.optimizer)
        self.num_classes = self.model.config.num_classes
        self.trainable = self.head_mask() if config.freeze_backbone else None
        rank, size = launched()
        self.primary = rank == 0
        self.communicator = communicator() if size > 1 else None
        if self.communicator is not None:
            check_launch(config, size)
        self.parallel = None
        self.stop = stop or Stop()  # SIGINT and SIGTERM inside ``with``: a request to stop
        self.update = self.device_step
        if config.cuda_graph:
            check_one_process(size)
            self.update = Captured(self.device_step)

    def head_mask(self):
        """For a linear probe: 1 on the head's entries of the flat parameter buffer, 0
        elsewhere. ``step`` multiplies the gradient by it, and the weight decay is
        masked with it, so the optimizer leaves every other parameter as it is."""
        _, _, decay = self.model.flat_parameters()
        mask = xp.zeros_like(decay)
        head = {id(p) for p in self.model.head.parameters()}
        offset = 0
        for p in self.model.parameters():  # the order flat_parameters packs them in
            if id(p) in head:
                mask[offset:offset + p.data.size] = 1
            offset += p.data.size
        decay *= mask
        return mask

    def __enter__(self):
        c = self.config
        self.stop.__enter__()
        if self.communicator is not None:
            self.parallel = MPIParallel(self.model, self.communicator, self.stop)
        elif c.workers > 1:
            self.parallel = DataParallel(self.model, c.workers,
                                         max(c.batch_size, c.eval_batch_size))
        if self.parallel is not None:
            self.parallel.__enter__()
        return self

    def __exit__(self, *exc):
        if self.parallel is not None:
            self.parallel.__exit__(*exc)
            self.parallel = None
        self.stop.__exit__(*exc)

    def check_stop(self):
        """Between two steps: raise ``signals.Stopped`` if a signal asked this process to
        stop. Under mpiexec the request goes to every process with the step's gradients
        instead, and all stop at the same step (``StopRequested``)."""
        if self.communicator is None:
            self.stop.check()

    def interruptible(self):
        """A context in which a signal stops this process at once (for evaluation, which
        changes nothing); under mpiexec the processes stop together as in a step."""
        return self.stop.interrupting() if self.communicator is None else nullcontext()

    def lr_at(self, step, steps_per_epoch):
        c = self.config
        return warmup_cosine(step, c.epochs * steps_per_epoch,
                             round(c.warmup_epochs * steps_per_epoch), c.lr, c.min_lr)

    def mix(self, x, y, seed):
        """Mixup or cutmix (one of the two, chosen per batch), with soft targets."""
        c = self.config
        if not (c.mixup or c.cutmix):
            return x, y
        rng = host_rng(seed)  # the choice, lam and the box: a few numbers, on the host
        if c.cutmix and (not c.mixup or rng.random() < 0.5):
            return augment.cutmix(x, y, self.num_classes, rng, alpha=c.cutmix)
        return augment.mixup(x, y, self.num_classes, rng, alpha=c.mixup)

    def step(self, x, y, lr, seed):
        """Forward, loss, backward and update on one batch. Returns (loss, number of
        correct predictions, gradient norm before clipping); in one process as device
        scalars, so nothing waits for the host (the workers' loss is a host float
        already)."""
        x, target = self.mix(x, y, seed + (1,))
        with quiet_overflow():  # a value that overflows shows in the loss or the norm
            if self.parallel is None:
                self.optimizer.advance(lr)
                self.model.seed_dropout(seed)
                return self.update(x, target, y)
            # the same, over the workers: their targets are distributions
            self.criterion.check_target(target, len(x), self.num_classes)
            self.criterion.check_labels(target, self.num_classes)
            targets = self.criterion.targets(target, self.num_classes, x.dtype)
            loss, logits = self.parallel.gradients(x, targets, seed)
            self.optimizer.advance(lr)  # counted once the gradients are in (a worker may die)
            return self.update_with(loss, logits, y)

    def device_step(self, x, target, y):
        """The step on the device, in this process: forward, loss, backward, update."""
        loss, logits = forward_backward(self.model, self.criterion, x, target)
        return self.update_with(loss, logits, y)

    def update_with(self, loss, logits, y):
        """The update from the gradients in the model: the gradient masked (a linear
        probe) and clipped, then the optimizer's update with the learning rate
        ``advance`` set. Returns (loss, correct predictions, the norm before clipping)."""
        grad = self.optimizer.grad
        if self.trainable is not None:
            grad *= self.trainable
        if self.config.clip_grad:
            norm = clip_grad_norm(grad, self.config.clip_grad)
        else:
            norm = grad_norm(grad)
        self.optimizer.update()
        return loss, (logits.argmax(axis=1) == y).sum(), norm

    def evaluator(self):
        """What ``evaluate`` runs: the model, or the processes when there are some."""
        return self.model if self.parallel is None else self.parallel

    def on_primary(self, function, *args):
        """``function(*args)`` run by the primary process alone, its result returned
        in every process of an MPI run (for decisions taken from clocks, which
        differ between processes, and that print)."""
        if self.communicator is None:
            return function(*args)
        return self.communicator.broadcast(function(*args) if self.primary else None)


def check_one_process(processes):
    """A ValueError unless the run is one process: a captured step cannot wait for the
    other processes' gradients (their all-reduce runs between its backward and update)."""
    if processes > 1:
        raise ValueError(f"cuda_graph: a captured step runs in one process, got {processes} "
                         "under mpiexec: drop --cuda-graph or run one process")
