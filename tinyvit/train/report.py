"""What a run writes for a person to read: ``metrics.json``, ``curves.png`` after
every epoch, and at the end the per-class accuracy and ``confusion.png``."""

import json

from ..data import dataset_info
from ..files import atomic_write
from ..viz.charts import Panel, Series, line_chart
from ..viz.matrices import heatmap
from .evaluate import confusion_matrix


def write_metrics(out, history, extra=None):
    """``metrics.json`` (a row per epoch, and ``extra``) and the curves of ``history``."""
    text = json.dumps({"epochs": history, **(extra or {})}, indent=1)
    with atomic_write(out / "metrics.json") as f:
        f.write(text.encode())
    epochs = [row["epoch"] for row in history]

    def series(key):
        return [Series(split, epochs, [r[f"{split}_{key}"] for r in history], style="both")
                for split in ("train", "test")]

    line_chart(
        [Panel("loss", "epoch", "cross-entropy", series("loss")),
         Panel("accuracy", "epoch", "accuracy", series("acc"))],
        out / "curves.png",
        title=f"training curves ({out.name})",
    )


def write_final_report(out, dataset, history, evaluation, trained=True):
    """Per-class accuracy and the confusion matrix of the final model, from its
    ``evaluate`` result: into ``metrics.json``, ``confusion.png`` and the terminal.
    ``trained``: whether this call trained, and so wrote best.npz and last.npz (a
    resumed run that had ended did not: they hold the run as it ended)."""
    _, test_acc, predictions, labels = evaluation
    classes = dataset_info(dataset).classes
    counts = confusion_matrix(predictions, labels, len(classes))
    per_class = {name: float(counts[i, i] / max(counts[i].sum(), 1))
                 for i, name in enumerate(classes)}
    write_metrics(out, history, {"per_class_accuracy": per_class,
                                 "confusion_matrix": counts.tolist()})
    heatmap(counts, out / "confusion.png",
                 title=f"confusion matrix (test accuracy {test_acc:.2%})",
                 xlabel="predicted", ylabel="true", xticklabels=classes, yticklabels=classes)
    print("per-class test accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in per_class.items()))
    reports = f"{out / 'metrics.json'}, {out / 'curves.png'}, {out / 'confusion.png'}"
    checkpoints = f"{out / 'best.npz'}, {out / 'last.npz'}"
    print(f"wrote {reports}, {checkpoints}" if trained else
          f"wrote {reports}; {checkpoints} hold the run as it ended")
