"""Training: a run's config, its loop and checkpoints, time budgets, data
parallelism, evaluation and prediction."""

from .build import build_model, make_batches
from .config import RunRefused, TrainConfig
from .evaluate import evaluate
from .loop import TrainingDiverged, fit
from .predict import load_trained, predict

__all__ = ["RunRefused", "TrainConfig", "TrainingDiverged", "build_model", "evaluate", "fit",
           "load_trained", "make_batches", "predict"]
