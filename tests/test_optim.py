"""Optimizers, the learning-rate schedule and gradient clipping.

SGD (plain, momentum, Nesterov, weight decay) and AdamW against closed forms
worked out by hand on a tiny module (Linear(3, 2) then LayerNorm(2): weight decay
applies to ``fc.weight`` only), then against ``torch.optim`` for 5 steps with
random gradients and a changing learning rate. All in float64.
"""

import math

import numpy as np
import pytest

from tinyvit import backend as B
from tinyvit.nn.layers import LayerNorm, Linear, Module
from tinyvit.nn.optim import SGD, AdamW, clip_grad_norm, warmup_cosine

NAMES = ["fc.weight", "fc.bias", "norm.weight", "norm.bias"]
DECAYED = {"fc.weight"}


class Tiny(Module):
    """Linear(3, 2) then LayerNorm(2); parameters jittered off their neat initial
    values (zero biases, unit gammas) so no update can hide behind a 0 or a 1."""

    def __init__(self, seed=0):
        super().__init__()
        self.fc = Linear(3, 2, rng=B.host_rng(seed))
        self.norm = LayerNorm(2)
        for i, p in enumerate(self.parameters()):
            p.data[...] += B.to_device(B.host_rng((seed, i)).standard_normal(p.shape))


def values(model):
    """{name: host copy of the parameter}."""
    return {n: B.to_host(p.data).copy() for n, p in model.named_parameters()}


def random_grads(model, step, seed=7):
    """A different fixed gradient per parameter and step (host float64)."""
    return {
        n: B.host_rng((seed, step, i)).standard_normal(p.shape)
        for i, (n, p) in enumerate(model.named_parameters())
    }


def constant_grads(model):
    # entries of both signs and several sizes; none near 0 (AdamW divides by |g|)
    return {n: np.linspace(-1.5, 2.0, p.data.size).reshape(p.shape) + 0.05
            for n, p in model.named_parameters()}


def write_grads(model, grads):
    """Write into ``p.grad`` in place: after the optimizer is built these are views
    of its flat gradient buffer."""
    for n, p in model.named_parameters():
        p.grad[...] = B.to_device(grads[n])


def assert_params(model, expected, rtol=1e-14, atol=1e-15):
    got = values(model)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


def test_tiny_module_layout(backend):
    model = Tiny()
    assert [n for n, _ in model.named_parameters()] == NAMES
    assert {n for n, p in model.named_parameters() if p.decay} == DECAYED
    p0 = values(model)
    assert not np.any(p0["fc.bias"] == 0) and not np.any(p0["norm.weight"] == 1)


