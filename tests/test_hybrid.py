"""The hybrid ViT: a convolutional stem whose feature map becomes the tokens.
Its config and sizes, gradient checks of the whole model on both tiers and with
both norms, state dicts with the stem's names and BatchNorm's running averages,
its summary's FLOPs, the worker processes' running averages, and its pictures.
"""

import numpy as np
import pytest

import tinyvit
from conftest import jitter, randn
from tinyvit import backend as B
from tinyvit.gradcheck import gradient_check
from tinyvit.models import ViT, ViTConfig
from tinyvit.models.config import stem_output_size
from tinyvit.models.hybrid import ConvStem, HybridEmbed
from tinyvit.models.summary import flops_per_image
from tinyvit.train.parallel import DataParallel
from tinyvit.weights import load_model, save_model

TOL = 1e-7
TINY = dict(image_size=12, patch_size=1, in_channels=2, num_classes=3, embed_dim=8, depth=2,
            num_heads=2, stem=((8, 3, 2), (8, 3, 1)))


def test_stem_output_size_follows_the_convolution_arithmetic():
    assert stem_output_size(28, [(32, 3, 2), (64, 3, 2)], False) == 7
    assert stem_output_size(32, [(64, 3, 1)], True) == 16  # the pool halves it
    assert stem_output_size(15, [(8, 5, 2)], False) == 8  # floor((15 + 4 - 5) / 2) + 1
    assert stem_output_size(28, [(8, 1, 1)], False) == 28


def test_config_of_a_hybrid():
    c = ViTConfig(**TINY)
    assert (c.feature_size, c.num_patches, c.token_size) == (6, 36, 2.0)
    loaded = ViTConfig(**{**TINY, "stem": [[8, 3, 2], [8, 3, 1]]})  # as JSON gives it back
    assert loaded == c and loaded.stem == ((8, 3, 2), (8, 3, 1))


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(stem=((8, 3),)), r"stem must hold \(channels, kernel, stride\) triples"),
        (dict(stem=((8, 0, 1),)), r"stem must hold \(channels, kernel, stride\) triples"),
        (dict(stem_norm="layer"), "stem_norm must be one of"),
        (dict(patch_size=4), "the stem's feature map 6 is not divisible by patch_size 4"),
    ],
)
def test_config_errors(fields, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{**TINY, **fields})


@pytest.mark.parametrize("norm, pool, head_pool",
                         [("batch", False, "cls"), ("group", True, "mean")])
def test_whole_hybrid_gradients(backend, tier, norm, pool, head_pool):
    """Input and every parameter, stem included, to the 1e-7 bar; BatchNorm in
    training mode normalizes by the batch's statistics, which the check perturbs too."""
    small = dict(TINY, depth=1, stem=((4, 3, 2), (4, 3, 1)))
    model = tier(jitter(ViT(**small, stem_norm=norm, stem_pool=pool, pool=head_pool), scale=0.1))
    report = gradient_check(model, randn(2, 2, 12, 12, seed=5))
    report.assert_ok(TOL)
    assert "patch_embed.backbone.conv1.weight" in [c.name for c in report.checks]


def test_state_dict_names_and_running_averages(tmp_path):
    model = ViT(**TINY)
    state = model.state_dict()
    assert state["patch_embed.backbone.conv1.weight"].shape == (8, 2, 3, 3)
    assert state["patch_embed.backbone.norm2.running_var"].shape == (8,)
    assert state["patch_embed.proj.weight"].shape == (8, 8, 1, 1)
    assert "patch_embed.backbone.conv1.bias" not in state  # the norm's beta takes its place
    model.forward(randn(4, 2, 12, 12).astype(np.float32))  # training: the averages move
    moved = model.state_dict()["patch_embed.backbone.norm1.running_mean"]
    assert np.abs(moved).max() > 0
    save_model(model, tmp_path / "hybrid.npz")
    loaded = load_model(tmp_path / "hybrid.npz")
    assert loaded.config == model.config
    np.testing.assert_array_equal(loaded.state_dict()["patch_embed.backbone.norm1.running_mean"],
                                  moved)
    x = randn(3, 2, 12, 12).astype(np.float32)
    np.testing.assert_array_equal(B.to_host(loaded.eval().forward(x)),
                                  B.to_host(model.eval().forward(x)))
    assert set(model.grads()) == set(state) - {k for k in state if "running" in k}


def test_eval_mode_uses_the_running_averages(backend):
    model = jitter(ViT(**TINY), scale=0.1)
    x = randn(4, 2, 12, 12)
    model.eval()
    one = B.to_host(model.forward(x[:1]))
    np.testing.assert_allclose(B.to_host(model.forward(x))[:1], one, rtol=1e-12, atol=1e-14)


