"""The pictures ``--predict`` reads: every way of saving a digit (bit depth, palette,
transparency, polarity) gives the model the same input as the 8-bit light-on-dark
original, and what is not a readable image is refused in one line.

The digit is MNIST's first test image (a 7) when the official files are present,
else a drawn 7.
"""

import numpy as np
import pytest
from PIL import Image

import train_mnist
from conftest import REAL_DATA, stripe_images, tiny_config
from tinyvit import backend as B
from tinyvit.data import DatasetError, dataset_info, load_image, read_image
from tinyvit.data.readers import read_idx
from tinyvit.train import fit

SIZE = 84  # the picture as saved: 3x MNIST's 28, so that reading it resizes it


@pytest.fixture(scope="module")
def digit():
    """(84, 84) uint8, light strokes on black: MNIST's first test digit, enlarged."""
    path = REAL_DATA / "mnist" / "t10k-images-idx3-ubyte.gz"
    if path.is_file():
        image = read_idx(path, 2051)[0]
    else:  # a 7: a bar and a diagonal, blurred edges
        image = np.zeros((28, 28), np.uint8)
        image[6:9, 6:22] = 255
        for row in range(8, 23):
            image[row, 20 - (row - 8) // 2: 23 - (row - 8) // 2] = 255
    return np.asarray(Image.fromarray(image).resize((SIZE, SIZE), Image.BILINEAR))


def pixels(path, dataset="mnist", image_size=28):
    """``load_image``'s batch un-normalized: (C, H, W) in [0, 1] on the host."""
    info = dataset_info(dataset)
    x = B.to_host(load_image(path, dataset, image_size))[0]
    return x * np.reshape(info.std, (-1, 1, 1)) + np.reshape(info.mean, (-1, 1, 1))


def rgba(color, alpha):
    """(h, w, 4) uint8 from a color (h, w, 3) or (3,) and an alpha (h, w)."""
    out = np.zeros(alpha.shape + (4,), np.uint8)
    out[..., :3], out[..., 3] = color, alpha
    return out


def palette_with_transparent_black(d):
    image = Image.fromarray(d).convert("P")
    image.info["transparency"] = int(np.asarray(image)[0, 0])  # the background's index
    return image


FORMS = {  # name: (picture from the light-on-dark digit d, file suffix)
    "8-bit light on dark": (lambda d: Image.fromarray(d), "png"),
    "8-bit dark on light": (lambda d: Image.fromarray(255 - d), "png"),
    "16-bit dark on light": (lambda d: Image.fromarray((255 - d).astype(np.uint16) * 257), "png"),
    "16-bit light on dark": (lambda d: Image.fromarray(d.astype(np.uint16) * 257), "png"),
    "16-bit big-endian TIFF": (
        lambda d: Image.fromarray((255 - d).astype(">u2") * 257), "tif"),
    "32-bit integer TIFF": (lambda d: Image.fromarray((255 - d).astype(np.int32) * 257), "tif"),
    "float TIFF in [0, 1]": (lambda d: Image.fromarray(d.astype(np.float32) / 255), "tif"),
    "float TIFF in [0, 255]": (lambda d: Image.fromarray(255 - d.astype(np.float32)), "tif"),
    "RGB dark on light": (lambda d: Image.fromarray(255 - d).convert("RGB"), "png"),
    "RGB light on dark BMP": (lambda d: Image.fromarray(d).convert("RGB"), "bmp"),
    "palette": (lambda d: Image.fromarray(255 - d).convert("P"), "png"),
    "palette, black transparent": (palette_with_transparent_black, "png"),
    "GIF, black transparent": (palette_with_transparent_black, "gif"),
    "RGBA black strokes on transparent": (lambda d: Image.fromarray(rgba(0, d)), "png"),
    "RGBA black strokes, white hidden": (
        lambda d: Image.fromarray(rgba(np.where(d[..., None] > 0, 0, 255), d)), "png"),
    "RGBA black strokes blended with white": (
        lambda d: Image.fromarray(rgba((255 - d)[..., None], d)), "png"),
    "RGBA white strokes on transparent": (lambda d: Image.fromarray(rgba(255, d)), "png"),
    "RGBA red strokes on transparent": (lambda d: Image.fromarray(rgba((255, 0, 0), d)), "png"),
    "RGBA opaque dark on light": (
        lambda d: Image.fromarray(rgba((255 - d)[..., None], np.full_like(d, 255))), "png"),
    "LA white strokes on transparent": (
        lambda d: Image.fromarray(np.stack([np.full_like(d, 255), d], 2)), "png"),
    "LA cut out, light strokes": (
        lambda d: Image.fromarray(np.stack([d, np.where(d > 0, 255, 0).astype(np.uint8)], 2)),
        "png"),
    "LA cut out, dark strokes": (
        lambda d: Image.fromarray(np.stack([255 - d, np.where(d > 0, 255, 0).astype(np.uint8)],
                                           2)), "png"),
}


@pytest.mark.parametrize("form", FORMS)
def test_every_form_of_a_digit_reads_as_the_8bit_original(digit, tmp_path, form):
    make, suffix = FORMS[form]
    original, saved = tmp_path / "original.png", tmp_path / f"digit.{suffix}"
    Image.fromarray(digit).save(original)
    make(digit).save(saved)
    expected = pixels(original)
    assert expected.max() > 0.9 and expected[0, 0, 0] < 0.01  # a light digit on black
    np.testing.assert_allclose(pixels(saved), expected, atol=1.01 / 255)


def test_a_card_on_a_transparent_margin_is_read_as_its_digit(digit, tmp_path):
    """A dark digit on opaque white paper, cut out with a transparent margin: the paper
    and the margin are both background."""
    card = np.zeros((SIZE + 28, SIZE + 28, 4), np.uint8)  # a 14-pixel margin all round
    card[14:-14, 14:-14] = rgba((255 - digit)[..., None], np.full_like(digit, 255))
    Image.fromarray(card).save(tmp_path / "card.png")
    plain = np.zeros(card.shape[:2], np.uint8)
    plain[14:-14, 14:-14] = digit
    Image.fromarray(plain).save(tmp_path / "plain.png")
    np.testing.assert_allclose(pixels(tmp_path / "card.png"), pixels(tmp_path / "plain.png"),
                               atol=1.01 / 255)


def test_16_bit_is_scaled_by_its_range_not_clipped(tmp_path):
    values = np.linspace(0, 65535, 28 * 28).reshape(28, 28).astype(np.uint16)
    Image.fromarray(values).save(tmp_path / "ramp.png")
    np.testing.assert_allclose(pixels(tmp_path / "ramp.png")[0], values / 65535, atol=1e-6)


def test_a_color_dataset_sees_transparency_over_white(tmp_path):
    color = np.zeros((32, 32, 4), np.uint8)
    color[:, :16] = (200, 40, 10, 255)  # opaque on the left, transparent on the right
    Image.fromarray(color).save(tmp_path / "half.png")
    x = pixels(tmp_path / "half.png", "cifar10", 32)
    np.testing.assert_allclose(x[:, :, :15], np.reshape([200 / 255, 40 / 255, 10 / 255],
                                                        (3, 1, 1)) * np.ones((3, 32, 15)),
                               atol=1e-5)
    np.testing.assert_allclose(x[:, :, 17:], 1, atol=1e-5)
    gray16 = np.full((32, 32), 32896, np.uint16)  # 128 * 257: mid-gray in 16 bits
    Image.fromarray(gray16).save(tmp_path / "gray16.png")
    np.testing.assert_allclose(pixels(tmp_path / "gray16.png", "cifar10", 32), 128 / 255,
                               atol=1e-5)


LIMIT = 5000  # Image.MAX_IMAGE_PIXELS in the refusal tests: a 60x60 picture is over it


def directory(tmp_path):
    (tmp_path / "pictures").mkdir()
    return tmp_path / "pictures"


def truncated(tmp_path):
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64), np.uint8)).save(
        tmp_path / "full.png")
    data = (tmp_path / "full.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(data[: len(data) // 2])
    return tmp_path / "cut.png"


def text(tmp_path):
    (tmp_path / "notes.png").write_text("hello")
    return tmp_path / "notes.png"


def bomb(side):
    def make(tmp_path):
        Image.new("1", (side, side)).save(tmp_path / "bomb.png")  # a few hundred bytes
        return tmp_path / "bomb.png"
    return make


@pytest.mark.parametrize("make, message", [
    (directory, "it is a directory, expected an image file (PNG, JPEG, "),
    (lambda tmp_path: tmp_path / "missing.png", "no such file, expected an image file (PNG, "),
    (truncated, "truncated or corrupted (image file is truncated), expected a complete "
                "image file"),
    (text, "not an image format Pillow knows, expected an image file (PNG, JPEG, "),
    # over twice the limit Pillow raises DecompressionBombError, over it a warning
    (bomb(200), "40,000 pixels, over Pillow's limit of 5,000 (a decompression bomb?), "
                "expected a picture of at most 5,000 pixels"),
    (bomb(90), "8,100 pixels, over Pillow's limit of 5,000 (a decompression bomb?), "),
], ids=["directory", "missing", "truncated", "text", "bomb", "bomb-warning"])
def test_what_is_not_a_readable_image_is_refused_in_one_line(tmp_path, monkeypatch, make,
                                                             message):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", LIMIT)
    path = make(tmp_path)
    with pytest.raises(DatasetError) as error:
        load_image(path, "mnist", 28)
    assert str(error.value).startswith(f"cannot read image {path}: {message}")
    assert "\n" not in str(error.value)


def test_the_command_line_predicts_every_form_alike_and_refuses_a_folder(
        stripes, tmp_path, capsys):
    fit(tiny_config(stripes, tmp_path / "run", epochs=3))
    checkpoint = str(tmp_path / "run" / "best.npz")
    three = stripe_images([3], seed=5)[0]  # light stripes on dark noise
    Image.fromarray(three).save(tmp_path / "three.png")
    # (an inverted picture is read on the paper it has: test_dark_strokes_on_gray_paper_...)
    Image.fromarray(three.astype(np.uint16) * 257).save(tmp_path / "three16.png")
    Image.fromarray(rgba(0, three)).save(tmp_path / "three_rgba.png")
    capsys.readouterr()
    answers, headers = [], []
    for name in ("three.png", "three16.png", "three_rgba.png"):
        assert train_mnist.main(["--predict", str(tmp_path / name),
                                 "--checkpoint", checkpoint]) == 0
        header, *said = capsys.readouterr().out.splitlines()
        headers.append(header.removeprefix(f"{tmp_path / name} (").split("), the top")[0])
        lines = [line.strip().split(": ") for line in said]
        answers.append(([k for k, _ in lines], [float(p) for _, p in lines]))
    assert headers[0] == "28x28 gray"
    assert headers[1] == "28x28 16-bit gray"
    assert headers[2] == ("28x28 RGBA, read as gray, the transparent part became the black "
                          "background, the visible part the strokes")
    for classes, probabilities in answers[1:]:
        assert classes[0] == answers[0][0][0] == "3"
        np.testing.assert_allclose(probabilities, answers[0][1], atol=2e-4)
    names = [str(tmp_path / name) for name in ("three.png", "three16.png")]
    assert train_mnist.main(["--predict", *names, "--checkpoint", checkpoint]) == 0
    said = capsys.readouterr().out.splitlines()  # a header and 3 classes per image
    assert [line.split(" (")[0] for line in said[::4]] == names and len(said) == 8
    assert train_mnist.main(["--predict", names[0], str(tmp_path / "none.png"),
                             "--checkpoint", checkpoint]) == 1
    assert capsys.readouterr().out == ""  # every file is read before any is answered
    assert train_mnist.main(["--predict", str(tmp_path), "--checkpoint", checkpoint]) == 1
    assert capsys.readouterr().err == (f"train_mnist.py: error: cannot read image {tmp_path}: "
                                       "it is a directory, expected an image file (PNG, JPEG, "
                                       "BMP, GIF, TIFF, WebP, ...)\n")


@pytest.mark.parametrize("dataset, picture, changes", [
    ("mnist", Image.new("L", (28, 28)), ["28x28 gray", "blank: no strokes for the model to see"]),
    ("mnist", Image.new("RGB", (56, 40), "white"),
     ["56x40 RGB", "read as gray", "blank: no strokes for the model to see",
      "padded with black to 56x56", "resized to 28x28"]),
    ("mnist", Image.new("L", (28, 28), 128), ["28x28 gray", "blank: no strokes for the model "
                                                          "to see"]),
    ("cifar10", Image.new("L", (64, 48)), ["64x48 gray", "gray in each of the 3 channels",
                                          "cropped to its centre 48x48", "resized to 32x32"]),
    ("cifar10", Image.new("CMYK", (32, 32)), ["32x32 CMYK", "read as RGB"]),
    ("cifar10", Image.new("RGBA", (32, 32), (9, 9, 9, 255)), ["32x32 RGBA"]),
    ("cifar10", Image.new("RGBA", (32, 32), (9, 9, 9, 128)),
     ["32x32 RGBA", "shown over white where transparent"]),
])
def test_read_image_says_what_became_of_the_picture(tmp_path, dataset, picture, changes):
    path = tmp_path / ("picture.tiff" if picture.mode == "CMYK" else "picture.png")
    picture.save(path)
    batch, said = read_image(path, dataset, dataset_info(dataset).image_shape[1])
    assert said == changes
    assert np.array_equal(B.to_host(batch), B.to_host(load_image(path, dataset, batch.shape[-1])))


def strokes(height=28, width=28):
    """(h, w) 0/1: two bars, the strokes of a picture."""
    s = np.zeros((height, width), np.uint8)
    s[4:24, 12:15] = s[10:13, 6:22] = 1
    return s


def test_dark_strokes_on_gray_paper_framed_in_black_read_as_on_black(tmp_path):
    """A photo's paper is not white, and a scan's edge may be dark: the paper (most of the
    picture) is taken to black, the darkest ink to white."""
    s = strokes(40, 40)
    on_black = Image.fromarray(s * 255)
    paper = Image.fromarray((217 * (1 - s)).astype(np.uint8))  # 0.85 of white, black ink
    framed = np.asarray(paper).copy()
    framed[:3], framed[-3:], framed[:, :3], framed[:, -3:] = 20, 20, 20, 20
    for name, picture in (("black.png", on_black), ("paper.png", paper),
                          ("framed.png", Image.fromarray(framed))):
        picture.save(tmp_path / name)
    black, _ = read_image(tmp_path / "black.png", "mnist", 28)
    gray, said = read_image(tmp_path / "paper.png", "mnist", 28)
    assert said == ["40x40 gray", "inverted to light strokes on black (it had dark strokes on "
                    "light paper, 0.85 of white)", "resized to 28x28"]
    np.testing.assert_allclose(B.to_host(gray), B.to_host(black), atol=1e-6)
    frame, said = read_image(tmp_path / "framed.png", "mnist", 28)
    assert said[1].startswith("inverted to light strokes on black")
    assert np.array_equal(B.to_host(frame)[..., 6:22, 6:22], B.to_host(gray)[..., 6:22, 6:22])


def test_faint_strokes_are_stretched_and_a_wide_picture_padded(tmp_path):
    """12-bit values in a 16-bit file reach 4095 of 65535: the strokes are stretched to
    white; a picture wider than high gets black margins above and below, not squashed."""
    s = strokes()
    Image.fromarray(s.astype(np.uint16) * 4095).save(tmp_path / "twelve.png")
    Image.fromarray(s * 255).save(tmp_path / "full.png")
    faint, said = read_image(tmp_path / "twelve.png", "mnist", 28)
    assert said == ["28x28 16-bit gray", "its strokes, only 0.06 of white at most, stretched "
                    "to white"]
    assert np.array_equal(B.to_host(faint), B.to_host(load_image(tmp_path / "full.png", "mnist",
                                                                   28)))
    wide = np.zeros((28, 56), np.uint8)
    wide[:, 14:42] = s * 255
    Image.fromarray(wide).save(tmp_path / "wide.png")
    padded, said = read_image(tmp_path / "wide.png", "mnist", 28)
    assert said == ["56x28 gray", "padded with black to 56x56", "resized to 28x28"]
    rows = B.to_host(padded)[0, 0].max(axis=1)
    assert (rows[:7] == rows.min()).all() and (rows[-7:] == rows.min()).all()  # black margins