# ---------------------------------------------------------------------------
# SGD
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("momentum, nesterov", [(0.0, False), (0.9, False), (0.9, True)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_sgd_first_step(backend, momentum, nesterov, weight_decay):
    """Step 1: g' = g + wd * p0 (decayed params only) and buf = g', so
    plain and momentum give p0 - lr g', Nesterov p0 - lr (1 + m) g'."""
    model, lr = Tiny(), 0.3
    opt = SGD(model, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    p0, g = values(model), constant_grads(model)
    write_grads(model, g)
    opt.step()
    expected = {}
    for n in NAMES:
        g_wd = g[n] + (weight_decay * p0[n] if n in DECAYED else 0.0)
        expected[n] = p0[n] - lr * (1 + momentum if nesterov else 1.0) * g_wd
    assert_params(model, expected)
    assert opt.t == 1


def _geometric_sum(r, n):
    return sum(r**k for k in range(n))  # 1 + r + ... + r^(n-1)


@pytest.mark.parametrize("kind", ["plain_decay", "momentum", "nesterov"])
def test_sgd_several_steps_closed_form(backend, kind):
    """A constant gradient g for n steps has closed forms:
    plain, decay wd (a = 1 - lr wd):  p_n = a^n p0 - lr g (1 + a + ... + a^(n-1));
    momentum m: buf_t = g (1 - m^t) / (1 - m),  p_n = p0 - lr g sum_t (1 - m^t) / (1 - m);
    Nesterov: step_t = g + m buf_t,  p_n = p0 - lr g sum_t (1 + m (1 - m^t) / (1 - m))."""
    lr, wd, m, n = 0.2, 0.5, 0.8, 4
    model = Tiny()
    if kind == "plain_decay":
        opt = SGD(model, lr=lr, momentum=0.0, weight_decay=wd)
    else:
        opt = SGD(model, lr=lr, momentum=m, nesterov=kind == "nesterov")
    p0, g = values(model), constant_grads(model)
    for _ in range(n):
        write_grads(model, g)
        opt.step()
    a = 1 - lr * wd
    expected = {}
    for name in NAMES:
        if kind == "plain_decay":
            if name in DECAYED:
                expected[name] = a**n * p0[name] - lr * g[name] * _geometric_sum(a, n)
            else:
                expected[name] = p0[name] - n * lr * g[name]
        elif kind == "momentum":
            total = sum((1 - m**t) / (1 - m) for t in range(1, n + 1))
            expected[name] = p0[name] - lr * g[name] * total
        else:
            total = sum(1 + m * (1 - m**t) / (1 - m) for t in range(1, n + 1))
            expected[name] = p0[name] - lr * g[name] * total
    assert_params(model, expected, rtol=1e-13, atol=1e-14)
    assert opt.t == n


def test_sgd_nesterov_needs_momentum():
    with pytest.raises(ValueError, match=r"SGD: Nesterov momentum needs momentum > 0"):
        SGD(Tiny(), momentum=0.0, nesterov=True)


@pytest.mark.parametrize("make, message", [
    (lambda m: SGD(m, lr=-0.1), "SGD: lr must be at least 0, got -0.1"),
    (lambda m: SGD(m, momentum=-0.9), "SGD: momentum must be at least 0, got -0.9"),
    (lambda m: AdamW(m, weight_decay=-1), "AdamW: weight_decay must be at least 0, got -1"),
    (lambda m: AdamW(m, eps=-1e-8), "AdamW: eps must be at least 0, got -1e-08"),
    (lambda m: AdamW(m, betas=(0.9, 1.0)),
     r"AdamW: betas must each be in \[0, 1\), got \(0.9, 1.0\)"),
])
def test_settings_out_of_range_are_named(make, message):
    with pytest.raises(ValueError, match=message):
        make(Tiny())


# ---------------------------------------------------------------------------
# AdamW
# ---------------------------------------------------------------------------


def test_adamw_first_step(backend):
    """Step 1: m = (1 - b1) g, v = (1 - b2) g^2, so the bias-corrected m/(1-b1) = g
    and sqrt(v/(1-b2)) = |g|: p1 = (1 - lr wd) p0 - lr g / (|g| + eps), the decay
    factor on fc.weight only. eps = 0.01 is large enough to be seen."""
    lr, wd, eps = 0.1, 0.3, 1e-2
    model = Tiny()
    opt = AdamW(model, lr=lr, betas=(0.8, 0.95), eps=eps, weight_decay=wd)
    p0, g = values(model), constant_grads(model)
    write_grads(model, g)
    opt.step()
    expected = {
        n: (1 - lr * wd if n in DECAYED else 1.0) * p0[n] - lr * g[n] / (np.abs(g[n]) + eps)
        for n in NAMES
    }
    assert_params(model, expected)
    state = opt.state_dict()
    np.testing.assert_allclose(
        B.to_host(state["m"]), 0.2 * np.concatenate([g[n].ravel() for n in NAMES]), rtol=1e-15
    )
    np.testing.assert_allclose(
        B.to_host(state["v"]), 0.05 * np.concatenate([g[n].ravel() ** 2 for n in NAMES]), rtol=1e-14
    )


def test_adamw_several_steps_closed_form(backend):
    """A constant gradient keeps m_t = (1 - b1^t) g and v_t = (1 - b2^t) g^2, so every
    bias-corrected step is u = g / (|g| + eps): p_t = a p_(t-1) - lr u with a = 1 - lr wd
    on fc.weight (a = 1 elsewhere), hence p_n = a^n p0 - lr u (1 + a + ... + a^(n-1))."""
    lr, wd, eps, n = 0.05, 0.4, 1e-3, 6
    model = Tiny()
    opt = AdamW(model, lr=lr, betas=(0.9, 0.99), eps=eps, weight_decay=wd)
    p0, g = values(model), constant_grads(model)
    for _ in range(n):
        write_grads(model, g)
        opt.step()
    expected = {}
    for name in NAMES:
        a = 1 - lr * wd if name in DECAYED else 1.0
        u = g[name] / (np.abs(g[name]) + eps)
        expected[name] = a**n * p0[name] - lr * u * _geometric_sum(a, n)
    assert_params(model, expected, rtol=1e-13, atol=1e-14)


def test_step_lr_overrides_default_lr(backend):
    model = Tiny()
    opt = SGD(model, lr=100.0, momentum=0.0)
    p0, g = values(model), constant_grads(model)
    write_grads(model, g)
    opt.step(lr=0.25)
    assert_params(model, {n: p0[n] - 0.25 * g[n] for n in NAMES})
    assert opt.lr == 100.0


# ---------------------------------------------------------------------------
# Against torch.optim
# ---------------------------------------------------------------------------

TORCH_CASES = {
    "sgd": (lambda m: SGD(m, lr=0.1, momentum=0.0, weight_decay=0.05), "SGD", dict(momentum=0.0)),
    "sgd_momentum": (
        lambda m: SGD(m, lr=0.1, momentum=0.9, weight_decay=0.05),
        "SGD",
        dict(momentum=0.9),
    ),
    "sgd_nesterov": (
        lambda m: SGD(m, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.05),
        "SGD",
        dict(momentum=0.9, nesterov=True),
    ),
    "adamw": (
        lambda m: AdamW(m, lr=0.1, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05),
        "AdamW",
        dict(betas=(0.9, 0.95), eps=1e-8),
    ),
}


@pytest.mark.parametrize("case", list(TORCH_CASES))
def test_matches_torch_optim(backend, case):
    """5 steps, random gradients, a warmup-cosine learning rate passed to each step;
    torch param groups: weight decay 0.05 on fc.weight, 0 on the rest."""
    torch = pytest.importorskip("torch")
    make, torch_name, kwargs = TORCH_CASES[case]
    model = Tiny()
    opt = make(model)
    p0 = values(model)
    params = {n: torch.tensor(p0[n], dtype=torch.float64, requires_grad=True) for n in NAMES}
    groups = [
        {"params": [params[n] for n in NAMES if n in DECAYED], "weight_decay": 0.05},
        {"params": [params[n] for n in NAMES if n not in DECAYED], "weight_decay": 0.0},
    ]
    reference = getattr(torch.optim, torch_name)(groups, lr=0.1, **kwargs)
    for step in range(5):
        lr = warmup_cosine(step, total_steps=5, warmup_steps=2, peak_lr=0.1, min_lr=0.01)
        grads = random_grads(model, step)
        write_grads(model, grads)
        opt.step(lr)
        for group in reference.param_groups:
            group["lr"] = lr
        for n in NAMES:
            params[n].grad = torch.from_numpy(grads[n].copy())
        reference.step()
    got = values(model)
    for n in NAMES:
        theirs = params[n].detach().numpy()
        assert np.abs(theirs - p0[n]).max() > 1e-3  # the steps moved it
        np.testing.assert_allclose(got[n], theirs, rtol=1e-12, atol=1e-13, err_msg=n)


# ---------------------------------------------------------------------------
# Parameters are updated in place through the flat buffers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda m: SGD(m, lr=0.5, momentum=0.0),
                                  lambda m: AdamW(m, lr=0.5, weight_decay=0.0)])
def test_update_is_in_place_through_flat_buffers(backend, make):
    model = Tiny()
    opt = make(model)
    weight, norm_bias = model.fc.weight.data, model.norm.bias.data  # objects held before the step
    flat_before = opt.data
    before = values(model)
    write_grads(model, constant_grads(model))
    opt.step()
    assert model.fc.weight.data is weight and model.norm.bias.data is norm_bias
    assert opt.data is flat_before
    assert (B.xp.shares_memory(weight, opt.data)
            and B.xp.shares_memory(model.fc.weight.grad, opt.grad))
    after = values(model)
    np.testing.assert_array_equal(B.to_host(weight), after["fc.weight"])
    np.testing.assert_array_equal(B.to_host(norm_bias), after["norm.bias"])
    assert not np.array_equal(after["fc.weight"], before["fc.weight"])
    np.testing.assert_array_equal(B.to_host(opt.data),
                                  np.concatenate([after[n].ravel() for n in NAMES]))


def test_zero_grad_clears_the_flat_gradient(backend):
    model = Tiny()
    opt = SGD(model)
    write_grads(model, constant_grads(model))
    assert float(B.xp.abs(opt.grad).sum()) > 0
    model.zero_grad()
    assert float(B.xp.abs(opt.grad).sum()) == 0.0
    assert all(float(B.xp.abs(p.grad).sum()) == 0.0 for p in model.parameters())


# ---------------------------------------------------------------------------
# state_dict / load_state_dict
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, keys",
    [
        (lambda m: SGD(m, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.1), ["buf", "t"]),
        (lambda m: AdamW(m, lr=0.05, weight_decay=0.1), ["m", "t", "v"]),
    ],
)
def test_state_dict_round_trip_gives_identical_steps(backend, make, keys):
    model = Tiny()
    opt = make(model)
    for step in range(3):
        write_grads(model, random_grads(model, step))
        opt.step()
    # as a checkpoint holds it
    state = {k: B.to_host(v).copy() for k, v in opt.state_dict().items()}
    assert sorted(state) == keys and int(state["t"]) == 3

    resumed_model = Tiny(seed=5)  # other weights and a fresh optimizer
    resumed_model.flat_parameters()[0][...] = opt.data
    resumed = make(resumed_model)
    resumed.load_state_dict(state)
    assert resumed.t == 3
    for step in range(3, 6):
        grads = random_grads(model, step)
        write_grads(model, grads)
        write_grads(resumed_model, grads)
        opt.step()
        resumed.step()
    np.testing.assert_array_equal(B.to_host(resumed.data), B.to_host(opt.data))
    for k in keys:
        np.testing.assert_array_equal(B.to_host(resumed.state_dict()[k]),
                                      B.to_host(opt.state_dict()[k]))


