"""Tests for the inspection pictures (tinyvit/viz/inspection.py, ``python -m tinyvit.inspect``)
and the position-embedding resize (tinyvit/nn/resample.py, tinyvit/weights/adapt.py).

Known cases with exact answers: uniform attention rolls out to (1 - 2^-L)/N on
every patch and attention on oneself to 0; the mean attention distance of
uniform attention is the mean pairwise patch distance (computed here by loops)
and of attention on oneself 0; the position similarity has a unit diagonal;
principal components are orthonormal; an unchanged grid resizes to exactly the
same embeddings. Then the pictures, and the command line on a tiny trained model.
"""

import itertools
import math
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import jitter, stripe_images, tiny_config
from tinyvit import backend as B
from tinyvit import inspect
from tinyvit.gradcheck import gradient_check
from tinyvit.models import ViT
from tinyvit.nn.resample import interpolation_matrix, resize_pos_embed
from tinyvit.train import fit
from tinyvit.viz import inspection
from tinyvit.weights import resize_image

SMALL = dict(image_size=28, patch_size=7, embed_dim=16, depth=2, num_heads=2)  # G = 4, N = 17


def small_model(**changes):
    return ViT(**{**SMALL, **changes})


def images(n, size=28, seed=0):
    return B.to_device(B.host_rng(seed).standard_normal((n, 1, size, size)))


def uniform_maps(layers, batch, heads, tokens):
    """Every query attends to every token equally: A = 1/N."""
    return [B.xp.full((batch, heads, tokens, tokens), 1.0 / tokens) for _ in range(layers)]


def identity_maps(layers, batch, heads, tokens):
    """Every token attends only to itself: A = I."""
    eye = B.xp.eye(tokens)
    return [B.xp.broadcast_to(eye, (batch, heads, tokens, tokens)).copy() for _ in range(layers)]


def check_png(path, min_size):
    """An RGB PNG at least ``min_size`` (width, height), with more than a few colours."""
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "RGB"
        assert image.width >= min_size[0] and image.height >= min_size[1], image.size
        colors = image.getcolors(maxcolors=1 << 20)
    assert len(colors) > 20, f"{path} looks blank: {len(colors)} colours"


# ---------------------------------------------------------------- patch-embedding PCA


def test_patch_embed_components_are_orthonormal_principal_axes(backend):
    model = small_model()
    components, ratios = inspection.patch_embed_components(model, k=28)
    assert components.shape == (16, 1, 7, 7)  # k capped at min(D, C*P*P) = 16
    flat = components.reshape(16, -1)
    np.testing.assert_allclose(flat @ flat.T, np.eye(16), atol=1e-12)
    assert np.all(np.diff(ratios) <= 0) and np.all(ratios >= 0)
    assert ratios.sum() == pytest.approx(1.0, abs=1e-12)  # all 16 kept: all the variance
    # independently: the first component is the covariance's top eigenvector
    weight = B.to_host(model.patch_embed.proj.weight.data)
    centered = weight - weight.mean(axis=0)
    values, vectors = np.linalg.eigh(centered.T @ centered)
    assert abs(vectors[:, -1] @ flat[0]) == pytest.approx(1.0, abs=1e-10)
    assert ratios[0] == pytest.approx(values[-1] / values.sum(), rel=1e-10)
    # sign convention: the largest-magnitude entry is positive
    assert np.all(flat[np.arange(16), np.abs(flat).argmax(axis=1)] > 0)


def test_patch_embed_components_k_and_errors():
    components, ratios = inspection.patch_embed_components(small_model(), k=3)
    assert components.shape == (3, 1, 7, 7) and ratios.shape == (3,)
    with pytest.raises(ValueError, match="k must be at least 1, got 0"):
        inspection.patch_embed_components(small_model(), k=0)


# ---------------------------------------------------------------- position similarity


def test_pos_embed_similarity_has_unit_diagonal_and_is_symmetric(backend):
    sim = inspection.pos_embed_similarity(small_model())
    assert sim.shape == (4, 4, 4, 4)
    flat = sim.reshape(16, 16)
    np.testing.assert_allclose(np.diag(flat), 1.0, atol=1e-6)
    assert flat.min() >= -1.0 and flat.max() <= 1.0
    np.testing.assert_allclose(flat, flat.T, atol=1e-12)


