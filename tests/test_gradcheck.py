"""``python -m tinyvit.gradcheck``: what it prints, which cases it runs, when it fails."""

import subprocess
import sys

import pytest

from tinyvit import backend as B
from tinyvit.gradcheck import __main__ as command
from tinyvit.gradcheck import cases, randn
from tinyvit.nn import layers


class BrokenLinear(layers.Linear):
    """A Linear whose backward doubles the input's gradient."""

    def backward(self, dout):
        return 2 * super().backward(dout)


def run(monkeypatch, capsys, built, argv=()):
    monkeypatch.setattr(command, "cases", lambda: built)
    status = command.main(list(argv))
    return status, capsys.readouterr().out.splitlines()


def linear():
    return layers.Linear(4, 3, rng=B.host_rng(0)), (randn(2, 4),), None


def tanh():
    return layers.Tanh(), (randn(2, 4),), None


def test_prints_a_row_per_tensor_of_each_tier_with_pass_or_fail(monkeypatch, capsys):
    status, out = run(monkeypatch, capsys, [("Linear", linear), ("Tanh", tanh)])
    assert status == 0
    assert out[1:] == [
        "== Linear (reference)",
        "  Linear   docs/backprop.md#linear",
        *[line for line in out[3:6]],
        "== Linear (fast)",
        "  Linear   docs/backprop.md#linear",
        *[line for line in out[8:11]],
        "== Tanh (reference)",
        "  Tanh   docs/backprop.md#tanh",
        out[13],
        "== Tanh (fast): no fast kernel, the reference's layers as checked above",
        "7 of 7 tensors passed (all within 1e-07)",
    ]
    rows = [line.split()[:2] for line in out[3:6] + out[8:11] + out[13:14]]
    assert rows == [["PASS", "input"], ["PASS", "weight"], ["PASS", "bias"]] * 2 + [
        ["PASS", "input"]]


def test_a_wrong_backward_fails_and_says_how(monkeypatch, capsys):
    status, out = run(monkeypatch, capsys, [("broken", lambda: (
        BrokenLinear(4, 3, rng=B.host_rng(0)), (randn(2, 4),), None))])
    assert status == 1
    # the fast tier has no kernel for the subclass: only the reference rows are checked
    assert [line.split()[:2] for line in out if "rel_err" in line] == [
        ["FAIL", "input"], ["PASS", "weight"], ["PASS", "bias"]]
    assert ("          computed/expected = 2 everywhere: a factor of 2 too many: a value added 2 "
            "times, or a 1/2 left out, or a 1/sqrt(4) left out (the input has 4 along some "
            "axes)") in out
    assert out[-1] == "2 of 3 tensors passed (not all within 1e-07)"


def test_layer_and_tier_choose_what_runs(monkeypatch, capsys):
    status, out = run(monkeypatch, capsys, [("Linear", linear), ("Tanh", tanh)],
                      ["--layer", "tanh", "--tier", "fast"])  # names in any case
    assert status == 0
    assert [line for line in out if line.startswith("==")] == ["== Tanh (fast)"]
    assert out[-1] == "1 of 1 tensors passed (all within 1e-07)"


def test_a_layers_name_selects_each_of_its_cases():
    names = ["Linear", "Conv2d 3x3 s2 p1", "Conv2d WS", "GELU", "GELU tanh"]
    assert command.selected("conv2d", names) == ["Conv2d 3x3 s2 p1", "Conv2d WS"]
    assert command.selected("GELU", names) == ["GELU"]  # the case of that name alone
    assert command.selected("gelu TANH", names) == ["GELU tanh"]
    assert command.selected("Conv", names) == []


def test_an_unknown_layer_is_named(capsys):
    with pytest.raises(SystemExit):
        command.main(["--layer", "Linear", "Transformer"])
    assert "no case named Transformer; the cases: Linear, Patchify" in capsys.readouterr().err


def test_a_bad_tinyvit_backend_is_one_line_and_the_flag_wins(monkeypatch, capsys):
    monkeypatch.setenv("TINYVIT_BACKEND", "abc")
    with pytest.raises(SystemExit):
        command.main([])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "python -m tinyvit.gradcheck: error: TINYVIT_BACKEND: expected numpy or cupy (in any "
        "case), got 'abc'")
    assert command.parse_args(["--backend", "numpy"]).backend == "numpy"
    monkeypatch.setenv("TINYVIT_BACKEND", "NumPy")
    assert command.parse_args([]).backend == "numpy"


def test_a_missing_cupy_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError, GPU or not
    with pytest.raises(SystemExit, match=r"^python -m tinyvit.gradcheck: backend 'cupy' needs "
                                         r"CuPy: install it with"):
        command.main(["--backend", "cupy"])


def test_the_whole_command_passes():
    result = subprocess.run([sys.executable, "-m", "tinyvit.gradcheck"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    headers = {line[3:].rsplit(" (", 1)[0] for line in result.stdout.splitlines()
               if line.startswith("== ")}
    assert headers == {name for name, _ in cases.cases()}
    assert "FAIL" not in result.stdout
    assert "patch_embed.backbone.conv1 (Conv2d)" in result.stdout
    assert result.stdout.splitlines()[-1].endswith("tensors passed (all within 1e-07)")


def test_an_input_or_a_parameter_not_in_float64_is_named_with_the_fix():
    import numpy as np

    from tinyvit.gradcheck import gradient_check

    layer = layers.Linear(3, 2, dtype="float32")
    with pytest.raises(ValueError, match=r"^gradient_check: the input must be float64, got "
                                         r"float32 \(x.astype\('float64'\)\)$"):
        gradient_check(layer, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"^gradient_check: the parameters must be float64, got "
                                         r"weight in float32 \(build the module inside "
                                         r"backend.default_dtype\('float64'\), or call "
                                         r"module.astype\('float64'\)\)$"):
        gradient_check(layer, np.zeros((2, 3)))
    gradient_check(layer.astype("float64"), np.ones((2, 3))).assert_ok()
