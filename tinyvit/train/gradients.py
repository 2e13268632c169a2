"""A model's gradients on one batch, or on one process's share of it: the
training-mode pass that the trainer, its worker processes (``parallel.py``), the
processes of an MPI run (``distributed.py``) and the benchmarks share."""


def loss_and_gradients(model, criterion, x, target, seed, share=1.0):
    """One training-mode pass over a batch, its dropout masks seeded ``seed``:
    ``forward_backward`` after ``model.seed_dropout(seed)``. Returns (loss, logits)."""
    model.seed_dropout(seed)
    return forward_backward(model, criterion, x, target, share)


def forward_backward(model, criterion, x, target, share=1.0):
    """One training-mode pass over a batch: forward, ``criterion``'s loss, backward.
    The gradients are left in the model's parameters (zeroed first). Returns (loss,
    logits).

    ``share``: the fraction of a larger batch that ``x`` is. The batch's loss is the
    mean over all its rows, L = sum_r share_r L_r with L_r the mean over share r, so
    the backward starts from dL/dL_r = share_r: the gradients left here are this
    share's part of the batch's, and the parts add up to it."""
    if not model.training:
        model.train()
    logits = model.forward(x)
    loss = criterion.forward(logits, target)
    model.zero_grad()
    model.backward(criterion.backward(share))
    return loss, logits


def rows(n, rank, size):
    """Rows [lo, hi) of a batch of n that process (or worker) ``rank`` of ``size``
    takes: consecutive, in rank order, sizes within 1 of each other."""
    return n * rank // size, n * (rank + 1) // size


def share_seed(seed, rank):
    """The dropout seed of ``rank``'s share of a batch seeded ``seed`` (an int or a
    tuple): each share draws its own masks."""
    return (*(seed if isinstance(seed, tuple) else (seed,)), rank)
