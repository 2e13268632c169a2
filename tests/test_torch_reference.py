"""End to end against PyTorch, as llm.c's test_gpt2: a tiny float64 ViT and a
plain-torch ViT in timm's layout holding the same weights (tests/torch_reference.py)
must give the same logits, the same label-smoothed loss, the same gradient for
every parameter and for the input, and the same 10-step AdamW loss curve.
Skipped without torch."""

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(__file__))
from conftest import jitter  # noqa: E402
from tinyvit import backend as B  # noqa: E402
from tinyvit.models import ViT  # noqa: E402
from tinyvit.nn.loss import SoftmaxCrossEntropy  # noqa: E402
from tinyvit.nn.optim import AdamW  # noqa: E402
from torch_reference import torch_vit_from  # noqa: E402

CONFIG = dict(
    image_size=12, patch_size=4, in_channels=1, num_classes=5, embed_dim=12, depth=2, num_heads=3,
    mlp_ratio=2.0
)
LABELS = np.array([0, 3, 1, 4])
SMOOTHING = 0.1


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tensors this small gain nothing from torch's thread pool, and on a busy
    machine its threads contend and slow the test many times over."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def tiny_vit(pool, dtype="float64", scale=0.2):
    """The model, its parameters jittered so LayerNorm gammas are not 1 and biases
    not 0 (and attention is far from uniform)."""
    with B.default_dtype(dtype):
        return jitter(ViT(**CONFIG, pool=pool, seed=0), scale)


def batch(seed=0, dtype=np.float64):
    return B.host_rng(seed).standard_normal((4, 1, 12, 12)).astype(dtype)


def rel_err(ours, theirs):
    return float(np.abs(ours - theirs).max() / np.abs(theirs).max())


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_logits_loss_and_every_gradient_match_torch(tier, pool):
    model = tier(tiny_vit(pool))
    reference = torch_vit_from(model)
    x = batch()

    logits = model.forward(B.to_device(x))
    criterion = SoftmaxCrossEntropy(SMOOTHING)
    loss = criterion.forward(logits, B.to_device(LABELS))
    model.zero_grad()
    dx = B.to_host(model.backward(criterion.backward()))

    xt = torch.tensor(x, requires_grad=True)
    logits_t = reference(xt)
    loss_t = torch.nn.functional.cross_entropy(logits_t, torch.from_numpy(LABELS),
                                               label_smoothing=SMOOTHING)
    loss_t.backward()

    np.testing.assert_allclose(B.to_host(logits), logits_t.detach().numpy(), rtol=1e-12, atol=1e-12)
    assert float(loss) == pytest.approx(loss_t.item(), rel=1e-12, abs=0)
    assert np.abs(xt.grad.numpy()).max() > 0
    assert rel_err(dx, xt.grad.numpy()) <= 1e-10

    grads = model.grads()
    torch_grads = {name: p.grad.numpy() for name, p in reference.named_parameters()}
    assert sorted(grads) == sorted(torch_grads)
    assert len(grads) == 4 + 12 * CONFIG["depth"] + 4
    errors = {}
    for name, theirs in torch_grads.items():
        assert grads[name].shape == theirs.shape, name
        assert np.abs(theirs).max() > 0, name  # every gradient is really exercised
        errors[name] = rel_err(grads[name], theirs)
    bad = {k: v for k, v in errors.items() if not v <= 1e-10}
    assert not bad, f"gradients differ from torch (rel err): {bad}"


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_training_loss_curve_matches_torch(tier, pool):
    """10 AdamW steps on both, a new batch each step; torch's param groups put
    weight decay on the Linear (and patch Conv2d) weights only, as tinyvit's
    ``decay`` flags do."""
    lr, wd, betas = 3e-3, 0.05, (0.9, 0.95)
    model = tier(tiny_vit(pool))
    reference = torch_vit_from(model)
    decayed = {name for name, p in zip(model.state_dict(), model.parameters()) if p.decay}
    assert decayed == {n for n in model.state_dict() if n.endswith(".weight") and "norm" not in n}
    named = dict(reference.named_parameters())
    groups = [
        {"params": [p for n, p in named.items() if n in decayed], "weight_decay": wd},
        {"params": [p for n, p in named.items() if n not in decayed], "weight_decay": 0.0},
    ]
    opt = AdamW(model, lr=lr, betas=betas, weight_decay=wd)
    opt_t = torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8)
    criterion = SoftmaxCrossEntropy(SMOOTHING)

    losses, losses_t = [], []
    for step in range(10):
        x, labels = batch(seed=100 + step), B.host_rng(200 + step).integers(0, 5, 4)
        model.zero_grad()
        loss = criterion.forward(model.forward(B.to_device(x)), B.to_device(labels))
        model.backward(criterion.backward())
        opt.step()
        losses.append(float(loss))

        opt_t.zero_grad()
        loss_t = torch.nn.functional.cross_entropy(
            reference(torch.from_numpy(x)), torch.from_numpy(labels), label_smoothing=SMOOTHING
        )
        loss_t.backward()
        opt_t.step()
        losses_t.append(loss_t.item())

    np.testing.assert_allclose(losses, losses_t, rtol=0, atol=1e-9)
    assert len(set(losses)) == 10  # the model changed at every step
    state = model.state_dict()
    for name, p in reference.named_parameters():
        np.testing.assert_allclose(state[name], p.detach().numpy(), rtol=0, atol=1e-9, err_msg=name)


def test_float32_logits_match_torch_float32(tier):
    """The float64 model cast to float32 (a seed draws other weights in float32)."""
    model64 = tier(tiny_vit("cls"))
    x = batch(dtype=np.float32)
    logits64 = B.to_host(model64.forward(B.to_device(x.astype(np.float64))))
    model = model64.astype(np.float32)
    assert model.head.weight.data.dtype == np.float32
    reference = torch_vit_from(model, dtype=torch.float32)
    logits = B.to_host(model.forward(B.to_device(x)))
    assert logits.dtype == np.float32
    with torch.no_grad():
        expected = reference(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(logits, expected, rtol=0, atol=1e-5)
    # and both are the float64 logits up to float32 rounding
    np.testing.assert_allclose(logits, logits64, rtol=0, atol=1e-5)
