"""Tests for tinyvit.data.augment: every test runs on NumPy, and on CuPy with a GPU.

Images are drawn in [0.05, 1], so a 0 in an output can only come from padding or
erasing, and every pixel of one image differs from the same pixel of another.
Checks run on the host, with plain slicing and loops over images.
"""

import math

import numpy as np
import pytest

from tinyvit import backend as B
from tinyvit.data import augment as A


def images(shape, dtype="float64", seed=0):
    """Random images in [0.05, 1] on the active backend (same values on both backends)."""
    x = np.random.default_rng(seed).uniform(0.05, 1.0, size=shape).astype(dtype)
    return B.to_device(x)


def labels(values):
    return B.to_device(np.asarray(values, dtype=np.int64))


def host(a):
    return B.to_host(a)


# Every augmentation as f(x, seed) -> tuple of outputs, for the shared checks: the
# images' augmentations draw from a generator on the backend, the mixing from one on
# the host.
NUM_CLASSES = 10
AUGMENTATIONS = {
    "random_crop": lambda x, seed: (A.random_crop(x, 2, B.rng(seed)),),
    "horizontal_flip": lambda x, seed: (A.horizontal_flip(x, B.rng(seed)),),
    "random_erasing": lambda x, seed: (A.random_erasing(x, B.rng(seed), p=0.5),),
    "mixup": lambda x, seed: A.mixup(x, labels(np.arange(len(x)) % NUM_CLASSES), NUM_CLASSES,
                                     B.host_rng(seed)),
    "cutmix": lambda x, seed: A.cutmix(x, labels(np.arange(len(x)) % NUM_CLASSES), NUM_CLASSES,
                                       B.host_rng(seed)),
    "pipeline": lambda x, seed: (A.pipeline(max_shift=2, flip=True, erasing=0.25)(x, B.rng(seed)),),
}


# ---------------------------------------------------------------------------
# Shared contract: shape, dtype, range, determinism, input untouched.


@pytest.mark.parametrize("name", list(AUGMENTATIONS))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shape_dtype_and_range_are_kept(backend, name, dtype):
    x = images((16, 3, 12, 12), dtype)
    out = AUGMENTATIONS[name](x, 0)
    x_out = host(out[0])
    assert x_out.shape == x.shape
    assert x_out.dtype == np.dtype(dtype)
    assert x_out.min() >= 0.0 and x_out.max() <= 1.0
    if len(out) == 2:  # mixup / cutmix targets
        targets = host(out[1])
        assert targets.shape == (16, NUM_CLASSES)
        assert targets.dtype == np.dtype(dtype)


@pytest.mark.parametrize("name", list(AUGMENTATIONS))
def test_input_is_not_modified(backend, name):
    x = images((16, 3, 12, 12))
    x_before = host(x).copy()
    AUGMENTATIONS[name](x, 0)
    np.testing.assert_array_equal(host(x), x_before)


@pytest.mark.parametrize("name", list(AUGMENTATIONS))
def test_same_seed_same_output_other_seed_other_output(backend, name):
    x = images((16, 3, 12, 12))
    first = AUGMENTATIONS[name](x, 7)
    again = AUGMENTATIONS[name](x, 7)
    other = AUGMENTATIONS[name](x, 8)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(host(a), host(b))
    assert not np.array_equal(host(first[0]), host(other[0]))


@pytest.mark.parametrize(
    "call",
    [
        lambda x: A.random_crop(x, 2, B.rng(0)),
        lambda x: A.horizontal_flip(x, B.rng(0)),
        lambda x: A.random_erasing(x, B.rng(0)),
        lambda x: A.mixup(x, labels([0, 1]), 2, B.host_rng(0)),
    ],
)
def test_rejects_images_that_are_not_BCHW(backend, call):
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        call(images((2, 12, 12)))


# ---------------------------------------------------------------------------
# random_crop


def shifted(img, sy, sx):
    """img (C, H, W) moved down by sy and right by sx, zeros where it uncovers."""
    _, H, W = img.shape
    out = np.zeros_like(img)
    out[:, max(sy, 0) : H + min(sy, 0), max(sx, 0) : W + min(sx, 0)] = img[
        :, max(-sy, 0) : H - max(sy, 0), max(-sx, 0) : W - max(sx, 0)
    ]
    return out


