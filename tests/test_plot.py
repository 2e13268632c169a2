"""tinyvit.viz's figures (canvas, charts, matrices, images): every figure is a non-blank RGB
PNG; colours, ticks and upscaling are exact."""

import doctest

import numpy as np
import pytest
from PIL import Image

from tinyvit.viz import canvas, charts, images, matrices
from tinyvit.viz.canvas import (
    CMAPS,
    LABEL,
    MARGIN,
    MAX_LABEL_W,
    NAN_COLOR,
    PALETTE,
    _format_ticks,
    colormap,
    nice_ticks,
)
from tinyvit.viz.charts import Panel, Series, line_chart, whole_steps
from tinyvit.viz.images import image_grid, overlay, save_panels
from tinyvit.viz.matrices import heatmap, heatmap_grid

FASHION = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
VIRIDIS, COOLWARM = CMAPS["viridis"], CMAPS["coolwarm"]


def load(path):
    """The PNG at ``path`` as an (H, W, 3) uint8 array, checked to be RGB and not blank."""
    with Image.open(path) as img:
        assert img.format == "PNG" and img.mode == "RGB"
        pixels = np.asarray(img)
    assert pixels.var() > 0
    return pixels


def count(pixels, rgb):
    """How many pixels have exactly the colour ``rgb``."""
    return int(np.all(pixels == np.asarray(rgb, dtype=np.uint8), axis=-1).sum())


def centre_of(pixels, rgb):
    """(row, col) median of the pixels of colour ``rgb``: the centre of a cell of that colour."""
    rows, cols = np.nonzero(np.all(pixels == np.asarray(rgb, dtype=np.uint8), axis=-1))
    return int(np.median(rows)), int(np.median(cols))


def cmap_position(rgb, name="viridis"):
    """Where on [0, 1] the colormap ``name`` comes nearest to ``rgb``."""
    t = np.linspace(0, 1, 1001)
    table = colormap(t, 0, 1, name).astype(int)
    return t[np.argmin(np.abs(table - np.asarray(rgb, dtype=int)).sum(axis=1))]


def test_docstring_examples():
    assert all(doctest.testmod(m).failed == 0 for m in (canvas, charts, images, matrices))


# ---------------------------------------------------------------- colormap

@pytest.mark.parametrize("name", ["viridis", "coolwarm"])
def test_colormap_hits_every_anchor_exactly(name):
    anchors = CMAPS[name]
    values = np.linspace(-1, 3, len(anchors))
    np.testing.assert_array_equal(colormap(values, -1, 3, name), anchors.astype(np.uint8))


@pytest.mark.parametrize("name", ["viridis", "coolwarm"])
def test_colormap_clips_outside_the_range(name):
    out = colormap([-7.0, -np.inf, 1e9, np.inf], 0, 1, name)
    anchors = CMAPS[name].astype(np.uint8)
    np.testing.assert_array_equal(out, [anchors[0], anchors[0], anchors[-1], anchors[-1]])


def test_colormap_interpolates_between_anchors():
    out = colormap([0.05, 0.125], 0, 1)  # halfway between anchors 0 and 1; a quarter past 1
    np.testing.assert_array_equal(out, [np.rint((VIRIDIS[0] + VIRIDIS[1]) / 2),
                                        np.rint(0.75 * VIRIDIS[1] + 0.25 * VIRIDIS[2])])


def test_colormap_keeps_shape_and_marks_nan():
    out = colormap(np.array([[0.0, np.nan, 1.0], [0.5, 0.5, np.nan]]))
    assert out.shape == (2, 3, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[0, 1], NAN_COLOR)
    np.testing.assert_array_equal(out[1, 2], NAN_COLOR)
    np.testing.assert_array_equal(out[0, 0], VIRIDIS[0])
    np.testing.assert_array_equal(out[1, 0], VIRIDIS[5])