def test_pos_embed_similarity_known_angles(backend):
    """Embeddings (cos t, sin t, 0, ...) with t = 0.1 * patch index: similarity cos(t_i - t_j)."""
    model = small_model()
    t = 0.1 * np.arange(16)
    pe = np.zeros((1, 17, 16))
    pe[0, 0] = 7.0  # the class token is left out
    pe[0, 1:, 0], pe[0, 1:, 1] = 3 * np.cos(t), 3 * np.sin(t)
    model.pos_embed.data[...] = B.to_device(pe)
    sim = inspection.pos_embed_similarity(model)
    np.testing.assert_allclose(sim.reshape(16, 16), np.cos(t[:, None] - t[None, :]), atol=1e-12)
    # patch (0,1) is 1, (2,3) is 11
    assert sim[0, 1, 2, 3] == pytest.approx(math.cos(0.1 * (1 - 11)))


# ---------------------------------------------------------------- attention rollout


def test_rollout_of_uniform_attention_is_uniform(backend):
    """A = J/N is a projection P, so (0.5 P + 0.5 I)^L = P + 2^-L (I - P), whose
    class-token row over the patches is (1 - 2^-L) / N everywhere. A patch row is
    that plus 2^-L on its own patch, so their mean adds 2^-L / 16 (16 patches)."""
    for L in (1, 3):
        rollout = inspection.attention_rollout(uniform_maps(L, 2, 3, 17))
        assert rollout.shape == (2, 4, 4)
        np.testing.assert_allclose(rollout, (1 - 2.0**-L) / 17, rtol=1e-12)
        mean_pooled = inspection.attention_rollout(uniform_maps(L, 2, 3, 17), pool="mean")
        np.testing.assert_allclose(mean_pooled, (1 - 2.0**-L) / 17 + 2.0**-L / 16, rtol=1e-12)


def test_rollout_of_identity_attention_stays_on_each_token(backend):
    """A = I: the class token keeps to itself (0 on every patch); the mean of the
    patch tokens takes 1/16 of every patch."""
    rollout = inspection.attention_rollout(identity_maps(3, 2, 2, 17))
    np.testing.assert_array_equal(rollout, np.zeros((2, 4, 4)))
    mean_pooled = inspection.attention_rollout(identity_maps(3, 2, 2, 17), pool="mean")
    np.testing.assert_array_equal(mean_pooled, np.full((2, 4, 4), 1 / 16))


def test_rollout_averages_heads_and_orders_layers(backend):
    """N = 5 (2x2 patches). One layer, two heads: the class token looks at patch 1
    in head 1 and at patch 4 in head 2, so mean = [0, .5, 0, 0, .5] and
    0.5 mean + 0.5 e0 gives patches [.25, 0, 0, .25].

    Two layers: layer 1 sends patch 1 to patch 2, layer 2 sends the class token to
    patch 1 (identity elsewhere). R = Â2 Â1 has class row 0.5 e0 + 0.5 (0.5 e1 + 0.5 e2)
    = [.5, .25, .25, 0, 0]; the wrong order Â1 Â2 would give [.5, .5, 0, 0, 0].
    """
    xp = B.xp
    heads = xp.broadcast_to(xp.eye(5), (1, 2, 5, 5)).copy()
    heads[0, 0, 0] = xp.asarray([0, 1, 0, 0, 0.0])
    heads[0, 1, 0] = xp.asarray([0, 0, 0, 0, 1.0])
    np.testing.assert_array_equal(inspection.attention_rollout([heads]), [[[0.25, 0], [0, 0.25]]])

    layer1 = xp.eye(5)[None, None].copy()
    layer1[0, 0, 1] = xp.asarray([0, 0, 1, 0, 0.0])
    layer2 = xp.eye(5)[None, None].copy()
    layer2[0, 0, 0] = xp.asarray([0, 1, 0, 0, 0.0])
    np.testing.assert_array_equal(inspection.attention_rollout([layer1, layer2]),
                                  [[[0.25, 0.25], [0, 0]]])