def recover_shifts(x, out, padding):
    """For each image, the one shift (sy, sx) within +-padding that turns x into out."""
    found = []
    for img, img_out in zip(x, out):
        matches = [
            (sy, sx)
            for sy in range(-padding, padding + 1)
            for sx in range(-padding, padding + 1)
            if np.array_equal(shifted(img, sy, sx), img_out)
        ]
        assert len(matches) == 1, f"image is not one shift of the input: matches {matches}"
        found.append(matches[0])
    return found


def test_random_crop_with_no_padding_is_the_identity(backend):
    x = images((8, 3, 10, 10))
    np.testing.assert_array_equal(host(A.random_crop(x, 0, B.rng(0))), host(x))


def test_random_crop_shifts_each_image_independently(backend):
    padding = 3
    x = images((32, 2, 9, 11))
    out = A.random_crop(x, padding, B.rng(1))
    shifts = recover_shifts(host(x), host(out), padding)
    assert len(set(shifts)) > 10  # offsets drawn per image, not one per batch


def test_random_crop_reaches_every_shift_within_padding(backend):
    padding = 2
    x = images((500, 1, 6, 6))
    out = A.random_crop(x, padding, B.rng(2))
    shifts = set(recover_shifts(host(x), host(out), padding))
    every = {(sy, sx) for sy in range(-2, 3) for sx in range(-2, 3)}
    assert shifts == every


def test_random_crop_rejects_negative_padding(backend):
    with pytest.raises(ValueError, match="padding"):
        A.random_crop(images((2, 1, 4, 4)), -1, B.rng(0))


# ---------------------------------------------------------------------------
# horizontal_flip


def test_flip_with_p1_mirrors_every_image_and_p0_none(backend):
    x = images((8, 3, 5, 7))
    np.testing.assert_array_equal(host(A.horizontal_flip(x, B.rng(0), p=1.0)), host(x)[..., ::-1])
    np.testing.assert_array_equal(host(A.horizontal_flip(x, B.rng(0), p=0.0)), host(x))


def test_flip_decides_per_image(backend):
    x = host(images((64, 3, 5, 7)))
    out = host(A.horizontal_flip(B.to_device(x), B.rng(3), p=0.5))
    flipped = [np.array_equal(o, i[..., ::-1]) for i, o in zip(x, out)]
    kept = [np.array_equal(o, i) for i, o in zip(x, out)]
    assert all(f != k for f, k in zip(flipped, kept))  # each image exactly one of the two
    assert 16 < sum(flipped) < 48


# ---------------------------------------------------------------------------
# random_erasing


def erased_boxes(x, out, value=0.0):
    """Check each output is its input with one rectangle set to value (all channels);
    return the boxes (top, left, h, w), None where nothing was erased."""
    boxes = []
    for img, img_out in zip(x, out):
        changed = img_out != img  # (C, H, W)
        mask = changed[0]
        assert all(np.array_equal(c, mask) for c in changed), "channels erased differently"
        assert np.all(img_out[:, mask] == value)
        if not mask.any():
            boxes.append(None)
            continue
        rows, cols = np.nonzero(mask.any(axis=1))[0], np.nonzero(mask.any(axis=0))[0]
        top, left = rows[0], cols[0]
        h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
        assert mask.sum() == h * w, "erased pixels are not one rectangle"
        boxes.append((top, left, h, w))
    return boxes


def test_erasing_with_p0_is_the_identity(backend):
    x = images((8, 3, 10, 10))
    np.testing.assert_array_equal(host(A.random_erasing(x, B.rng(0), p=0.0)), host(x))


def test_erasing_with_p1_blanks_one_rectangle_per_image(backend):
    H = W = 32
    x = images((200, 3, H, W))
    boxes = erased_boxes(host(x), host(A.random_erasing(x, B.rng(4), p=1.0)))
    assert all(box is not None for box in boxes)
    # Upper bound on the area: h and w are rounded (+0.5 each) from sqrt(a*r) and
    # sqrt(a/r), and clipping only shrinks them, so h*w <= a + 0.5*sqrt(a)*(sqrt(r)
    # + 1/sqrt(r)) + 0.25 with a <= 0.33*H*W and r in [0.3, 3.3].
    a = 0.33 * H * W
    slack = 0.5 * math.sqrt(a) * (math.sqrt(3.3) + 1 / math.sqrt(0.3)) + 0.25
    fractions = [h * w / (H * W) for _, _, h, w in boxes]
    assert max(fractions) <= (a + slack) / (H * W)
    assert min(fractions) < 0.05 and max(fractions) > 0.25  # the scale range is used


