"""The whole ViT: presets and parameter counts, summary, state dicts in timm's
layout, input errors, and gradient checks of the whole model."""

from types import SimpleNamespace

import numpy as np
import pytest

import tinyvit
from conftest import jitter, randn
from tinyvit import backend as B
from tinyvit.fast import accelerate
from tinyvit.gradcheck import gradient_check
from tinyvit.models import ViT, ViTConfig
from tinyvit.nn.layers import Block
from tinyvit.weights import load_model, save_model

TOL = 1e-7
TINY = dict(image_size=8, patch_size=4, in_channels=2, num_classes=3, embed_dim=8, depth=2,
            num_heads=2)


@pytest.mark.parametrize(
    "name, count",
    [
        ("vit_base_patch16_224", 86_567_656),
        ("vit_small_patch16_224", 22_050_664),
        ("vit_tiny_patch16_224", 5_717_416),
        ("mnist", 139_018),
    ],
)
def test_preset_parameter_counts(name, count):
    assert tinyvit.create_model(name).num_parameters() == count


def test_summary_of_vit_b16(capsys):
    model = tinyvit.create_model("vit_base_patch16_224")
    text = model.summary()
    assert capsys.readouterr().out.strip() == text.strip()
    assert "Total params: 86,567,656" in text
    lines = {line.split("  ")[0]: line for line in text.splitlines()}
    assert "[B, 197, 3072]" in lines["blocks.10.mlp.fc1 (Linear)"]
    # cls pooling: the last block computes the class token's row alone
    assert "[B, 12, 1, 197]" in lines["blocks.11.attn.softmax (12 heads)"]
    assert "[B, 1, 3072]" in lines["blocks.11.mlp.fc1 (Linear)"]
    assert "patch_embed.proj (Conv2d as Linear)  [B, 196, 768]" in text
    assert "head (Linear)" in text and "[B, 1000]" in text and "769,000" in text


def test_create_model_overrides_and_errors():
    model = tinyvit.create_model("mnist", depth=2, embed_dim=32)
    assert (model.config.depth, model.config.embed_dim, len(model.blocks)) == (2, 32, 2)
    with pytest.raises(ValueError, match="unknown model preset 'nope'; presets: mnist, cifar10"):
        tinyvit.create_model("nope")
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['dpeth'\]"):
        tinyvit.create_model("mnist", dpeth=3)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(image_size=30, patch_size=7), "image_size 30 is not divisible by patch_size 7"),
        (dict(embed_dim=10, num_heads=4), "embed_dim 10 is not divisible by num_heads 4"),
        (dict(pool="max"), "pool must be 'cls' or 'mean', got 'max'"),
        (dict(patch_size=0), "patch_size must be at least 1, got 0"),  # not a modulo by zero
        (dict(num_heads=0), "num_heads must be at least 1, got 0"),
        (dict(depth=0), "depth must be at least 1, got 0"),
        (dict(mlp_ratio=0.01), "mlp_ratio 0.01 leaves the MLP no hidden unit at embed_dim 64"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\), got 1.0"),
        (dict(attn_dropout=-0.1), r"attn_dropout must be in \[0, 1\), got -0.1"),
        (dict(norm_eps=0.0), "norm_eps must be positive, got 0.0"),
        (dict(representation_size=-1), "representation_size must be at least 0, got -1"),
        (dict(depth="4"), r"^depth must be an int, got '4' \(str\)$"),
        (dict(depth=4.0), r"^depth must be an int, got 4.0 \(float\)$"),
        (dict(num_heads=True), r"^num_heads must be an int, got True \(bool\)$"),
        (dict(mlp_ratio="2"), r"^mlp_ratio must be a number, got '2' \(str\)$"),
        (dict(qkv_bias="False"), r"^qkv_bias must be True or False, got 'False' \(str\)$"),
        (dict(dropout=float("nan")), r"^dropout must be a finite number, got nan$"),
    ],
)
def test_config_errors(fields, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**fields)