def test_colormap_of_constant_values_is_the_middle_colour():
    np.testing.assert_array_equal(colormap(np.full(4, 3.0)), np.tile(VIRIDIS[5], (4, 1)))
    np.testing.assert_array_equal(colormap([0.0], name="coolwarm"), [COOLWARM[4]])


def test_colormap_rejects_bad_arguments():
    with pytest.raises(ValueError, match="viridis"):
        colormap([0.0], name="jet")
    with pytest.raises(ValueError, match="vmin=2 vmax=1"):
        colormap([0.0], 2, 1)


# ---------------------------------------------------------------- ticks

@pytest.mark.parametrize("lo, hi, expected", [
    (0, 0.93, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]),
    (1, 10, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
    (-1, 1, [-1.0, -0.5, 0.0, 0.5, 1.0]),
    (0.85, 0.93, [0.84, 0.86, 0.88, 0.9, 0.92, 0.94]),
    (0, 4690, [0.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0]),
    (2.5, 2.5, [2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8]),
    (0, 0, [-1.0, -0.5, 0.0, 0.5, 1.0]),
])
def test_nice_ticks(lo, hi, expected):
    assert nice_ticks(lo, hi) == expected


def test_nice_ticks_cover_the_range_in_round_steps():
    rng = np.random.default_rng(0)
    for lo, hi in np.sort(rng.normal(scale=10.0 ** rng.integers(-4, 5, (200, 1)), size=(200, 2))):
        ticks = nice_ticks(lo, hi)
        steps = np.diff(ticks)
        mantissa = steps[0] / 10.0 ** np.floor(np.log10(steps[0]))
        assert ticks[0] <= lo and ticks[-1] >= hi and 3 <= len(ticks) <= 11
        np.testing.assert_allclose(steps, steps[0], rtol=1e-9)
        assert min(abs(mantissa - m) for m in (1, 2, 5, 10)) < 1e-9


def test_nice_ticks_reject_nan_and_reversed_ranges():
    with pytest.raises(ValueError):
        nice_ticks(0, np.nan)
    with pytest.raises(ValueError):
        nice_ticks(1, 0)


def test_tick_labels_use_the_decimals_of_the_step():
    assert _format_ticks([-1.0, -0.5, 0.0, 0.5]) == ["-1.0", "-0.5", "0.0", "0.5"]
    assert _format_ticks([0.84, 0.86]) == ["0.84", "0.86"]
    assert _format_ticks([0.0, 1000.0]) == ["0", "1000"]


# ---------------------------------------------------------------- line charts

def curves():
    epochs = np.arange(1, 11)
    loss = 2.3 * np.exp(-epochs / 3) + 0.25
    return [
        Panel("loss", "epoch", "cross-entropy",
                [Series("train", epochs, loss), Series("test", epochs, loss + 0.05)]),
        Panel("accuracy", "epoch", "accuracy",
                [Series("train", epochs, 1 - loss / 3),
                 Series("test", epochs, 0.97 - loss / 3)]),
    ]


@pytest.mark.parametrize("xs, ticks", [
    ([1, 2, 3], [1.0, 2.0, 3.0]),  # nice_ticks gives 1.5 and 2.5 between: no epoch is there
    ([1], [0.0, 1.0, 2.0]),
    ([1, 18], [0.0, 5.0, 10.0, 15.0, 20.0]),  # a step of 1 or more already
    ([0.5, 1.5], [0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6]),  # not whole numbers: as they were
])
def test_ticks_of_whole_numbers_are_whole_steps_apart(xs, ticks):
    values = np.array(xs, dtype=float)
    assert whole_steps(nice_ticks(values.min(), values.max()), [values]) == ticks


def test_line_chart_draws_panels_side_by_side(tmp_path):
    path = line_chart(curves(), tmp_path / "curves.png", title="training", panel_size=(400, 300))
    pixels = load(path)
    assert path == tmp_path / "curves.png"
    assert pixels.shape[1] == 2 * 400 + 2 * MARGIN and pixels.shape[0] > 300 + 2 * MARGIN
    assert count(pixels, PALETTE[0]) > 500 and count(pixels, PALETTE[1]) > 500