def test_erasing_square_sides_follow_the_scale_range(backend):
    # ratio (1, 1): a square of side round(sqrt(s*H*W)) for s in scale, so the
    # side lies in [round(sqrt(0.02)*20), round(sqrt(0.33)*20)] = [3, 11].
    x = images((300, 1, 20, 20))
    out = A.random_erasing(x, B.rng(5), p=1.0, ratio=(1.0, 1.0))
    boxes = erased_boxes(host(x), host(out))
    assert all(h == w for _, _, h, w in boxes)
    assert {h for _, _, h, _ in boxes} == set(range(3, 12))


@pytest.mark.parametrize(
    "scale, ratio, H, W, h, w",
    [
        # s*H*W = 40 px, r = 2: h = round(sqrt(80)) = 9, w = round(sqrt(20)) = 4
        (0.1, 2.0, 20, 20, 9, 4),
        # s*H*W = 60 px, r = 3: h = round(sqrt(180)) = 13 clipped to H = 10, w = round(sqrt(20)) = 4
        (0.3, 3.0, 10, 20, 10, 4),
    ],
)
def test_erasing_rectangle_size_and_positions(backend, scale, ratio, H, W, h, w):
    x = images((2000, 1, H, W))
    out = A.random_erasing(
        x, B.rng(6), p=1.0, scale=(scale, scale), ratio=(ratio, ratio), value=0.5
    )
    boxes = erased_boxes(host(x), host(out), value=0.5)
    assert {(bh, bw) for _, _, bh, bw in boxes} == {(h, w)}
    assert {top for top, _, _, _ in boxes} == set(range(H - h + 1))  # every row that fits
    assert {left for _, left, _, _ in boxes} == set(range(W - w + 1))


def test_erasing_decides_per_image(backend):
    x = images((100, 3, 10, 10))
    boxes = erased_boxes(host(x), host(A.random_erasing(x, B.rng(7), p=0.25)))
    assert 10 < sum(box is not None for box in boxes) < 40


# ---------------------------------------------------------------------------
# one_hot, the Beta draw, mixup, cutmix