def test_config_takes_numpy_numbers_and_an_int_ratio_as_python_values():
    """Python's own, which JSON writes (a checkpoint's meta, config.json)."""
    config = ViTConfig(depth=np.int64(2), mlp_ratio=2, dropout=np.float32(0.5),
                       qkv_bias=np.bool_(False))
    values = (config.depth, config.mlp_ratio, config.dropout, config.qkv_bias)
    assert values == (2, 2.0, 0.5, False)
    assert [type(v) for v in values] == [int, float, float, bool]


def test_same_seed_same_model():
    a, b, c = ViT(seed=3), ViT(seed=3), ViT(seed=4)
    triples = zip(a.named_parameters(), b.named_parameters(), c.named_parameters())
    for (name, pa), (_, pb), (_, pc) in triples:
        np.testing.assert_array_equal(B.to_host(pa.data), B.to_host(pb.data))
        if name.endswith("weight") and "norm" not in name:
            assert not np.array_equal(B.to_host(pa.data), B.to_host(pc.data))


TIMM_KEYS_BLOCK = [
    "norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight",
    "attn.proj.bias", "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias",
    "mlp.fc2.weight", "mlp.fc2.bias",
]


def test_state_dict_uses_timm_names_and_layouts():
    model = ViT(**TINY)
    state = model.state_dict()
    expected = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"]
    expected += [f"blocks.{i}.{k}" for i in range(2) for k in TIMM_KEYS_BLOCK]
    expected += ["norm.weight", "norm.bias", "head.weight", "head.bias"]
    assert sorted(state) == sorted(expected)
    shapes = {k: v.shape for k, v in state.items()}
    assert shapes["cls_token"] == (1, 1, 8)
    assert shapes["pos_embed"] == (1, 5, 8)
    assert shapes["patch_embed.proj.weight"] == (8, 2, 4, 4)  # Conv2d (D, C, P, P)
    assert shapes["blocks.0.attn.qkv.weight"] == (24, 8)  # (3D, D): q, k, v stacked
    assert shapes["blocks.1.mlp.fc1.weight"] == (16, 8)  # (out, in)
    assert shapes["head.weight"] == (3, 8)
    assert all(isinstance(v, np.ndarray) for v in state.values())
    mean_pooled = ViT(**{**TINY, "pool": "mean"}).state_dict()
    assert "fc_norm.weight" in mean_pooled and "norm.weight" not in mean_pooled


def test_qkv_rows_are_q_then_k_then_v():
    model = jitter(ViT(**TINY))
    attn = model.blocks[0].attn
    x = randn(1, 5, 8)
    qkv = B.to_host(attn.qkv.forward(x))
    w = model.state_dict()["blocks.0.attn.qkv.weight"]
    b = model.state_dict()["blocks.0.attn.qkv.bias"]
    q = B.to_host(x)[0] @ w[:8].T + b[:8]
    np.testing.assert_allclose(qkv[0, :, :8], q, rtol=1e-6, atol=1e-6)


def test_state_dict_round_trip_and_save_load(tmp_path):
    model = jitter(ViT(**TINY))
    other = ViT(**TINY, seed=9)
    other.load_state_dict(model.state_dict())
    x = randn(2, 2, 8, 8).astype(np.float32)
    np.testing.assert_array_equal(B.to_host(other.forward(x)), B.to_host(model.forward(x)))
    path = tmp_path / "model.npz"
    save_model(model, path)
    loaded = load_model(path)
    assert loaded.config == model.config
    np.testing.assert_array_equal(B.to_host(loaded.forward(x)), B.to_host(model.forward(x)))


