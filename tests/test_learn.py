"""The workbook (``python -m tinyvit.learn``): written blank, it fails every exercise as
not written; filled with the library's own backward passes, every exercise passes, the
hybrid's track and the training on the learner's layers included; each bug of the
gradient check's list, planted in its exercise, fails with the diagnosis that names it."""

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from conftest import randn
from tinyvit import backend as B
from tinyvit.learn import ExerciseFailed, check, check_training, checking, exercises
from tinyvit.learn import __main__ as command
from tinyvit.learn import workbook as workbook_module
from tinyvit.learn.checking import NotWritten, Progress, load_exercise
from tinyvit.learn.exercises import BACKPROP, EXERCISES, TRAINING, by_name
from tinyvit.learn.steps import LayerNormSteps, softmax_jacobian_backward
from tinyvit.learn.training import _learners_classes
from tinyvit.learn.workbook import fill
from tinyvit.nn.functional import softmax, softmax_backward
from tinyvit.nn.layers import GELU, Attention, LayerNorm, Linear


def fill_all(folder):
    for ex in EXERCISES:
        path = folder / ex.filename
        path.write_text(fill(path.read_text(), ex))


def pytest_in(folder, *args):
    """pytest run in ``folder``, without its short summary: those lines, cut to the
    terminal's width, would repeat a varying share of the messages the tests count."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rN", *args], cwd=folder,
                          capture_output=True, text=True, timeout=600)


def failure_of(folder, name, planted=None):
    """The paragraph with which exercise ``name`` fails, its library backward filled in
    and, with ``planted`` (old, new), that text of it replaced."""
    ex = by_name(name)
    path = folder / ex.filename
    text = fill(path.read_text(), ex)
    if planted:
        old, new = planted
        assert old in text, f"the plant needs {old!r} in {ex.filename}"
        text = text.replace(old, new)
    path.write_text(text)
    module = load_exercise(path)
    with pytest.raises(ExerciseFailed) as failed:
        getattr(module, f"test_{name}")()
    return str(failed.value)


def test_a_new_workbook_has_every_exercise_blank(workbook):
    names = sorted(p.name for p in workbook.iterdir())
    assert names == sorted([name for ex in EXERCISES for name in (
        ex.filename, ex.notebook, ex.filename.replace(".py", ".where.png"))]
        + ["ex20_training.py", "ex20_training.ipynb", "README.md", "learn.json", "pytest.ini"])
    result = pytest_in(workbook)
    assert result.returncode == 1
    assert result.stdout.count("not written yet: write My") == 18  # the layers' methods
    assert result.stdout.count("not written yet: write") == 23  # and five functions
    assert "not written yet: write softmax_backward between the markers" in result.stdout
    assert f"exercise {TRAINING} trains on your layers where they pass their checks: none of " \
        f"exercises 1-{TRAINING - 1} has passed yet" in result.stdout
    assert "24 failed" in result.stdout
    readme = (workbook / "README.md").read_text()
    assert all(f"`{ex.filename}`" in readme for ex in EXERCISES)


def test_filled_with_the_library_every_exercise_passes_and_trains(workbook, capsys):
    """The training reads the synthetic MNIST files, which this process's registry
    accepts: it runs here, after the other exercises in a learner's pytest."""
    fill_all(workbook)
    result = pytest_in(workbook, "-k", "not training")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "23 passed, 1 deselected" in result.stdout
    check_training(workbook)
    assert capsys.readouterr().out.startswith(
        f"exercise {TRAINING} (training): PASS, 10 steps of the MNIST preset on your backward "
        "passes, the same losses as the library's to 1e-06")
    status = subprocess.run([sys.executable, "-m", "tinyvit.learn", "status", str(workbook)],
                            capture_output=True, text=True, check=True).stdout
    assert status.splitlines()[-1] == "24 of 24 passed"


