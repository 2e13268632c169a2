"""A model's gradients on one batch: the training-mode pass that the trainer, its
worker processes and the benchmarks share."""


def loss_and_gradients(model, criterion, x, target, seed):
    """One training-mode pass over a batch: forward, ``criterion``'s loss, backward.
    The gradients are left in the model's parameters (zeroed first) and ``seed``
    seeds its dropout masks. Returns (loss, logits). The trainer, its worker
    processes and the benchmark all take a step through here."""
    if not model.training:
        model.train()
    model.seed_dropout(seed)
    logits = model.forward(x)
    loss = criterion.forward(logits, target)
    model.zero_grad()
    model.backward(criterion.backward())
    return loss, logits