def test_resuming_without_state_differs(backend):
    """The round trip above is not vacuous: a fresh AdamW on the same weights
    (t = 0, empty moments) takes different steps."""
    model, other = Tiny(), Tiny(seed=5)
    opt = AdamW(model, lr=0.05)
    for step in range(3):
        write_grads(model, random_grads(model, step))
        opt.step()
    other.flat_parameters()[0][...] = opt.data
    fresh = AdamW(other, lr=0.05)
    grads = random_grads(model, 3)
    write_grads(model, grads)
    write_grads(other, grads)
    opt.step()
    fresh.step()
    assert not np.allclose(B.to_host(fresh.data), B.to_host(opt.data), rtol=1e-6, atol=0)


def test_load_state_dict_wrong_key():
    opt = AdamW(Tiny())
    state = opt.state_dict()
    state["mm"] = state.pop("m")
    with pytest.raises(ValueError, match=r"AdamW state: expected keys \['m', 't', 'v'\], "
                                         r"got \['mm', 't', 'v'\]"):
        opt.load_state_dict(state)
    sgd = SGD(Tiny())
    with pytest.raises(ValueError, match=r"SGD state: expected keys \['buf', 't'\], got \['t'\]"):
        sgd.load_state_dict({"t": np.asarray(1)})


def test_load_state_dict_wrong_shape():
    opt = AdamW(Tiny())
    state = {k: np.array(v) for k, v in opt.state_dict().items()}
    state["m"] = np.zeros(11)
    with pytest.raises(ValueError, match=r"AdamW state 'm': expected shape \(12,\), got \(11,\)"):
        opt.load_state_dict(state)
    sgd = SGD(Tiny())
    with pytest.raises(ValueError, match=r"SGD state 'buf': expected shape \(12,\), got \(3, 4\)"):
        sgd.load_state_dict({"t": np.asarray(2), "buf": np.zeros((3, 4))})