def test_line_chart_skips_nan_and_none_points(tmp_path):
    def chart(xs, ys, name):
        return load(line_chart(Panel("t", "x", "y", [Series("s", xs, ys, style="both")]),
                                 tmp_path / name))

    gappy = chart([0, 1, 2, 3, 4], [1.0, np.nan, 3.0, None, 2.0], "gappy.png")
    clean = chart([0, 2, 4], [1.0, 3.0, 2.0], "clean.png")
    np.testing.assert_array_equal(gappy, clean)


def test_line_chart_draws_a_single_point_as_a_marker(tmp_path):
    panel = Panel("one epoch", "epoch", "loss", [Series("train", [1], [0.7])])
    assert count(load(line_chart(panel, tmp_path / "one.png")), PALETTE[0]) >= 20


def test_line_chart_constant_series_is_a_flat_line(tmp_path):
    panel = Panel("flat", "step", "value", [Series("c", [0, 1, 2, 3], [0.5] * 4)])
    rows, _ = np.nonzero(np.all(load(line_chart(panel, tmp_path / "flat.png")) == PALETTE[0],
                                axis=-1))
    assert rows.size > 300 and rows.max() - rows.min() <= 2


def test_line_chart_styles(tmp_path):
    def drawn(style):
        series = [Series("s", [0, 10], [0, 10], style=style, color=(200, 0, 0))]
        return count(load(line_chart(Panel("t", "x", "y", series), tmp_path / f"{style}.png")),
                     (200, 0, 0))

    markers, line, both = drawn("markers"), drawn("line"), drawn("both")
    assert 40 <= markers <= 100  # two markers of radius 3.5, no line
    assert line > 500 and both > line


def test_series_checks_its_arguments():
    with pytest.raises(ValueError, match="equally long"):
        Series("s", [1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="style"):
        Series("s", [1], [1], style="dots")


# ---------------------------------------------------------------- heatmaps

def test_heatmap_cell_colours_follow_values(tmp_path):
    m = np.array([[0.1, 0.4], [0.7, 0.9]])
    pixels = load(heatmap(m, tmp_path / "m.png", "m", "col", "row",
                            annotate=False, vmin=0, vmax=1))
    centres = {}
    for (i, j), v in np.ndenumerate(m):
        colour = colormap(v, 0, 1)
        assert count(pixels, colour) >= 64 * 64  # a whole cell of that colour
        centres[i, j] = centre_of(pixels, colour)
        assert abs(cmap_position(pixels[centres[i, j]]) - v) < 0.01
    (r00, c00), (r01, c01), (r10, c10) = centres[0, 0], centres[0, 1], centres[1, 0]
    assert c01 - c00 >= 64 and abs(r01 - r00) <= 1  # row 0 runs left to right
    assert r10 - r00 >= 64 and abs(c10 - c00) <= 1  # column 0 runs top to bottom


def test_heatmap_writes_numbers_in_contrasting_colours(tmp_path):
    m = np.array([[0, 100]])
    plain = load(heatmap(m, tmp_path / "plain.png", annotate=False))
    dark, light = centre_of(plain, VIRIDIS[0]), centre_of(plain, VIRIDIS[-1])

    def whitish(pixels, centre):  # near-white pixels around a cell centre (neither cell is)
        box = pixels[centre[0] - 10:centre[0] + 10, centre[1] - 15:centre[1] + 15]
        return int((box.min(axis=-1) > 160).sum())

    def blackish(pixels, centre):  # near-black pixels around a cell centre (the yellow cell is not)
        box = pixels[centre[0] - 10:centre[0] + 10, centre[1] - 15:centre[1] + 15]
        return int((box.max(axis=-1) < 100).sum())

    numbers = load(heatmap(m, tmp_path / "numbers.png"))
    assert whitish(plain, dark) == whitish(plain, light) == blackish(plain, light) == 0
    assert whitish(numbers, dark) > 5  # "0" in white on dark purple
    assert blackish(numbers, light) > 5 and whitish(numbers, light) == 0  # "100" in ink on yellow


def test_confusion_matrix_with_long_class_names(tmp_path):
    cm = np.random.default_rng(0).integers(0, 50, (10, 10)) + np.diag(np.full(10, 900))
    pixels = load(heatmap(cm, tmp_path / "cm.png", "confusion matrix", "predicted", "true",
                            FASHION, FASHION))
    assert pixels.shape[0] >= 10 * 48 and pixels.shape[1] >= 10 * 48
    long_names = [name * 20 for name in FASHION]
    wide = load(heatmap(cm, tmp_path / "long.png", "confusion matrix", "predicted", "true",
                          long_names, long_names))
    assert wide.shape[1] <= pixels.shape[1] + MAX_LABEL_W
    assert wide.shape[0] <= pixels.shape[0] + MAX_LABEL_W


def test_heatmap_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="2-D"):
        heatmap(np.zeros(3), tmp_path / "x.png")
    with pytest.raises(ValueError, match="needs 3 names, got 2"):
        heatmap(np.zeros((3, 3)), tmp_path / "x.png", xticklabels=["a", "b"])