def test_load_state_dict_names_every_problem():
    model = ViT(**TINY)
    state = model.state_dict()
    del state["head.bias"]
    state["head.extra"] = np.zeros(3)
    state["pos_embed"] = np.zeros((1, 17, 8))
    before = B.to_host(model.cls_token.data).copy()
    state["cls_token"] = np.ones((1, 1, 8))
    with pytest.raises(ValueError) as error:
        model.load_state_dict(state)
    message = str(error.value)
    assert "missing key: head.bias" in message
    assert "unexpected key: head.extra" in message
    assert "wrong shape: pos_embed: expected (1, 5, 8), got (1, 17, 8)" in message
    np.testing.assert_array_equal(B.to_host(model.cls_token.data), before)  # nothing copied


def test_grads_use_state_dict_keys():
    model = jitter(ViT(**TINY))
    logits = model.forward(randn(2, 2, 8, 8).astype(np.float32))
    model.backward(B.xp.ones_like(logits))
    grads, state = model.grads(), model.state_dict()
    assert list(grads) == list(state)
    assert all(grads[k].shape == state[k].shape for k in state)
    assert float(np.abs(grads["patch_embed.proj.weight"]).max()) > 0


@pytest.mark.parametrize(
    "make_input, message",
    [
        (lambda: np.zeros((2, 8, 8), np.float32),
         r"^ViT: expected input \(B, 2, 8, 8\), got shape \(2, 8, 8\)$"),
        (lambda: np.zeros((2, 3, 8, 8), np.float32),
         r"^ViT: expected input \(B, 2, 8, 8\), got shape \(2, 3, 8, 8\)$"),
        (lambda: np.zeros((2, 2, 12, 12), np.float32),
         r"^ViT: expected input \(B, 2, 8, 8\), got shape \(2, 2, 12, 12\)$"),
        (lambda: np.zeros((2, 2, 8, 8), np.uint8),
         "^ViT: expected a float array, got dtype uint8$"),
        (lambda: [[0.0]], r"^ViT: expected an array of images \(B, 2, 8, 8\), got list$"),
        (lambda: SimpleNamespace(shape=(2, 2, 8, 8), dtype="float32"),  # as a torch.Tensor
         r"^ViT: expected an array of images \(B, 2, 8, 8\), got types.SimpleNamespace$"),
    ],
)
def test_bad_images_get_clear_errors(make_input, message):
    with pytest.raises(ValueError, match=message):
        ViT(**TINY).forward(make_input())


@pytest.mark.parametrize("fast", [False, True])
def test_backward_before_a_training_forward_is_an_error_naming_the_model(fast):
    """Before any forward, or after one in eval mode: the ViT says so, not a layer inside."""
    model = ViT(**TINY)
    if fast:
        accelerate(model)
    with pytest.raises(RuntimeError, match="ViT.backward called without a forward before it"):
        model.backward(np.zeros((1, 3), np.float32))
    logits = model.eval().forward(np.zeros((2, 2, 8, 8), np.float32))
    with pytest.raises(RuntimeError, match="^ViT.backward called without a forward before it "
                                           r"\(.* an eval-mode forward keeps nothing"):
        model.backward(np.ones_like(logits))


def test_a_gradient_that_is_not_an_array_is_named():
    model = ViT(**TINY)
    model.forward(np.zeros((2, 2, 8, 8), np.float32))
    for dlogits, got in (([[1.0] * 3] * 2, "list"), (1.0, "float")):
        with pytest.raises(ValueError, match=r"^ViT.backward: expected dlogits, an array of the "
                                             rf"logits' shape \(2, 3\), got {got}$"):
            model.backward(dlogits)


def test_a_gradient_of_another_shape_than_the_logits_is_named_and_the_forward_kept():
    model = ViT(**TINY)
    model.train()
    x = np.zeros((2, 2, 8, 8), np.float32)
    logits = model.forward(x)
    with pytest.raises(ValueError, match=r"^ViT.backward: expected dlogits of the logits' "
                                         r"shape \(2, 3\), got \(2, 4\)$"):
        model.backward(np.zeros((2, 4), np.float32))
    dx = model.backward(np.ones_like(logits))  # the forward's cache is still there
    assert dx.shape == x.shape


