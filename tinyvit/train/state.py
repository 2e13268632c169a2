"""Where a run stands: everything besides the weights and the optimizer that a
checkpoint must hold so that a resumed run is the same run.

Random state needs no field: the data order, the augmentation and the dropout
masks of step b in epoch e are all seeded from ``(seed, e, b)``.
"""

import dataclasses


@dataclasses.dataclass
class Totals:
    """Running sums over the epoch in progress, so that an epoch interrupted and
    resumed reports the same metrics as one run through."""

    loss_sum: float = 0.0  # the training loss summed over images
    correct: int = 0  # images predicted right
    seen: int = 0  # images trained on
    time: float = 0.0  # seconds spent in training steps


@dataclasses.dataclass
class Plan:
    """A budgeted run's epochs, planned after its first (train/budget.py)."""

    budget_minutes: float
    epochs: int
    first_epoch_s: float  # the first epoch's training time
    eval_s: float  # its test evaluation's time
    spent_s: float  # the run's wall-clock time when the plan was made


@dataclasses.dataclass
class RunState:
    """The position of a run and what it has measured so far."""

    lr: float  # the learning rate of the last step
    epoch: int = 0  # epochs done
    step: int = 0  # steps done in the epoch in progress
    global_step: int = 0  # steps done in all
    elapsed: float = 0.0  # seconds of training and evaluation
    running: Totals = dataclasses.field(default_factory=Totals)
    history: list = dataclasses.field(default_factory=list)  # a metrics row per epoch
    best_acc: float = -1.0  # the best test accuracy so far (best.npz)
    init: list = None  # how the model was made from --init, one note per line
    plan: Plan = None  # the budget's plan, once made
    wall: float = 0.0  # the run's wall-clock seconds when it was saved

    def to_meta(self):
        """The fields as a JSON-able dict, for a checkpoint's meta."""
        return dataclasses.asdict(self)

    @classmethod
    def from_meta(cls, meta):
        """The state saved in a checkpoint's meta (which holds other entries too)."""
        names = {f.name for f in dataclasses.fields(cls)}
        state = cls(**{k: v for k, v in meta.items() if k in names})
        state.running = Totals(**state.running)
        state.plan = None if state.plan is None else Plan(**state.plan)
        return state