def test_last_layer_attention_reads_the_class_row(backend):
    model = small_model()
    with pytest.raises(RuntimeError, match="run model.forward"):
        inspection.last_layer_attention(model)
    model.forward(images(3))
    with pytest.raises(RuntimeError, match="call model.keep_attention"):
        inspection.last_layer_attention(model)  # that forward kept none
    model.keep_attention().forward(images(3))
    heads = inspection.last_layer_attention(model)
    assert heads.shape == (3, 2, 4, 4)
    attn = B.to_host(model.attention_maps()[-1])
    np.testing.assert_array_equal(heads[1, 0, 2], attn[1, 0, 0, 9:13])  # grid row 2 = patches 8..11
    np.testing.assert_allclose(heads.sum(axis=(2, 3)), 1 - attn[:, :, 0, 0], atol=1e-12)


def test_last_layer_attention_of_a_mean_pooled_model_averages_the_patch_rows(backend):
    model = small_model(pool="mean").keep_attention()
    model.forward(images(3))
    heads = inspection.last_layer_attention(model)
    attn = B.to_host(model.attention_maps()[-1])
    np.testing.assert_allclose(heads[2, 1, 0], attn[2, 1, 1:, 1:5].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(heads.sum(axis=(2, 3)), 1 - attn[:, :, 1:, 0].mean(axis=2),
                               atol=1e-12)


# ---------------------------------------------------------------- attention distance


def mean_pairwise_distance(grid, patch_size):
    """The average over all ordered pairs of patches (self-pairs included) of the
    distance between their centres, by explicit loops."""
    cells = list(itertools.product(range(grid), range(grid)))
    total = sum(math.dist(a, b) for a in cells for b in cells)
    return patch_size * total / len(cells) ** 2


def test_attention_distance_known_cases(backend):
    uniform = inspection.attention_distance(uniform_maps(2, 3, 2, 17), patch_size=7)
    assert uniform.shape == (2, 2)
    np.testing.assert_allclose(uniform, mean_pairwise_distance(4, 7), rtol=1e-12)
    identity = inspection.attention_distance(identity_maps(2, 3, 2, 17), patch_size=7)
    np.testing.assert_array_equal(identity, np.zeros((2, 2)))


def test_attention_distance_leaves_out_the_class_token(backend):
    """90% on the class token, the rest uniform over patches: after renormalizing the
    patch part it is uniform attention. Each patch attending to its right neighbour
    (itself in the last column): distance 7 for 3 of 4 columns, 5.25 on average."""
    xp = B.xp
    a = xp.full((1, 1, 17, 17), 0.1 / 16)
    a[..., 0] = 0.9
    expected = [[mean_pairwise_distance(4, 7)]]
    np.testing.assert_allclose(inspection.attention_distance([a], 7), expected, rtol=1e-12)
    right = xp.zeros((1, 1, 17, 17))
    right[0, 0, 0, 0] = 1.0
    for i in range(16):
        target = i + 1 if i % 4 < 3 else i
        right[0, 0, 1 + i, 1 + target] = 1.0
    np.testing.assert_allclose(inspection.attention_distance([right], 7), [[5.25]], rtol=1e-12)


def test_mean_attention_distance_runs_the_model_in_batches(backend):
    model = small_model()
    x = images(5)
    distances = inspection.mean_attention_distance(model, x, batch_size=2)  # batches of 2, 2, 1
    # modes restored
    assert distances.shape == (2, 2) and model.training and not model.keeps_attention
    with pytest.raises(RuntimeError, match="call model.keep_attention"):
        model.attention_maps()
    model.keep_attention()
    inspection.mean_attention_distance(model, x, batch_size=2)
    assert model.keeps_attention
    model.eval().keep_attention().forward(x)
    expected = inspection.attention_distance(model.attention_maps(), 7)
    np.testing.assert_allclose(distances, expected, rtol=1e-12)
    assert np.all((distances > 0) & (distances < 7 * math.hypot(3, 3)))


# ---------------------------------------------------------------- resizing position embeddings


def test_interpolation_matrix_hand_computed():
    """2 -> 4 samples: output coordinates x = -0.25, 0.25, 0.75, 1.25. At x = 0.25
    (t = 1/4) the taps -1, 0, 1, 2 weigh w(1.25) = -0.10546875, w(0.25) = 0.87890625,
    w(0.75) = 0.26171875, w(1.75) = -0.03515625 (a = -0.75); clamping folds taps
    -1 and 2 onto the edges. Dyadic fractions, so exactly representable."""
    expected = [[1.10546875, -0.10546875], [0.7734375, 0.2265625],
                [0.2265625, 0.7734375], [-0.10546875, 1.10546875]]
    np.testing.assert_array_equal(B.to_host(interpolation_matrix(2, 4, "cubic")), expected)
    for old, new in ((7, 7), (3, 5), (9, 4)):
        W = B.to_host(interpolation_matrix(old, new, "cubic"))
        np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(B.to_host(interpolation_matrix(7, 7, "cubic")), np.eye(7))


def test_resize_pos_embed_unchanged_grid_is_exact(backend):
    for dtype in (np.float32, np.float64):
        pe = B.to_device(B.host_rng(0).standard_normal((1, 17, 8)).astype(dtype))
        out = resize_pos_embed(pe, 4, 4)
        assert out.dtype == dtype
        np.testing.assert_array_equal(B.to_host(out), B.to_host(pe))


def test_resize_pos_embed_shapes_and_class_row(backend):
    pe = B.to_device(B.host_rng(1).standard_normal((1, 17, 8)))
    out = resize_pos_embed(pe, 4, 6)
    assert out.shape == (1, 37, 8)
    np.testing.assert_array_equal(B.to_host(out[0, 0]), B.to_host(pe[0, 0]))
    assert resize_pos_embed(pe, 4, (2, 3)).shape == (1, 7, 8)
    # a constant grid stays constant (every interpolation row sums to 1)
    const = B.xp.ones((1, 17, 8))
    np.testing.assert_allclose(B.to_host(resize_pos_embed(const, 4, 9)), 1.0, atol=1e-12)
    expected = r"expected pos_embed of shape \(1, 1 \+ 5\*5, D\) = \(1, 26, D\).*got \(1, 17, 8\)"
    with pytest.raises(ValueError, match=expected):
        resize_pos_embed(pe, 5, 6)


@pytest.mark.parametrize("old, new", [(4, 7), (7, 4), ((4, 3), (6, 5)), (3, 3)])
def test_resize_pos_embed_matches_torch(old, new):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    gh, gw = (old, old) if isinstance(old, int) else old
    nh, nw = (new, new) if isinstance(new, int) else new
    pe = np.random.default_rng(2).standard_normal((1, 1 + gh * gw, 5))
    grid = torch.from_numpy(pe[:, 1:].reshape(1, gh, gw, 5)).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    ref = F.interpolate(grid, size=(nh, nw), mode="bicubic", align_corners=False)
    ref = ref.permute(0, 2, 3, 1).reshape(1, nh * nw, 5).numpy()
    out = resize_pos_embed(pe, old, new)
    np.testing.assert_allclose(out[:, 1:], ref, atol=1e-13)


def test_resized_model_runs_and_keeps_its_weights(backend):
    model = small_model()
    resized = resize_image(model, 42)
    assert resized.config.image_size == 42 and resized.pos_embed.shape == (1, 37, 16)
    assert B.to_host(resized.forward(images(2, size=42))).shape == (2, 10)
    old, new = model.state_dict(), resized.state_dict()
    for key in old:
        if key != "pos_embed":
            np.testing.assert_array_equal(new[key], old[key], err_msg=key)
    np.testing.assert_array_equal(new["pos_embed"][0, 0], old["pos_embed"][0, 0])
    same = resize_image(model, 28)
    np.testing.assert_array_equal(same.state_dict()["pos_embed"], old["pos_embed"])
    np.testing.assert_array_equal(B.to_host(same.forward(images(2))),
                                  B.to_host(model.forward(images(2))))
    with pytest.raises(ValueError, match="image_size 30 is not divisible by patch_size 7"):
        resize_image(model, 30)


def test_resized_model_gradients_check(backend):
    """8x8 images with 4x4 patches (2x2 grid) resized to 12x12 (3x3 grid)."""
    model = jitter(ViT(image_size=8, patch_size=4, in_channels=1, num_classes=3, embed_dim=4,
                       depth=1, num_heads=2, mlp_ratio=1.0), scale=0.1)
    resized = resize_image(model, 12)
    assert resized.pos_embed.data.dtype == np.float64
    gradient_check(resized, images(1, size=12)).assert_ok(1e-7)


# ---------------------------------------------------------------- pictures


def test_pictures_are_readable_pngs(tmp_path):
    model = small_model()
    x = images(3).astype(np.float32)
    paths = inspection.write_pictures(model, tmp_path, x, x, class_names=list("0123456789"))
    assert [p.name for p in paths] == list(inspection.PICTURES)
    filters, similarity, distance, maps = paths
    check_png(filters, (7 * 84, 3 * 84))  # 16 tiles of 84 px, 7 to a row
    check_png(similarity, (4 * 72, 4 * 72))  # 4x4 tiles of 72 px
    check_png(distance, (2 * 520, 400))  # two panels
    check_png(maps, ((2 + 2) * 112, 3 * 112))  # input, rollout, 2 heads per image


# ---------------------------------------------------------------- command line


@pytest.fixture
def checkpoint(stripes, tmp_path):
    fit(tiny_config(stripes, tmp_path / "run", epochs=1))
    return tmp_path / "run" / "best.npz"


def digit_file(path, label=3):
    Image.fromarray(stripe_images([label], seed=5)[0]).resize((56, 56)).save(path)
    return path


def test_cli_writes_every_picture(checkpoint, stripes, tmp_path, capsys):  # noqa: F811
    picture = digit_file(tmp_path / "three.png")
    out = tmp_path / "pictures"
    args = [str(checkpoint), "--image", str(picture), "--data-dir", str(stripes), "--out", str(out),
            "--num-images", "40"]
    assert inspect.main(args) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [str(out / name) for name in inspection.PICTURES]
    for name in inspection.PICTURES:
        check_png(out / name, (300, 150))
    with Image.open(out / "attention_maps.png") as image:
        assert image.height < 2 * 160  # one row: the one image given

    # no --image: the first test images, into <checkpoint folder>/inspect
    assert inspect.main([str(checkpoint.parent), "--data-dir", str(stripes),
                         "--num-maps", "3"]) == 0
    with Image.open(checkpoint.parent / "inspect" / "attention_maps.png") as image:
        assert image.height > 3 * 112


def test_cli_without_the_dataset_uses_the_images_given(checkpoint, tmp_path, capsys):
    picture = digit_file(tmp_path / "three.png")
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [str(checkpoint), "--image", str(picture), "--data-dir", str(empty),
            "--out", str(tmp_path / "o")]
    assert inspect.main(args) == 0
    assert "note: mnist test set not available" in capsys.readouterr().out
    assert (tmp_path / "o" / "attention_distance.png").is_file()
    with pytest.raises(SystemExit, match="no images to look at: give --image FILE or --data-dir"):
        inspect.main([str(checkpoint), "--data-dir", str(empty)])


def test_cli_errors_are_clear(checkpoint, tmp_path):
    with pytest.raises(SystemExit, match="no such checkpoint file: .*missing.npz"):
        inspect.main([str(tmp_path / "missing.npz")])
    not_image = tmp_path / "notes.png"
    not_image.write_text("hello")
    with pytest.raises(SystemExit, match="cannot read image .*notes.png"):
        inspect.main([str(checkpoint), "--image", str(not_image)])


def test_cli_reports_a_bad_tinyvit_backend_in_one_line(checkpoint, monkeypatch, capsys):
    monkeypatch.setenv("TINYVIT_BACKEND", "abc")
    with pytest.raises(SystemExit):
        inspect.main([str(checkpoint)])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m tinyvit.inspect: error: TINYVIT_BACKEND: expected numpy or cupy (in any "
        "case), got 'abc'")


def test_cli_reports_a_missing_cupy_in_one_line(checkpoint, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError, GPU or not
    with pytest.raises(SystemExit, match=r"^inspect: backend 'cupy' needs CuPy: install it with"):
        inspect.main([str(checkpoint), "--backend", "cupy"])