@pytest.mark.parametrize("pool", ["cls", "mean"])
@pytest.mark.parametrize("batch", [1, 2])
def test_whole_model_gradients(backend, tier, pool, batch):
    model = tier(jitter(ViT(**{**TINY, "pool": pool})))
    report = gradient_check(model, randn(batch, 2, 8, 8))
    report.assert_ok(TOL)
    assert len(report.checks) == 1 + len(model.parameters())


def test_cls_pooling_computes_the_last_block_for_the_class_token_only(backend, tier):
    """Under cls pooling the last block is a ClassAttentionBlock (none is under mean
    pooling), and the logits and every gradient are those of a model whose last
    block computes every token, as timm's does."""
    model = tier(jitter(ViT(**TINY)))
    assert [type(b).__name__ for b in model.blocks] == ["Block", "ClassAttentionBlock"]
    assert [type(b).__name__ for b in ViT(**TINY, pool="mean").blocks] == ["Block", "Block"]
    full = ViT(**TINY)
    c = full.config
    full.blocks[-1] = Block(c.embed_dim, c.num_heads, c.mlp_ratio)
    full.load_state_dict(model.state_dict())
    tier(full)
    x, dlogits = randn(2, 2, 8, 8), randn(2, 3, seed=1)

    def logits_and_gradients(vit):
        logits = B.to_host(vit.forward(x))
        vit.zero_grad()
        dx = B.to_host(vit.backward(dlogits))
        return [logits, dx] + [B.to_host(p.grad).copy() for p in vit.parameters()]

    for a, b in zip(logits_and_gradients(model), logits_and_gradients(full), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_pre_logits_layer_names_and_gradients(backend):
    """representation_size R adds tanh(Linear(D, R)) before a (K, R) head."""
    model = jitter(ViT(**TINY, representation_size=5))
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    assert shapes["pre_logits.fc.weight"] == (5, 8) and shapes["head.weight"] == (3, 5)
    gradient_check(model, randn(2, 2, 8, 8)).assert_ok(TOL)


def test_whole_model_gradients_other_shape(backend):
    """7 tokens (6 patches + cls), 3 heads, non-square patch grid impossible, so
    image 12 with patch 4 (9 patches, 10 tokens), odd embed_dim per head."""
    config = dict(image_size=12, patch_size=4, in_channels=1, num_classes=4, embed_dim=9, depth=1,
                  num_heads=3, mlp_ratio=1.5)
    model = jitter(ViT(**config))
    gradient_check(model, randn(2, 1, 12, 12)).assert_ok(TOL)


def test_whole_model_gradients_with_dropout(backend):
    model = jitter(ViT(**TINY, dropout=0.1, attn_dropout=0.1))
    model.train()
    x = randn(2, 2, 8, 8)
    gradient_check(model, x, before_forward=lambda: model.seed_dropout(123)).assert_ok(TOL)


def test_dropout_changes_training_output_not_eval_output():
    model = ViT(**TINY, dropout=0.2, attn_dropout=0.2)
    x = randn(2, 2, 8, 8).astype(np.float32)
    train_a, train_b = B.to_host(model.forward(x)), B.to_host(model.forward(x))
    assert not np.array_equal(train_a, train_b)
    model.eval()
    np.testing.assert_array_equal(B.to_host(model.forward(x)), B.to_host(model.forward(x)))


def test_flat_parameters_are_views():
    model = ViT(**TINY)
    data, grad, decay = model.flat_parameters()
    assert data.size == model.num_parameters()
    data[:] = 0.5
    assert float(model.head.weight.data[0, 0]) == 0.5
    model.head.weight.grad[...] = 2.0
    assert float(grad.sum()) == 2.0 * model.head.weight.data.size
    # decay applies to Linear weights only
    expected = sum(p.data.size for p in model.parameters() if p.decay)
    assert float(decay.sum()) == expected
    assert not model.cls_token.decay and not model.pos_embed.decay and not model.norm.weight.decay