def test_heatmap_grid_of_position_similarities(tmp_path):
    emb = np.random.default_rng(0).normal(size=(49, 16))
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    sim = (emb @ emb.T).reshape(7, 7, 7, 7)  # sim[r, c, r, c] = 1
    pixels = load(heatmap_grid(sim, tmp_path / "pos.png", "position embedding similarity",
                                 row_labels=range(1, 8), col_labels=range(1, 8),
                                 row_title="input patch row", col_title="input patch column",
                                 cmap="coolwarm", vmin=-1, vmax=1))
    tile = 7 * 7  # 7x7 maps upscaled 7 times
    assert pixels.shape[0] >= 7 * tile and pixels.shape[1] >= 7 * tile
    # each map's own patch: one cell of similarity 1
    assert count(pixels, COOLWARM[-1]) >= 49 * tile


def test_heatmap_grid_of_flat_maps_with_titles(tmp_path):
    maps = np.arange(6, dtype=float)[:, None, None] * np.ones((6, 4, 4))
    pixels = load(heatmap_grid(maps, tmp_path / "g.png", cols=3,
                                 cell_titles=[f"head {h}" for h in range(6)]))
    for v in range(6):
        # a whole 4x4 map upscaled 12 times
        assert count(pixels, colormap(v, 0, 5)) >= 12 * 12 * 4


def test_heatmap_grid_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="cell_titles: expected 4, got 3"):
        heatmap_grid(np.zeros((4, 3, 3)), tmp_path / "g.png", cell_titles=["a", "b", "c"])
    with pytest.raises(ValueError, match="cols=3"):
        heatmap_grid(np.zeros((2, 2, 3, 3)), tmp_path / "g.png", cols=3)
    with pytest.raises(ValueError, match="got shape"):
        heatmap_grid(np.zeros((3, 3)), tmp_path / "g.png")


# ---------------------------------------------------------------- images

def test_image_grid_upscales_uint8_tiles_with_nearest_neighbour(tmp_path):
    red = np.zeros((3, 3, 3), dtype=np.uint8)
    red[..., 0] = 255
    dot = np.zeros_like(red)
    dot[1, 1, 0] = 255
    pixels = load(image_grid([red, red, dot], tmp_path / "grid.png", scale=5))
    assert count(pixels, (255, 0, 0)) == (9 + 9 + 1) * 25


