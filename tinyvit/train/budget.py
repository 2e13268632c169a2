"""Time budgets: a run that ends within a wall-clock time on whatever processor runs
it. The first epoch runs and is evaluated; the epochs are then planned from what it
took, and cut when later epochs run slower than planned. The plan replaces the
config's ``epochs``, so the cosine schedule ends with the run."""

import dataclasses

from .state import Plan


def plan_epochs(config, train_seconds, eval_seconds, spent):
    """The epochs of a run with a ``budget``, planned once its first epoch is done.

    ``spent`` is the wall-clock time since the run started (reading the data,
    starting the workers, the first epoch and its evaluation); each further epoch
    is taken to cost the first one's training time plus its share of the test
    evaluations, and the last epoch is always evaluated:
        epochs = 1 + floor((budget - spent - eval) / (train + eval / eval_every)).
    The first epoch, usually the slowest, makes the plan err on the short side.
    Returns (the config with the planned epochs, the ``Plan``), saved in every
    checkpoint so that a resumed run keeps it.
    """
    per_epoch = train_seconds + eval_seconds / config.eval_every
    left = 60 * config.budget - spent - eval_seconds
    epochs = 1 + max(0, int(left // per_epoch))
    print(f"budget {config.budget:g} min: {spent:.0f} s so far, an epoch takes "
          f"{train_seconds:.0f} s and a test evaluation {eval_seconds:.0f} s: "
          f"{epochs} epochs in all")
    plan = Plan(budget_minutes=config.budget, epochs=epochs, first_epoch_s=train_seconds,
                eval_s=eval_seconds, spent_s=spent)
    return dataclasses.replace(config, epochs=epochs), plan


def keep_to_budget(config, plan, done, spent):
    """After each later epoch's training (``done`` epochs, ``spent`` seconds): when
    the epochs since the plan ran slower than it assumed (another process took a
    core, say) and the rest would end past the budget, end the run earlier,
        epochs = done + floor((budget - spent - eval) / per_epoch),
    per_epoch the wall-clock time an epoch took since the plan, never more epochs
    than planned. Returns the config with the epochs to run (``plan`` follows it)."""
    per_epoch = (spent - plan.spent_s) / (done - 1)
    left = 60 * config.budget - spent - plan.eval_s
    epochs = max(done, min(config.epochs, done + int(left // per_epoch)))
    if epochs == config.epochs:
        return config
    print(f"budget {config.budget:g} min: epochs take {per_epoch:.0f} s, {spent:.0f} s so far: "
          f"{epochs} epochs in all instead of {config.epochs}")
    plan.epochs = epochs
    return dataclasses.replace(config, epochs=epochs)
