"""A model's loss, accuracy and predictions over a test set, and its confusion matrix."""

import numpy as np  # host-side bookkeeping only

from ..backend import to_host
from ..nn.loss import SoftmaxCrossEntropy


def evaluate(model, batches, criterion=None):
    """Loss, accuracy and predictions of ``model`` (eval mode) over ``batches``;
    ``model`` is anything with ``eval()`` and ``forward(x)``: a ViT or a DataParallel."""
    criterion = criterion or SoftmaxCrossEntropy()
    model.eval()
    total_loss, predictions, labels = 0.0, [], []
    for x, y in batches.epoch(0):
        logits = model.forward(x)
        total_loss += float(criterion.forward(logits, y)) * len(y)
        predictions.append(to_host(logits.argmax(axis=1)))
        labels.append(to_host(y))
    predictions, labels = np.concatenate(predictions), np.concatenate(labels)
    return total_loss / len(labels), float((predictions == labels).mean()), predictions, labels


def confusion_matrix(predictions, labels, num_classes):
    """counts[i, j] = number of images of class i predicted as class j."""
    counts = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(counts, (labels, predictions), 1)
    return counts