def test_image_grid_scales_float_tiles_each_to_its_own_range(tmp_path):
    ramp = np.array([[0.0, 1.0], [1.0, 1.0]]) * 0.3 + 5  # min -> black, max -> white
    flat = np.full((2, 2), 2.0)  # constant -> middle grey
    pixels = load(image_grid([ramp, flat], tmp_path / "grid.png", scale=10))
    assert count(pixels, (0, 0, 0)) == 100
    assert count(pixels, (128, 128, 128)) == 400


def test_image_grid_of_filters_with_captions(tmp_path):
    filters = np.random.default_rng(0).normal(size=(28, 7, 7))
    pixels = load(image_grid(filters, tmp_path / "filters.png", "filters", cols=7,
                               tile_titles=[f"PC {k + 1}" for k in range(28)]))
    assert pixels.shape[1] >= 7 * 70 and pixels.shape[0] >= 4 * 70  # default scale: 7 px -> 70 px


def test_image_grid_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="one shape"):
        image_grid([np.zeros((3, 3)), np.zeros((4, 4))], tmp_path / "g.png")
    with pytest.raises(ValueError, match=r"\(h, w\) or \(h, w, 3\)"):
        image_grid([np.zeros((3, 3, 2))], tmp_path / "g.png")
    with pytest.raises(ValueError, match="tile_titles: expected 1, got 2"):
        image_grid([np.zeros((3, 3))], tmp_path / "g.png", tile_titles=["a", "b"])


def test_overlay_with_alpha_zero_is_the_image():
    image = np.linspace(-1, 1, 28 * 28).reshape(28, 28)
    out = overlay(image, np.random.default_rng(0).random((7, 7)), alpha=0.0)
    gray = np.rint((image + 1) / 2 * 255).astype(np.uint8)
    assert out.shape == (28, 28, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, np.stack([gray] * 3, axis=-1))


def test_overlay_with_alpha_one_is_the_upsampled_heat():
    heat = np.tile(np.arange(7.0), (7, 1))  # rising left to right
    out = overlay(np.zeros((28, 28, 3), dtype=np.uint8), heat, alpha=1.0)
    # clamped edges
    np.testing.assert_array_equal(out[:, :2], np.broadcast_to(VIRIDIS[0], (28, 2, 3)))
    np.testing.assert_array_equal(out[:, -2:], np.broadcast_to(VIRIDIS[-1], (28, 2, 3)))
    np.testing.assert_array_equal(out, out[:1].repeat(28, axis=0))  # no change down a column
    positions = [cmap_position(rgb) for rgb in out[0]]
    assert np.all(np.diff(positions) >= 0) and len(set(positions)) > 7  # smooth, not 7 blocks


def test_overlay_blends():
    out = overlay(np.full((4, 4), 255, dtype=np.uint8), np.zeros((2, 2)), alpha=0.5)
    np.testing.assert_array_equal(out, np.broadcast_to(np.rint((255 + VIRIDIS[5]) / 2), (4, 4, 3)))


def test_save_panels_upscales_small_images(tmp_path):
    red = np.zeros((28, 28, 3), dtype=np.uint8)
    red[..., 0] = 255
    gray = np.random.default_rng(0).random((28, 28))
    pixels = load(save_panels([gray, red, overlay(gray, np.eye(7))], tmp_path / "p.png",
                                "attention", ["input", "red", "rollout"]))
    assert count(pixels, (255, 0, 0)) == 196 * 196
    assert pixels.shape[0] > 196 + LABEL and pixels.shape[1] >= 3 * 196
    with pytest.raises(ValueError, match="captions: expected 2, got 1"):
        save_panels([red, red], tmp_path / "p.png", captions=["one"])


def test_save_creates_the_folder_and_leaves_no_temporary_file(tmp_path):
    path = image_grid([np.eye(3)], tmp_path / "a" / "b" / "eye.png")
    assert path == tmp_path / "a" / "b" / "eye.png"
    assert sorted(p.name for p in path.parent.iterdir()) == ["eye.png"]
    load(path)