def test_one_hot(backend):
    y = labels([2, 0, 3, 2])
    got = host(A.one_hot(y, 4, "float32"))
    expected = np.array([[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    assert host(A.one_hot(y, 4)).dtype == np.float64  # the backend fixture's default
    outside = host(A.one_hot(labels([1, 3, -1]), 3))  # 3 and -1 are no class of 3
    assert np.array_equal(outside[0], [0, 1, 0]) and np.isnan(outside[1:]).all()


@pytest.mark.parametrize(
    "alpha, cdf",
    [
        (0.5, lambda t: 2 / np.pi * np.arcsin(np.sqrt(t))),  # arcsine law
        (1.0, lambda t: t),  # uniform
        (2.0, lambda t: 3 * t**2 - 2 * t**3),
    ],
)
def test_beta_draws_follow_beta_alpha_alpha(backend, alpha, cdf):
    rng = B.host_rng(11)
    draws = [A._beta(rng, alpha) for _ in range(2000)]
    assert all(type(d) is float for d in draws)
    draws = np.sort(draws)
    assert 0.0 < draws[0] and draws[-1] < 1.0
    # Kolmogorov-Smirnov statistic against the exact CDF; 1.95/sqrt(n) is the 0.1% level
    n = len(draws)
    ks = max(np.max(np.arange(1, n + 1) / n - cdf(draws)), np.max(cdf(draws) - np.arange(n) / n))
    assert ks < 1.95 / math.sqrt(n)


def test_a_large_beta_alpha_draws_at_once_with_the_right_spread():
    """Jöhnk's algorithm accepts almost no try at alpha 50: NumPy's sampler takes over,
    and the draws have Beta(50, 50)'s mean 1/2 and standard deviation 1/sqrt(4 (2a + 1))."""
    rng = B.host_rng(11)
    draws = np.array([A._beta(rng, 50.0) for _ in range(2000)])
    assert abs(draws.mean() - 0.5) < 0.005
    assert abs(draws.std() / (1 / math.sqrt(4 * 101)) - 1) < 0.1


def mixing_weights(targets, y):
    """From soft targets with distinct labels y: lam and each sample's partner index."""
    lams, partners = [], []
    for i, row in enumerate(targets):
        nonzero = np.nonzero(row)[0]
        assert len(nonzero) == 2 and y[i] in nonzero, f"row {i} does not mix two labels: {row}"
        partner_label = nonzero[nonzero != y[i]][0]
        lams.append(row[y[i]])
        partners.append(int(np.nonzero(y == partner_label)[0][0]))
    return np.array(lams), partners


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_mixup_blends_images_like_the_targets(backend, dtype):
    Bn, K = 8, 12
    x = images((Bn, 3, 6, 6), dtype)
    y = np.arange(Bn)  # distinct labels: the targets tell who was mixed with whom
    x_mixed, targets = A.mixup(x, labels(y), K, B.host_rng(0))
    x, x_mixed, targets = host(x), host(x_mixed), host(targets)
    eps = np.finfo(dtype).eps
    np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=0, atol=4 * eps)
    lams, partners = mixing_weights(targets, y)
    assert np.all(lams == lams[0]) and 0.0 < lams[0] < 1.0  # one lambda per batch
    assert all(j != i for i, j in enumerate(partners))
    for i, j in enumerate(partners):
        np.testing.assert_allclose(
            x_mixed[i], lams[0] * x[i] + (1 - lams[0]) * x[j], rtol=0, atol=8 * eps
        )


def test_mixing_a_label_with_itself_gives_a_one_hot_row(backend):
    x = images((4, 1, 5, 5))
    for mix in (A.mixup, A.cutmix):
        _, targets = mix(x, labels([3, 3, 3, 3]), 5, B.host_rng(0))
        np.testing.assert_allclose(host(targets), host(A.one_hot(labels([3] * 4), 5)), atol=1e-15)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cutmix_pastes_a_box_covering_one_minus_lambda(backend, dtype):
    Bn, K, H, W = 6, 6, 16, 12
    y = np.arange(Bn)
    eps = np.finfo(dtype).eps
    strictly_mixed = 0
    for seed in range(10):
        x = images((Bn, 3, H, W), dtype, seed=seed)
        x_mixed, targets = A.cutmix(x, labels(y), K, B.host_rng(seed))
        x, x_mixed, targets = host(x), host(x_mixed), host(targets)
        np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=0, atol=4 * eps)
        lam = targets[0, y[0]]
        assert 0.0 <= lam <= 1.0
        if lam == 1.0:  # the box was empty: nothing pasted
            np.testing.assert_array_equal(x_mixed, x)
            continue
        strictly_mixed += 1
        lams, partners = mixing_weights(targets, y)
        assert np.all(lams == lam)
        pasted = [np.all(x_mixed[i] == x[j], axis=0) for i, j in enumerate(partners)]  # (H, W)
        kept = [np.all(x_mixed[i] == x[i], axis=0) for i in range(Bn)]
        for p, k in zip(pasted, kept):
            assert np.all(p ^ k)  # each pixel comes from one image or the other
            assert np.array_equal(p, pasted[0])  # one box for the whole batch
            rows, cols = np.nonzero(p.any(axis=1))[0], np.nonzero(p.any(axis=0))[0]
            box_area = (rows[-1] - rows[0] + 1) * (cols[-1] - cols[0] + 1)
            assert p.sum() == box_area  # one rectangle
            np.testing.assert_allclose(p.mean(), 1 - lam, rtol=0, atol=4 * eps)
    assert strictly_mixed >= 5


def test_mixing_rejects_mismatched_labels(backend):
    with pytest.raises(ValueError, match=r"\(B,\) = \(4,\)"):
        A.mixup(images((4, 1, 5, 5)), labels([0, 1, 2]), 3, B.host_rng(0))


# ---------------------------------------------------------------------------
# Pipelines


def test_pipeline_is_a_random_crop_for_digits(backend):
    x = images((16, 1, 8, 8))
    np.testing.assert_array_equal(
        host(A.pipeline(max_shift=2)(x, B.rng(0))), host(A.random_crop(x, 2, B.rng(0)))
    )


def test_pipeline_applies_crop_flip_erasing_in_order(backend):
    x = images((16, 3, 8, 8))
    rng = B.rng(0)
    expected = A.random_erasing(A.horizontal_flip(A.random_crop(x, 4, rng), rng), rng, p=0.25)
    got = A.pipeline(max_shift=4, flip=True, erasing=0.25)(x, B.rng(0))
    np.testing.assert_array_equal(host(got), host(expected))
    crop_only = A.pipeline(max_shift=3)(x, B.rng(1))
    np.testing.assert_array_equal(host(crop_only), host(A.random_crop(x, 3, B.rng(1))))
    assert A.pipeline() is None


def test_compose_applies_functions_left_to_right(backend):
    x = images((2, 1, 3, 3))
    pipeline = A.Compose(lambda x, rng: x + 1.0, lambda x, rng: 2.0 * x)
    np.testing.assert_array_equal(host(pipeline(x, B.rng(0))), 2.0 * (host(x) + 1.0))
