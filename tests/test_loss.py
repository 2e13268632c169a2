"""Softmax cross-entropy: the value against its definition (log-softmax written
out here), label smoothing, soft (mixup) targets, huge logits, gradient checks,
PyTorch's ``cross_entropy`` and the input errors."""

import math

import numpy as np
import pytest

from tinyvit import backend as B
from tinyvit.gradcheck import gradient_check
from tinyvit.nn.loss import SoftmaxCrossEntropy

TOL = 1e-7


def logits_and_labels(batch=5, classes=7, seed=0):
    rng = B.host_rng(seed)
    return rng.standard_normal((batch, classes)) * 3, rng.integers(0, classes, batch)


def mixup_targets(batch=5, classes=7, seed=1):
    """Rows lam * onehot(a) + (1 - lam) * onehot(b), as mixup makes them (a may equal b)."""
    rng = B.host_rng(seed)
    a, b, lam = (rng.integers(0, classes, batch), rng.integers(0, classes, batch),
                 rng.uniform(0.2, 0.8, batch))
    t = np.zeros((batch, classes))
    t[np.arange(batch), a] += lam
    t[np.arange(batch), b] += 1 - lam
    return t


def log_softmax_by_hand(z):
    """log p_bk = z_bk - log sum_j exp z_bj, row by row in plain Python."""
    out = np.empty_like(z)
    for b, row in enumerate(z):
        top = max(row)
        log_sum = top + math.log(sum(math.exp(v - top) for v in row))
        out[b] = [v - log_sum for v in row]
    return out


def loss_by_hand(z, labels, smoothing):
    """(1 - s) * mean NLL of the label + s * mean over classes of -log p (PyTorch's
    definition of label smoothing), written as a sum over rows."""
    log_p = log_softmax_by_hand(z)
    K = z.shape[1]
    rows = [(1 - smoothing) * -log_p[b, y] + smoothing * -sum(log_p[b]) / K
            for b, y in enumerate(labels)]
    return sum(rows) / len(rows)


def run(smoothing, logits, target):
    loss = SoftmaxCrossEntropy(smoothing)
    value = loss.forward(B.to_device(logits), B.to_device(target))
    return loss, value


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.35])
def test_forward_matches_definition(backend, smoothing):
    z, y = logits_and_labels()
    _, value = run(smoothing, z, y)
    assert value.ndim == 0
    assert float(value) == pytest.approx(loss_by_hand(z, y, smoothing), rel=1e-14, abs=0)


def test_smoothing_changes_the_loss(backend):
    z, y = logits_and_labels()
    assert float(run(0.1, z, y)[1]) != pytest.approx(float(run(0.0, z, y)[1]), rel=1e-3)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_soft_targets_forward(backend, smoothing):
    """Soft targets are used as they are: -(1/B) sum t log p, whatever the smoothing."""
    z, _ = logits_and_labels()
    t = mixup_targets()
    _, value = run(smoothing, z, t)
    log_p = log_softmax_by_hand(z)
    expected = -sum(float(t[b] @ log_p[b]) for b in range(5)) / 5
    assert float(value) == pytest.approx(expected, rel=1e-14, abs=0)


def test_smoothed_onehot_soft_targets_equal_smoothed_labels(backend):
    z, y = logits_and_labels()
    t = np.full((5, 7), 0.1 / 7)
    t[np.arange(5), y] += 0.9
    loss = SoftmaxCrossEntropy(0.1)
    np.testing.assert_array_equal(B.to_host(loss.targets(B.to_device(y), 7, np.float64)), t)
    assert float(run(0.0, z, t)[1]) == pytest.approx(float(run(0.1, z, y)[1]), rel=1e-15)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_huge_logits_are_stable(backend, dtype):
    """Row 0: log p = (0, -1e4, -2e4) exactly (exp(-1e4) underflows to 0 next to 1);
    row 1: log p = (-2e4 - log 2, -log 2, -log 2). With labels (0, 2):
    no smoothing: loss = (0 + log 2) / 2;
    smoothing 0.1 (t_k = 0.1/3 off the label): row 0 = (0.1/3) 3e4 = 1000,
    row 1 = (0.1/3) (2e4 + log 2) + (0.1/3 + 0.9 + 0.1/3) log 2 = 2e4/30 + log 2."""
    z = np.array([[1e4, 0.0, -1e4], [-1e4, 1e4, 1e4]], dtype=dtype)
    y = np.array([0, 2])
    loss, value = run(0.0, z, y)
    assert np.isfinite(float(value))
    assert float(value) == pytest.approx(math.log(2) / 2, rel=1e-6 if dtype == "float32" else 1e-15)
    dz = B.to_host(loss.backward())
    np.testing.assert_array_equal(dz, np.array([[0.0, 0.0, 0.0], [0.0, 0.25, -0.25]], dtype=dtype))
    loss, value = run(0.1, z, y)
    expected = (1000 + 2e4 / 30 + math.log(2)) / 2
    assert float(value) == pytest.approx(expected, rel=1e-6 if dtype == "float32" else 1e-15)
    assert value.dtype == np.dtype(dtype)
    dz = B.to_host(loss.backward())
    off = 0.1 / 3
    expected_dz = np.array([[1 - (0.9 + off), -off, -off],
                            [-off, 0.5 - off, 0.5 - (0.9 + off)]]) / 2
    np.testing.assert_allclose(dz, expected_dz, rtol=1e-6 if dtype == "float32" else 1e-15)


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("target", ["labels", "labels_smoothed", "soft"])
def test_gradient_check(backend, batch, target):
    z, y = logits_and_labels(batch=batch)
    smoothing = 0.1 if target == "labels_smoothed" else 0.0
    t = mixup_targets(batch=batch) if target == "soft" else y
    loss = SoftmaxCrossEntropy(smoothing)
    report = gradient_check(loss, B.to_device(z), B.to_device(t)).assert_ok(TOL)
    assert [c.name for c in report.checks] == ["input"]