def test_failed_load_state_dict_changes_nothing():
    opt = AdamW(Tiny())
    state = {"t": np.asarray(7), "m": np.ones(12), "v": np.ones(5)}
    with pytest.raises(ValueError, match="'v': expected shape"):
        opt.load_state_dict(state)
    assert opt.t == 0
    np.testing.assert_array_equal(opt.m, np.zeros(12))


# ---------------------------------------------------------------------------
# warmup_cosine
# ---------------------------------------------------------------------------


def test_warmup_cosine_values():
    kw = dict(total_steps=110, warmup_steps=10, peak_lr=1.0, min_lr=0.1)
    assert warmup_cosine(0, **kw) == 0.1  # peak / warmup_steps
    assert warmup_cosine(4, **kw) == 0.5
    assert warmup_cosine(9, **kw) == 1.0  # end of warmup
    assert warmup_cosine(10, **kw) == 1.0  # cosine starts at the peak
    # midpoint: (peak + min) / 2
    assert warmup_cosine(60, **kw) == pytest.approx(0.55, rel=1e-15, abs=0)
    assert warmup_cosine(35, **kw) == pytest.approx(0.1 + 0.45 * (1 + math.sqrt(0.5)),
                                                    rel=1e-15, abs=0)
    # the last step of a 110-step run, 99/100 of the way: cos(0.99 pi) = -cos(0.01 pi)
    assert warmup_cosine(109, **kw) == pytest.approx(0.1 + 0.45 * (1 - math.cos(math.pi / 100)),
                                                     rel=1e-13, abs=0)
    assert warmup_cosine(110, **kw) == 0.1
    assert warmup_cosine(111, **kw) == 0.1 and warmup_cosine(10_000, **kw) == 0.1  # clamped