@pytest.mark.gpu
@pytest.mark.skipif(not B.cupy_available(), reason="CuPy with a CUDA GPU not available")
def test_filled_with_the_library_every_exercise_passes_on_cupy_too(workbook, capsys):
    """``check`` runs every case on NumPy, then on CuPy where a GPU is present."""
    fill_all(workbook)
    for ex in EXERCISES:
        if ex.number != TRAINING:
            getattr(load_exercise(workbook / ex.filename), f"test_{ex.name}")()
    assert capsys.readouterr().out.count(": PASS, every stage") == len(EXERCISES) - 1


def test_the_training_runs_the_learners_functions_inside_the_learners_layers(workbook):
    fill_all(workbook)
    attention = _learners_classes(workbook, range(1, TRAINING))[0][Attention]
    calls = {**attention.attend_backward.__globals__, **attention.backward.__globals__}
    assert {name: Path(calls[name].__code__.co_filename).name for name in (
        "softmax_backward", "split_heads_grad", "merge_qkv_grads")} == {
        "softmax_backward": "ex11_softmax.py", "split_heads_grad": "ex13_merge_heads.py",
        "merge_qkv_grads": "ex14_split_heads.py"}


def test_code_changed_since_it_passed_is_said_by_status_and_the_training(workbook, capsys):
    ex = by_name("linear")
    path = workbook / ex.filename
    path.write_text(fill(path.read_text(), ex))
    load_exercise(path).test_linear()  # passes
    path.write_text(path.read_text().replace("self.bias.grad += self.column_sum(dout2)",
                                             "self.bias.grad += dout2.mean(axis=0)"))
    capsys.readouterr()
    assert command.main(["status", str(workbook)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"  1  PASS, changed    {ex.filename:<26} {ex.title}")
    with pytest.raises(ExerciseFailed) as failed:
        check_training(workbook)
    assert str(failed.value) == (
        f"exercise {TRAINING} trains on your layers that passed their checks, but the code of "
        f"exercise(s) 1 changed since passing: check again first (python -m tinyvit.learn "
        f"check 1 {workbook})")


def test_code_changed_since_it_failed_is_said_by_status(workbook, capsys):
    ex = by_name("linear")
    path = workbook / ex.filename
    right = fill(path.read_text(), ex)
    path.write_text(right.replace("self.bias.grad += self.column_sum(dout2)",
                                  "self.bias.grad += dout2.mean(axis=0)"))
    with pytest.raises(ExerciseFailed):
        load_exercise(path).test_linear()
    capsys.readouterr()
    command.main(["status", str(workbook)])
    assert capsys.readouterr().out.splitlines()[0] == (
        f"  1  FAIL             {ex.filename:<26} {ex.title}")
    path.write_text(right)  # fixed, not checked again
    command.main(["status", str(workbook)])
    assert capsys.readouterr().out.splitlines()[0] == (
        f"  1  FAIL, changed    {ex.filename:<26} {ex.title}")


def test_a_notebook_saved_with_its_blank_untouched_is_not_the_code_that_passed(workbook,
                                                                               capsys):
    """Saving the notebook (as Jupyter does after its cells run) leaves the answer in the
    .py file, which passed: the notebook's blank, quoted in its JSON, is still a blank."""
    ex = by_name("linear")
    path = workbook / ex.filename
    path.write_text(fill(path.read_text(), ex))
    load_exercise(path).test_linear()  # passes
    notebook = workbook / ex.notebook
    notebook.write_text(notebook.read_text())  # saved later than the .py, unchanged
    capsys.readouterr()
    assert command.main(["status", str(workbook)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"  1  PASS             {ex.filename:<26} {ex.title}")


def test_a_comment_or_a_blank_line_added_after_passing_is_not_a_change(workbook, capsys):
    ex = by_name("linear")
    path = workbook / ex.filename
    path.write_text(fill(path.read_text(), ex))
    load_exercise(path).test_linear()  # passes
    path.write_text(path.read_text().replace(
        "self.bias.grad += self.column_sum(dout2)",
        "self.bias.grad += self.column_sum(dout2)  # summed over the rows\n"))
    capsys.readouterr()
    assert command.main(["status", str(workbook)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"  1  PASS             {ex.filename:<26} {ex.title}")


def test_the_training_stops_where_the_losses_part(workbook):
    """A bias gradient of the wrong sign (doubled, AdamW would not see it: it divides
    each gradient by its own scale), with exercises 1-19 marked as passed: step 0's loss
    comes before any update and agrees; step 1's does not, and the training stops there."""
    fill_all(workbook)
    path = workbook / by_name("linear").filename
    path.write_text(path.read_text().replace("self.bias.grad += self.column_sum(dout2)",
                                             "self.bias.grad -= self.column_sum(dout2)"))
    for number in range(1, TRAINING):
        Progress(workbook).record(number, "pass")
    with pytest.raises(ExerciseFailed) as failed:
        check_training(workbook)
    lines = str(failed.value).splitlines()
    assert lines[0].startswith(f"exercise {TRAINING} (training): the loss curves part at step "
                               "1: yours ")
    assert lines[1] == (  # the layers the MNIST preset has: no Tanh
        "yours: Linear (1), GELU, the exact form (3), Dropout (5), Residual (6), Patchify (7), "
        "LayerNorm, fused (9), the attention core (12), Attention (15), MLP (16), the encoder "
        "block (17), the model's own backward (18), softmax cross-entropy (19), "
        "softmax_backward (11, inside your layers that call it), split_heads_grad (13, inside "
        "your layers that call it), merge_qkv_grads (14, inside your layers that call it); the "
        "library's: every other layer (exercises not passed: none)")
    assert [line.split(":")[0] for line in lines[2:]] == ["step   0", "step   1",
                                                         "The curves, drawn"]
    assert lines[-1] == f"The curves, drawn: {workbook / 'ex20_training.png'}"
    assert Image.open(workbook / "ex20_training.png").size[0] > 800


PLANTED = {  # exercise: (the library's line, the learner's mistake, what the failure must say)
    "bias averaged instead of summed": (
        "linear", ("self.bias.grad += self.column_sum(dout2)",
                   "self.bias.grad += dout2.mean(axis=0)"),
        "bias's gradient differs from the library's", "computed/expected = 1/3 everywhere: a sum "
        "over 3 values (the rows of the batch) taken as their mean"),
    "the mask turned back into 0/1, its 1/(1-p) lost": (
        "dropout", ("return dout if isinstance(mask, float) else dout * mask",
                    "return dout if isinstance(mask, float) else dout * (mask != 0)"),
        "-> return (dout if isinstance(mask, float) else dout * (mask != 0)) * mask",
        "computed/expected = 0.7 = (1-p) everywhere: a factor of (1-p) too many (or missing)"),
    "a transposed weight gradient": (
        "linear", ("self.weight.grad += dout2.T @ x2", "self.weight.grad += x2.T @ dout2"),
        "weight's gradient must have its array's shape (5, 7), but you add to it shape (7, 5), "
        "the transpose: dW = dy^T x (out, in), not x^T dy"),
    "dx, named otherwise, reshaped to dout's shape": (  # the library's reshape, on dX
        "linear", ("dx = dout2 @ self.weight.data  # (M, in)\n        return dx.reshape(*dout."
                   "shape[:-1], self.in_features)",
                   "dX = dout2 @ self.weight.data\n        return dX.reshape(dout.shape)"),
        "-> return dX.reshape(*dout.shape[:-1], self.in_features)"),
    "the kernel's axes swapped in a reshape": (  # fixed there, not by a second reshape
        "maxpool", ("dwindows = (onehot * dout[:, :, None]).reshape(B, C, kh, kw, Ho, Wo)\n"
                    "        dxpad = col2im(dwindows,",
                    "dwin = onehot * dout[:, :, None]\n"
                    "        dwin = dwin.reshape(B, C, kw, kh, Ho, Wo)\n"
                    "        dxpad = col2im(dwin,"),
        "-> dwin = dwin.reshape(B, C, kh, kw, Ho, Wo)"),
    "a loop one offset short": (
        "col2im", ("for i in range(kh):", "for i in range(kh - 1):"),
        "-> for i in range(kh):", "kh, not kh - 1: one off"),
    "a gradient assigned instead of accumulated": (
        "linear", ("self.weight.grad += dout2.T @ x2", "self.weight.grad = dout2.T @ x2"),
        "weight's gradient is assigned, not accumulated: a second backward without zero_grad "
        "left it as it was instead of doubling it"),
    "a NumPy function given an array of too many axes": (
        "layernorm", ("g = dout * self.weight.data", "g = xp.diag(dout) * self.weight.data"),
        "your backward raised ValueError: Input must be 1- or 2-d. at line ",
        " of ex09_layernorm.py: g = xp.diag(dout) * self.weight.data"),  # not NumPy's line
    "the softmax backward without its row-sum term": (
        "softmax", ("return A * (dA - (dA * A).sum(axis=-1, keepdims=True))", "return A * dA"),
        "the rows of dS must sum to zero, but yours sum to up to"),
    "the 1/sqrt(Dh) scale missing in the backward": (
        "attention_core", ("dq = dS @ k * self.scale", "dq = dS @ k"),
        "q rows, every head: computed/expected = 2 = sqrt(Dh), Dh = 4 (the 1/sqrt(Dh) "
        "scale of the scores is missing in the backward, or a factor of 2 too many)",
        "k rows, every head: right"),
    "LayerNorm's backward without the mean(g) term": (
        "layernorm", ("return standardize_backward(g, xhat, rstd, -1)",
                      "return rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))"),
        "the rows of the input's gradient (over the features) must sum to zero"),
    "the dropout mask not applied in the backward": (
        "dropout", ("return dout if isinstance(mask, float) else dout * mask", "return dout"),
        "computed is dout as it came: the backward passes the upstream gradient on unchanged "
        "(the forward's mask is not applied: dx = dout * mask)"),
    "GELU's derivative without its x phi(x) term": (
        "gelu", ("return dout * (normal_cdf(x) + x * normal_pdf(x))",
                 "return dout * normal_cdf(x)"),
        "the term x * phi(x) of y' = Phi(x) + x * phi(x) is missing"),
    "the density written with a NumPy float64 number": (
        "gelu", ("return dout * (normal_cdf(x) + x * normal_pdf(x))",
                 "phi = xp.exp(-x * x / 2) / xp.sqrt(2 * xp.pi)\n"
                 "        return dout * (normal_cdf(x) + x * phi)"),
        "case 1 in float32, input (3, 7): the input's gradient is float64 where the input is "
        "float32, first at line ", " of ex03_gelu.py (backward): `phi = xp.exp(-x * x / 2) / "
        "xp.sqrt(2 * xp.pi)` made `phi` wider: ", "a NumPy float64 number (xp.sqrt(2 * xp.pi) "
        "is one"),
    "a residual branch's gradient not added": (
        "residual", ("return dout + self.branch.backward(dout)",
                     "self.branch.backward(dout)\n        return dout"),
        "the skip's share alone: the branch's gradient is not added, dx = dout + df"),
    "cross-entropy's gradient without the 1/B of its mean": (
        "cross_entropy", ("return (xp.exp(log_probs) - t) * (dout / log_probs.shape[0])",
                          "return (xp.exp(log_probs) - t) * dout"),
        "the 1/4 of the mean is missing"),
    "Patchify's grid of patches read as (gw, gh)": (
        "patchify", ("dx = dout.reshape(B, gh, gw, C, P, P)",
                     "dx = dout.reshape(B, gw, gh, C, P, P)"),
        "case 2 of 3, input (1, 3, 8, 20): the input's gradient differs from the library's",
        "computed holds the expected values in other places: entries moved wrong (a reshape or "
        "transpose in the wrong order, two axes swapped)"),
    "a sign": (
        "tanh", ("return dout * (1.0 - y * y)", "return dout * (y * y - 1.0)"),
        "computed/expected = -1 everywhere: a sign is wrong"),
    "the key bias's gradient, with the softmax backward's row-sum term missing": (
        "attention_core", ("dS = softmax_backward(A, dA)", "dS = A * dA"),
        "the key bias's gradient must be exactly zero, but yours reaches",
        "the key bias adds the same q.b to every score of a row, and dk = dS^T q scale sums "
        "each row of dS, which sums to zero", "qkv.bias's gradient: k entries, every head: "
        "wrong", "yours against the library's:"),
    "dk computed with dS not transposed": (
        "attention_core", ("dk = dS.transpose(0, 1, 3, 2) @ q * self.scale",
                           "dk = dS @ q * self.scale"),
        "the key bias's gradient must be exactly zero", "qkv.weight's gradient: q rows, every "
        "head: right", "qkv.weight's gradient: k rows, every head: wrong",
        "dq, which uses the same dS, is right, so dS is: dk's own formula is wrong"),
    "the transpose of a gradient that is not a weight's": (
        "cross_entropy", ("return (xp.exp(log_probs) - t) * (dout / log_probs.shape[0])",
                          "return ((xp.exp(log_probs) - t) * (dout / log_probs.shape[0])).T"),
        "the input's gradient must have its array's shape (4, 5), but yours has shape (5, 4), "
        "the transpose of its shape: a product taken in the wrong order"),
    "Conv2d's bias averaged instead of summed": (
        "conv2d", ("self.bias.grad += dy.sum(axis=1)", "self.bias.grad += dy.mean(axis=1)"),
        "bias's gradient differs from the library's", "computed/expected = 1/"),
    "BatchNorm2d's backward without the mean(g) term": (
        "batchnorm", ("return standardize_backward(g, xhat, rstd, (0, 2, 3), "
                      "self.channel_mean(V))",
                      "return rstd * (g - xhat * (g * xhat).mean(axis=(0, 2, 3), keepdims=True))"),
        "the input's gradient over (B, H, W), per channel, must sum to zero"),
    "col2im's windows written over instead of added": (
        "col2im", ("+= dwindows[..., i, j, :, :]", "= dwindows[..., i, j, :, :]"),
        "right at the pixels that one window reads, wrong where windows overlap"),
    "the class token's gradient dropped": (
        "vit", ("self.cls_token.grad += dx[:, :1].sum(axis=0, keepdims=True)", "pass"),
        "cls_token's gradient differs from the library's", "computed is zero everywhere: this "
        "gradient is never added"),
}


@pytest.mark.parametrize("bug", PLANTED)
def test_a_planted_bug_fails_with_its_diagnosis(workbook, bug):
    name, planted, *says = PLANTED[bug]
    paragraph = failure_of(workbook, name, planted)
    for words in says:
        assert words in paragraph, paragraph
    assert f"a hint: python -m tinyvit.learn hint {by_name(name).number}" in paragraph


def test_a_swap_in_a_call_is_not_given_another_steps_formula(workbook):
    """Attention.backward's return is no dS of attend_backward's docstring."""
    paragraph = failure_of(workbook, "attention", ("merge_qkv_grads(dq, dk, dv)",
                                                   "merge_qkv_grads(dq, dv, dk)"))
    assert "      dk and dv in the other order\n" in paragraph


@pytest.mark.parametrize("returned, says", [
    ("dx = dout * (1.0 - y * y)", "your backward returned None, where the input's gradient, one "
     "array of shape (3, 7), is expected: is a return missing at its end?"),
    ("return dout * (1.0 - y * y), None", "your backward returned a tuple of 2, where the "
     "input's gradient, one array of shape (3, 7), is expected"),
])
def test_a_backward_that_returns_no_array_is_told_so_without_a_search(workbook, returned, says):
    paragraph = failure_of(workbook, "tanh", ("return dout * (1.0 - y * y)", returned))
    assert paragraph.splitlines()[0] == f"exercise 2 (Tanh), case 1 of 3, input (3, 7): {says}"
    assert "edits of one or two lines" not in paragraph and "no edit" not in paragraph


@pytest.mark.parametrize("planted, at, says", [
    (("return dout * (1.0 - y * y)", "return dout * (1.0 - y * y"), "return dout",
     "SyntaxError: '(' was never closed"),
    (("class MyTanh(Tanh):", "class MyTanh2(Tanh):"), "check(MyTanh,",
     "NameError: name 'MyTanh' is not defined"),
])
def test_a_file_whose_own_line_raises_is_one_line_naming_it(workbook, capsys, planted, at, says):
    ex = by_name("tanh")
    path = workbook / ex.filename
    path.write_text(fill(path.read_text(), ex).replace(*planted))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if at in text)
    assert command.main(["check", "2", str(workbook)]) == 1
    assert capsys.readouterr().out == (f"{path}, line {line}: {says} (the exercise's file must "
                                       "run before its backward can be checked)\n")


def test_a_name_for_another_is_explained_by_the_forward_line_of_the_step(workbook):
    """drstd from xhat where xmu is meant: the forward line that reads xmu and rstd both,
    not the first that reads xmu (var = ...)."""
    paragraph = failure_of(workbook, "layernorm_steps", (
        "drstd = (dxhat * xmu).sum(axis=-1, keepdims=True)",
        "drstd = (dxhat * xhat).sum(axis=-1, keepdims=True)"))
    assert "xmu, not xhat, is what the forward used here (xhat = xmu * rstd)" in paragraph


def test_col2im_with_i_and_j_swapped_is_not_said_to_write_over_the_overlaps(workbook):
    """With a 3x3 kernel of stride 2 the pixels one window reads sit at i = j = 1, where
    the swap is right too: that alone does not make it the = of the overlaps."""
    paragraph = failure_of(workbook, "col2im", ("+= dwindows[..., i, j, :, :]",
                                                "+= dwindows[..., j, i, :, :]"))
    assert "i and j in the other order" in paragraph
    assert "windows overlap" not in paragraph


def test_hints_come_one_level_at_a_time_and_the_solution_after_an_attempt(workbook, capsys):
    assert command.main(["hint", "1", str(workbook)]) == 0
    assert command.main(["hint", "1", str(workbook)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "hint 1 of 3 for exercise 1 (Linear), the shapes",
        "hint 1 of 3 for exercise 1 (Linear), the shapes",
        "hint 2 of 3 for exercise 1 (Linear), the chain rule"]
    assert command.main(["solution", "1", str(workbook)]) == 1
    assert "the solution comes after an attempt that ran" in capsys.readouterr().out
    failure_of(workbook, "linear", ("self.bias.grad += self.column_sum(dout2)",
                                    "self.bias.grad += dout2.mean(axis=0)"))
    assert command.main(["solution", "1", str(workbook)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# tinyvit's own: tinyvit.nn.layers.Linear.backward")
    assert "self.bias.grad += self.column_sum(dout2)" in out


def test_a_class_without_a_backward_of_its_own_is_a_blank():
    class MyLinear(Linear):
        def backwards(self, dout):  # misspelled: Linear.backward would run, and pass
            return dout

    with pytest.raises(NotWritten) as failed:
        check(MyLinear)
    assert str(failed.value).startswith(
        "exercise 1 (Linear): MyLinear has no backward of its own: it inherits Linear.backward "
        "from tinyvit; write MyLinear.backward (spelled so) between the markers of "
        "ex01_linear.py (or of ex01_linear.ipynb)\n")


def test_a_backward_that_hands_its_work_to_the_library_is_refused():
    class MyLinear(Linear):
        def backward(self, dout):
            return super().backward(dout)

    with pytest.raises(ExerciseFailed) as failed:
        check(MyLinear)
    assert str(failed.value).startswith(
        "exercise 1 (Linear), case 1 of 4, input (3, 7): MyLinear.backward calls tinyvit's own "
        "Linear.backward (as super().backward(...) or Linear.backward(self, ...)), which would "
        "pass without a line of yours: compute the gradients yourself\n")
    layer = Linear(3, 2)  # the library's own backward is back after the check
    layer.forward(randn(4, 3))
    assert layer.backward(randn(4, 2)).shape == (4, 3)


def test_every_exercise_is_found_by_its_class_name_alone():
    for ex in EXERCISES:
        if not ex.is_function:
            assert checking._exercise(type(ex.yours, (ex.reference,), {}), None) is ex
    with pytest.raises(ValueError, match='name it, as check\\(MyGELUs, "gelu"\\) or '
                                         'check\\(MyGELUs, "gelu_tanh"\\)'):
        checking._exercise(type("MyGELUs", (GELU,), {}), None)


def test_no_link_or_shape_is_broken_across_lines(workbook):
    for ex in EXERCISES:
        text = (workbook / ex.filename).read_text()
        assert f"{exercises.derivation(ex.section)}." in text, ex.filename  # whole, on one line
        lines = [line for line in text.splitlines() if not line.lstrip().startswith("#     ")]
        assert max(len(line) for line in lines) <= 100, ex.filename  # (the quoted forward aside)
        for shape in re.findall(r"\([^()]{0,%d}\)" % workbook_module.SHAPE,
                                " ".join(ex.task.split())):
            assert any(shape in line for line in lines), f"{ex.filename}: {shape}"


def test_a_gradient_that_is_not_an_array_of_the_backend_is_named():
    """On CuPy, a dx computed with NumPy would reach the comparisons and fail there with
    CuPy's own TypeError; here, something array-like of the right shape stands for it."""
    class MyLinear(Linear):
        def backward(self, dout):
            x2 = self._take_cache()
            dout2 = dout.reshape(-1, self.out_features)
            self.weight.grad += dout2.T @ x2
            self.bias.grad += dout2.sum(axis=0)
            return SimpleNamespace(shape=self.last_input_shape)

        def forward(self, x):
            self.last_input_shape = x.shape
            return super().forward(x)

    with pytest.raises(ExerciseFailed) as failed:
        check(MyLinear)
    assert "the input's gradient is a types.SimpleNamespace, not an array of the active " \
        "backend (numpy): compute it with xp (tinyvit.backend.xp), not numpy" in str(failed.value)


def test_the_derivations_are_named_by_their_path_in_a_checkout(workbook, monkeypatch):
    assert BACKPROP.is_file()
    assert f"The derivations: {BACKPROP},\n" in (workbook / "README.md").read_text()
    assert f"The derivation: {BACKPROP}#linear." in (workbook / "ex01_linear.py").read_text()
    monkeypatch.setattr(exercises, "BACKPROP", BACKPROP.with_name("absent.md"))  # an install
    assert exercises.derivation("Linear") == "docs/backprop.md#linear in tinyvit's repository"


def test_the_command_says_what_is_wrong_in_one_line(tmp_path, capsys):
    assert command.main(["status", str(tmp_path)]) == 2
    assert "holds no workbook (no learn.json)" in capsys.readouterr().err
    (tmp_path / "x.py").write_text("")
    assert command.main(["start", str(tmp_path)]) == 2
    assert "is not empty: start a workbook in a new folder" in capsys.readouterr().err


def test_the_long_ways_equal_the_fused_backward_passes(backend):
    x, dout = randn(3, 5, 8), randn(3, 5, 8, seed=1)
    steps, fused = LayerNormSteps(8), LayerNorm(8)
    for layer in (steps, fused):
        layer.forward(x)
    np.testing.assert_allclose(B.to_host(steps.backward(dout)), B.to_host(fused.backward(dout)),
                               rtol=1e-12, atol=1e-12)
    A = softmax(randn(2, 3, 7))
    dA = randn(2, 3, 7, seed=2)
    np.testing.assert_allclose(B.to_host(softmax_jacobian_backward(A, dA)),
                               B.to_host(softmax_backward(A, dA)), rtol=1e-12, atol=1e-14)


def test_the_data_folder_is_kept_whole_and_a_missing_one_is_named(tmp_path, monkeypatch):
    """Given relative at the start, the data folder still holds where pytest runs (in the
    workbook); without the MNIST files the training names what it needs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    assert command.main(["start", "workbook", "--data-dir", "empty"]) == 0
    folder = tmp_path / "workbook"
    assert json.loads((folder / "learn.json").read_text()) == {
        "data_dir": str((tmp_path / "empty").resolve())}
    (folder / ".learn-progress.json").write_text(json.dumps({n: "pass" for n in range(1, 20)}))
    fill_all(folder)
    with pytest.raises(ExerciseFailed, match=f"exercise {TRAINING} trains on MNIST: mnist train: "
                                             f"{tmp_path / 'empty'} does not hold the files"):
        check_training(folder)


def _gradients(module, dout):
    """The input's gradient and every parameter's, from zero, as one host vector."""
    module.zero_grad()
    parts = [module.backward(dout)] + [p.grad for p in module.parameters()]
    return np.concatenate([B.to_host(part).reshape(-1) for part in parts])


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.name)
def test_every_cached_tensor_changes_the_gradient_in_some_case(ex):
    """A mistake that reads one cached tensor for another (A for Ad, x for xhat) must fail
    some case: per exercise, for every array a forward caches (its layer's own, or one of
    the layers' below it) and every other cached array of its shape (or its own entries
    reversed, where none has its shape), some case in which the library's backward, given
    that one in its place, gives other gradients. A and Ad differ only with attention
    dropout on: a case with it."""
    matters = {}
    for case in ex.cases:
        with B.default_dtype("float64"):
            module, inputs, before_forward = case(ex.reference)
            if before_forward:
                before_forward()
            y = module.forward(*inputs)
            dout = 0.7 if y.ndim == 0 else randn(*y.shape, seed=9)
            layers = dict(module.named_modules())
            caches = {path: layer.cache for path, layer in layers.items()}
            cached = [(path, i, item) for path, cache in caches.items() for i, item in (
                enumerate(cache) if isinstance(cache, tuple) else [(None, cache)])
                if B.is_array(item)]
            right = _gradients(module, dout)
            for path, position, value in cached:
                others = [((p, i), v) for p, i, v in cached if v.shape == value.shape
                          and (p, i) != (path, position)]
                reversed_ = value.reshape(-1)[::-1].reshape(value.shape)
                for other, stand_in in others or [("reversed", reversed_)]:
                    for name, layer in layers.items():
                        layer.cache = caches[name]
                    cache = caches[path]
                    layers[path].cache = stand_in if position is None else tuple(
                        stand_in if i == position else item for i, item in enumerate(cache))
                    try:
                        changed = not np.allclose(_gradients(module, dout), right)
                    except ValueError:  # shapes that no longer fit: it mattered
                        changed = True
                    key = (path, position, other)
                    matters[key] = matters.get(key, False) or changed
    assert all(matters.values()), [key for key, value in matters.items() if not value]
    assert bool(matters) == (ex.name not in ("patchify", "merge_heads", "split_heads", "col2im"))