def test_backward_is_softmax_minus_target_over_batch(backend):
    z, y = logits_and_labels()
    loss, _ = run(0.2, z, y)
    p = np.exp(log_softmax_by_hand(z))
    t = np.full((5, 7), 0.2 / 7)
    t[np.arange(5), y] += 0.8
    np.testing.assert_allclose(B.to_host(loss.backward()), (p - t) / 5, rtol=1e-13, atol=1e-16)
    loss, _ = run(0.2, z, y)  # each forward serves one backward
    np.testing.assert_allclose(B.to_host(loss.backward(3.0)), 3 * (p - t) / 5,
                               rtol=1e-13, atol=1e-16)


@pytest.mark.parametrize("target", ["labels", "labels_smoothed", "soft"])
@pytest.mark.parametrize("batch", [1, 5])
def test_matches_torch_cross_entropy(backend, target, batch):
    torch = pytest.importorskip("torch")
    z, y = logits_and_labels(batch=batch)
    smoothing = 0.1 if target == "labels_smoothed" else 0.0
    t = mixup_targets(batch=batch) if target == "soft" else y
    loss, value = run(smoothing, z, t)
    dz = B.to_host(loss.backward())
    zt = torch.tensor(z, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(zt, torch.from_numpy(t), label_smoothing=smoothing)
    expected.backward()
    assert float(value) == pytest.approx(expected.item(), rel=1e-14, abs=1e-15)
    np.testing.assert_allclose(dz, zt.grad.numpy(), rtol=1e-12, atol=1e-15)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "labels, message",
    [
        ([0, 5, 2], r"labels must be in \[0, 4\] for 5 classes, got labels in \[0, 5\]"),
        ([-1, 2, 2], r"labels must be in \[0, 4\] for 5 classes, got labels in \[-1, 2\]"),
    ],
)
def test_labels_out_of_range(backend, labels, message):
    with pytest.raises(ValueError, match=message):
        SoftmaxCrossEntropy().forward(B.xp.zeros((3, 5)), B.to_device(np.array(labels)))


@pytest.mark.parametrize(
    "logits, target, message",
    [
        (np.zeros((3, 5)), np.zeros((3, 1), np.int64),
         r"expected labels of shape \(3,\), got \(3, 1\)"),
        (np.zeros((3, 5)), np.zeros(4, np.int64), r"expected labels of shape \(3,\), got \(4,\)"),
        (np.zeros((3, 5), np.int64), np.zeros(3, np.int64),
         "expected float logits, got dtype int64"),
        (np.zeros((3, 5)), np.zeros((3, 4)),
         r"soft targets must be \(B, K\) = \(3, 5\), got \(3, 4\)"),
        (np.zeros((3, 5)), np.zeros(3), r"soft targets must be \(B, K\) = \(3, 5\), got \(3,\); "
         "labels of shape \\(3,\\) must be integers, got dtype float64$"),
        (np.zeros(5), np.zeros(1, np.int64),
         r"expected logits \(B, K\) of one image or more, got shape \(5,\)"),
        (np.zeros((0, 5)), np.zeros(0, np.int64),
         r"expected logits \(B, K\) of one image or more, got shape \(0, 5\)"),
        (np.zeros((3, 5)), np.zeros(3, bool), "expected integer labels, got dtype bool"),
        (np.zeros((2, 3)), np.ones((2, 3)),
         r"soft targets must be distributions \(each row's entries at least 0, summing to 1\), "
         r"got entries down to 1 and a row summing to 3$"),
        (np.zeros((2, 3)), np.array([[1.5, -0.5, 0.0], [0.0, 1.0, 0.0]]),
         "soft targets must be distributions .*, got entries down to -0.5 and a row summing to 1$"),
    ],
)
def test_bad_inputs_get_clear_errors(backend, logits, target, message):
    with pytest.raises(ValueError, match="SoftmaxCrossEntropy: " + message):
        SoftmaxCrossEntropy().forward(B.to_device(logits), B.to_device(target))


def test_targets_and_logits_that_are_not_arrays_are_named():
    with pytest.raises(ValueError, match=r"^SoftmaxCrossEntropy: expected an array of 3 integer "
                                         r"labels or of soft targets \(B, K\) = \(3, 5\), got "
                                         r"list$"):
        SoftmaxCrossEntropy().forward(np.zeros((3, 5)), [0, 1, 2])
    with pytest.raises(ValueError, match=r"^SoftmaxCrossEntropy: expected logits, an array "
                                         r"\(B, K\), got list$"):
        SoftmaxCrossEntropy().forward([[0.0] * 5] * 3, np.zeros(3, np.int64))


@pytest.mark.parametrize("smoothing", [-0.1, 1.0])
def test_bad_label_smoothing(smoothing):
    with pytest.raises(ValueError, match=rf"label_smoothing must be in \[0, 1\), got {smoothing}"):
        SoftmaxCrossEntropy(smoothing)


def test_backward_before_forward():
    with pytest.raises(RuntimeError,
                       match="SoftmaxCrossEntropy.backward called without a forward before it"):
        SoftmaxCrossEntropy().backward()