def test_summary_counts_the_stem():
    """28x28x1, convs 1->4 3x3/2 and 4->8 3x3/2: 14x14 and 7x7; patch 1: 49 tokens."""
    model = tinyvit.create_model("mnist", stem=((4, 3, 2), (8, 3, 2)), patch_size=1, depth=1)
    text = model.summary(print_fn=lambda _: None)
    rows = {line.split("  ")[0]: line.split() for line in text.splitlines()}
    assert rows["patch_embed.backbone.conv1 (Conv2d 3x3/2)"][-1] == f"{2 * 1 * 9 * 4 * 14 * 14:,}"
    assert rows["patch_embed.backbone.conv2 (Conv2d 3x3/2)"][-1] == f"{2 * 4 * 9 * 8 * 7 * 7:,}"
    assert rows["patch_embed.proj (Conv2d as Linear)"][-1] == f"{2 * 49 * 8 * 64:,}"
    assert "patch_size 1 of its 7x7 feature map, 49 patches + 1 class token" in text
    convs = 2 * 9 * 4 * 14 * 14 + 2 * 4 * 9 * 8 * 49
    # one ClassAttentionBlock: qkv over 50 tokens, the rest for the class token alone
    block = 2 * 50 * 64 * 192 + 4 * 50 * 64 + 2 * 64 * 64 + 2 * 2 * 64 * 128
    assert flops_per_image(model) == convs + 2 * 49 * 8 * 64 + block + 2 * 64 * 10


def test_hybrid_embed_is_the_stem_then_patches(backend):
    stem = jitter(ConvStem(2, [(4, 3, 2)], rng=B.host_rng(0)))
    embed = jitter(HybridEmbed(ConvStem(2, [(4, 3, 2)], rng=B.host_rng(0)), 2, 6,
                               rng=B.host_rng(1)))
    embed.backbone = stem
    x = randn(2, 2, 8, 8)
    tokens = B.to_host(embed.forward(x))
    assert tokens.shape == (2, 4, 6)  # a 4x4 feature map in 2x2 patches
    np.testing.assert_allclose(tokens, B.to_host(embed.proj.forward(
        embed.patchify.forward(stem.forward(x)))), rtol=1e-14)


def test_workers_keep_the_mean_of_their_running_averages():
    """Two workers each normalize their half of the batch; the parent's running
    averages become the mean of the two halves' updates."""
    model = ViT(**TINY, seed=3)
    reference = ViT(**TINY, seed=3)
    x = randn(6, 2, 12, 12).astype(np.float32)
    targets = np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1, 2]]
    with DataParallel(model, workers=2, max_batch=6) as parallel:
        parallel.gradients(x, targets)
    halves = []
    for rows in (slice(0, 3), slice(3, 6)):
        copy = ViT(**TINY, seed=3)
        copy.forward(x[rows])
        halves.append(copy.state_dict()["patch_embed.backbone.norm1.running_mean"])
    np.testing.assert_allclose(model.state_dict()["patch_embed.backbone.norm1.running_mean"],
                               (halves[0] + halves[1]) / 2, rtol=1e-5, atol=1e-7)
    assert not np.array_equal(model.state_dict()["patch_embed.backbone.norm1.running_mean"],
                              reference.state_dict()["patch_embed.backbone.norm1.running_mean"])


def test_pictures_of_a_hybrid(tmp_path):
    from tinyvit.viz import inspection

    model = ViT(image_size=28, patch_size=1, in_channels=1, num_classes=10, embed_dim=16,
                depth=2, num_heads=2, stem=((8, 3, 2), (8, 3, 2)))
    x = randn(3, 1, 28, 28).astype(np.float32)
    paths = inspection.write_pictures(model, tmp_path, x, x)
    assert [p.name for p in paths] == list(inspection.PICTURES)
    components, ratios = inspection.patch_embed_components(model, k=5)
    assert components.shape == (5, 1, 3, 3)  # the stem's first 3x3 filters
    distance = inspection.mean_attention_distance(model, x)
    assert distance.shape == (2, 2) and (distance <= 28 * 2**0.5).all()


def test_a_hybrid_file_loads_back_and_is_not_exported_to_timm(tmp_path):
    pytest.importorskip("safetensors")
    from tinyvit.weights import load_pretrained, save_pretrained

    model = jitter(ViT(**TINY), scale=0.1)
    model.forward(randn(4, 2, 12, 12).astype(np.float32))  # running averages off their start
    save_model(model, tmp_path / "hybrid.npz")
    loaded = load_pretrained(tmp_path / "hybrid.npz", num_classes=5)  # a new head
    state, source = loaded.state_dict(), model.state_dict()
    assert state["head.weight"].shape == (5, 8)
    for key in source:
        if not key.startswith("head."):
            np.testing.assert_array_equal(state[key], source[key], err_msg=key)
    with pytest.raises(ValueError, match="a hybrid's convolutional stem has no counterpart"):
        save_pretrained(model, tmp_path / "model.safetensors")