def test_warmup_cosine_shape():
    kw = dict(total_steps=50, warmup_steps=5, peak_lr=3e-3, min_lr=1e-5)
    lrs = [warmup_cosine(s, **kw) for s in range(60)]
    assert all(a < b for a, b in zip(lrs[:5], lrs[1:5]))  # rising warmup
    assert all(a > b for a, b in zip(lrs[5:50], lrs[6:51]))  # strictly decreasing cosine
    assert lrs[50:] == [1e-5] * 10
    assert max(lrs) == 3e-3


def test_warmup_cosine_without_warmup_or_floor():
    assert warmup_cosine(0, total_steps=4, warmup_steps=0, peak_lr=2.0) == 2.0
    assert (warmup_cosine(2, total_steps=4, warmup_steps=0, peak_lr=2.0)
            == pytest.approx(1.0, rel=1e-15))
    assert warmup_cosine(4, total_steps=4, warmup_steps=0, peak_lr=2.0) == 0.0


# ---------------------------------------------------------------------------
# clip_grad_norm
# ---------------------------------------------------------------------------


def test_clip_grad_norm_above_max(backend):
    grad = B.to_device(np.array([3.0, -4.0, 0.0, 12.0]))  # norm 13
    norm = clip_grad_norm(grad, 6.5)
    assert float(norm) == 13.0
    np.testing.assert_allclose(
        B.to_host(grad), np.array([3.0, -4.0, 0.0, 12.0]) * (6.5 / (13.0 + 1e-6)),
        rtol=1e-15, atol=0
    )
    assert float(B.xp.sqrt((grad * grad).sum())) == pytest.approx(6.5, rel=1e-6)


def test_clip_grad_norm_below_max_leaves_grad_unchanged(backend):
    grad = B.to_device(np.array([3.0, -4.0, 0.0, 12.0]))
    norm = clip_grad_norm(grad, 20.0)
    assert float(norm) == 13.0
    np.testing.assert_array_equal(B.to_host(grad), [3.0, -4.0, 0.0, 12.0])


def test_clip_grad_norm_clips_the_parameters_grads(backend):
    model = Tiny()
    opt = SGD(model)
    g = constant_grads(model)
    write_grads(model, g)
    total = math.sqrt(sum(float((g[n] ** 2).sum()) for n in NAMES))
    norm = clip_grad_norm(opt.grad, 1.0)
    assert float(norm) == pytest.approx(total, rel=1e-15)
    factor = 1.0 / (total + 1e-6)
    for n, p in model.named_parameters():
        np.testing.assert_allclose(B.to_host(p.grad), g[n] * factor, rtol=1e-14, atol=0, err_msg=n)


@pytest.mark.parametrize("max_norm", [0.5, 100.0])
def test_clip_grad_norm_matches_torch(backend, max_norm):
    torch = pytest.importorskip("torch")
    shapes = [(2, 3), (2,), (4, 5)]
    grads = [B.host_rng(i).standard_normal(s) for i, s in enumerate(shapes)]
    params = [torch.zeros(s, dtype=torch.float64, requires_grad=True) for s in shapes]
    for p, g in zip(params, grads):
        p.grad = torch.from_numpy(g.copy())
    torch_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    flat = B.to_device(np.concatenate([g.ravel() for g in grads]))
    norm = clip_grad_norm(flat, max_norm)
    assert float(norm) == pytest.approx(float(torch_norm), rel=1e-14)
    np.testing.assert_allclose(
        B.to_host(flat), np.concatenate([p.grad.numpy().ravel() for p in params]),
        rtol=1e-14, atol=0
    )
