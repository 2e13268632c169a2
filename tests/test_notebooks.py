"""The workbook's notebooks, pictures, hints and solutions: each notebook is its exercise
with docs/backprop.md's section, and runs in a real Jupyter kernel (blank, right, and
wrong with the picture of the difference); hints say more at each level; a solution
shows the functions its method calls; the training runs on the exercises passed so far."""

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tinyvit.learn import __main__ as command
from tinyvit.learn import exercises, notebook, pictures, training
from tinyvit.learn.checking import ExerciseFailed, Progress, comparison, load_exercise
from tinyvit.learn.exercises import EXERCISES, TRAINING, by_name, by_number, derivation_text
from tinyvit.learn.hints import HINTS, HOLE
from tinyvit.learn.solution import solution
from tinyvit.learn.training import _learners_classes, check_training
from tinyvit.learn.workbook import TRAINING_FILE, answer, fill
from tinyvit.nn.layers import LayerNorm, Linear
from tinyvit.viz.canvas import CMAPS
from tinyvit.viz.diagram import EDGE, FILL, block_diagram

ROOT = Path(__file__).resolve().parents[1]
BIAS_MEAN = ("self.bias.grad += self.column_sum(dout2)", "self.bias.grad += dout2.mean(axis=0)")


def cells(path):
    return json.loads(Path(path).read_text())["cells"]


def tagged(path, tag):
    return next(c for c in cells(path) if tag in c["metadata"].get("tags", ()))


def fill_notebook(path, ex, planted=None):
    """The notebook at ``path`` with its blank filled by the library's code (and, with
    ``planted`` (old, new), that text replaced), the names the code uses imported."""
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        tags = cell["metadata"].get("tags", ())
        if "answer" in tags:
            text = fill("".join(cell["source"]), ex)
            if planted:
                assert planted[0] in text
                text = text.replace(*planted)
            cell["source"] = text.splitlines(keepends=True)
        if "setup" in tags:
            cell["source"].append(f"\nfrom {ex.reference.__module__} import *  # noqa")
    path.write_text(json.dumps(nb))


def test_each_notebook_is_its_exercise_with_its_section_of_the_derivations(workbook):
    for ex in EXERCISES:
        path = workbook / ex.notebook
        source = ["".join(c["source"]) for c in cells(path)]
        assert "".join(tagged(path, "answer")["source"]) == answer(ex).rstrip("\n")
        assert source[0].startswith(f"# Exercise {ex.number} of 24: {ex.title}")
        derivation = notebook._without_code(derivation_text(ex.section), ex)
        assert notebook._local(derivation).rstrip("\n") in source
        assert f"check({ex.yours})" in source and f"hint({ex.number}, 1)" in source
        assert f"compare({ex.yours})" in source and f"where({ex.number})  #" in source[2]
    linear = "".join(cells(workbook / by_name("linear").notebook)[3]["source"])
    assert linear.startswith("## Linear\n\n`Linear` (tinyvit/nn/layers.py) maps the last axis")
    assert "dW &= dy^\\top x" in linear  # the page's LaTeX, as written
    training = workbook / "ex20_training.ipynb"
    assert "".join(cells(training)[-1]["source"]).startswith("train()")


def test_no_notebook_shows_the_librarys_backward_above_the_blank(workbook):
    """The derivation's blocks of code are the answer: left out, with where to find them
    after an attempt. The one block of code shown is the forward, given."""
    for ex in EXERCISES:
        markdown = ["".join(c["source"]) for c in cells(workbook / ex.notebook)
                    if c["cell_type"] == "markdown"]
        blocks = [m for m in markdown if "```python" in m]
        assert len(blocks) == 1 and blocks[0].startswith("## The forward, given"), ex.name
    path = workbook / by_name("attention_core").notebook
    core = "".join("".join(c["source"]) for c in cells(path))
    assert "dS.transpose(0, 1, 3, 2) @ q" not in core
    softmax = "".join("".join(c["source"]) for c in cells(workbook / by_name("softmax").notebook)
                      if c["cell_type"] == "markdown")
    assert "(dA * A).sum(axis=-1, keepdims=True)" not in softmax  # said in a sentence, as code
    assert "(code left out)" in softmax
    assert ("*(The library's code for this step is left out here: it is the answer. After an "
            "attempt that ran, `python -m tinyvit.learn solution 12` shows it.)*") in core


def markdown_of(workbook, name):
    return "".join("".join(c["source"]) for c in cells(workbook / by_name(name).notebook)
                   if c["cell_type"] == "markdown")


def test_no_notebook_shows_another_exercises_answer_or_a_formula_of_its_own(workbook):
    """Ex10's section holds ex11's fused line; ex19's page writes its answer with B where the
    code reads log_probs.shape[0]. Names of functions and attributes stay."""
    assert "(dA * A).sum(axis=-1, keepdims=True)" not in markdown_of(workbook, "softmax_jacobian")
    assert "(xp.exp(log_probs) - t) * (dout / B)" not in markdown_of(workbook, "cross_entropy")
    core = markdown_of(workbook, "attention_core")
    assert "the attention dropout `self.attn_drop` and" in core
    assert "(1, 3, 0, 2, 4)" not in core  # exercise 14's answer
    assert "`tinyvit/data/augment.py` (tinyvit/data/augment.py)" not in markdown_of(
        workbook, "cross_entropy")


def test_the_derivation_is_read_from_the_page_when_the_notebook_is_written(tmp_path,
                                                                            monkeypatch):
    page = tmp_path / "backprop.md"
    page.write_text("# Top\n\n## Linear\n\n$$dW = dy^\\top x$$ [the code](../tinyvit/x.py#L3)\n"
                    "\n### dx\n\nmore\n\n## GELU\n\nnot this\n")
    monkeypatch.setattr(exercises, "BACKPROP", page)
    text = "".join(json.loads(notebook.exercise_notebook(by_name("linear")))["cells"][3]["source"])
    assert text == "## Linear\n\n$$dW = dy^\\top x$$ the code (tinyvit/x.py)\n\n### dx\n\nmore"
    monkeypatch.setattr(exercises, "BACKPROP", tmp_path / "absent.md")
    with pytest.raises(FileNotFoundError, match="the derivations .* are missing from this install"):
        notebook.exercise_notebook(by_name("linear"))


def test_an_install_carries_the_derivations(tmp_path):
    """The wheel holds docs/backprop.md as tinyvit/learn/backprop.md (package data), which
    the notebooks read where tinyvit is installed without its docs/."""
    pytest.importorskip("setuptools", minversion="77")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True,
                   timeout=300)
    wheel = next(tmp_path.glob("tinyvit-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        assert z.read("tinyvit/learn/backprop.md") == (ROOT / "docs" / "backprop.md").read_bytes()


def run_notebook(path):
    """Execute the notebook at ``path`` in a Jupyter kernel in its folder (as JupyterLab
    runs it) with this checkout's tinyvit; returns {a code cell's first line: its outputs}."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}}).execute()
    return {c.source.splitlines()[0]: c.outputs for c in nb.cells if c.cell_type == "code"}


def printed(outputs):
    return "".join(o.get("text", "") for o in outputs if o.output_type == "stream")


def images(outputs):
    return [o for o in outputs if "image/png" in o.get("data", {})]


@pytest.fixture
def kernel_path(monkeypatch):
    """The kernel imports this checkout's tinyvit."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
                                                                                 "")]))


def test_a_blank_notebook_runs_and_its_check_says_so(workbook, kernel_path):
    ex = by_name("batchnorm")
    out = run_notebook(workbook / ex.notebook)
    assert printed(out["check(MyBatchNorm2d)"]).startswith(
        "exercise 23 (BatchNorm2d), case 1 of 3, input (2, 3, 4, 5): not written yet: write "
        "MyBatchNorm2d.backward between the markers of ex23_batchnorm.py (or of "
        "ex23_batchnorm.ipynb)\n")
    assert len(images(out["where(23)  # where the layer sits in the ViT, and its shapes"])) == 1
    assert printed(out["hint(23, 1)"]).startswith("hint 1 of 3 for exercise 23 (BatchNorm2d), "
                                                  "the shapes: from the cache xhat (B, C, H, W)")
    assert Progress(workbook).read() == {23: "blank"}
    again = run_notebook(workbook / ex.notebook)  # run all again: the hint cell says no more
    assert printed(again["hint(23, 1)"]) == printed(out["hint(23, 1)"])


def test_a_notebook_filled_right_passes_in_the_kernel(workbook, kernel_path):
    ex = by_name("linear")
    fill_notebook(workbook / ex.notebook, ex)
    out = run_notebook(workbook / ex.notebook)
    assert printed(out["check(MyLinear)"]) == "exercise 1 (Linear): PASS, every stage of 4 cases\n"
    table = printed(out["compare(MyLinear)"]).splitlines()
    assert [row.split()[0] for row in table] == ["input", "weight", "bias"]
    assert all("exact: " in row and "close: True" in row for row in table)
    assert Progress(workbook).read() == {1: "pass"}


def test_a_mistake_in_a_notebook_prints_the_staged_failure_and_draws_it(workbook, kernel_path):
    ex = by_name("linear")
    fill_notebook(workbook / ex.notebook, ex, BIAS_MEAN)
    out = run_notebook(workbook / ex.notebook)["check(MyLinear)"]
    said = printed(out)
    assert said.startswith("exercise 1 (Linear), case 1 of 4, input (3, 7): bias's gradient "
                           "differs from the library's")
    assert "the fix, found by trying" in said and "-> self.bias.grad += dout2.sum(axis=0)" in said
    assert "of your notebook's cell (MyLinear.backward):" in said
    assert "; a hint: the cell hint(1, 1) below\n" in said  # the notebook's own hint cell
    picture = workbook / "ex01_linear.difference.png"
    assert said.endswith(f"The difference, drawn: {picture}\n") and picture.is_file()
    assert len(images(out)) == 1
    assert Progress(workbook).read() == {1: "fail"}


def run_together(paths):
    """The code cells of every notebook at ``paths``, in turn, executed in one Jupyter kernel
    (one start for all of them) in their folder; returns, per notebook, its code cells'
    (source, outputs). A cell that raises fails the run."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    together, owners = nbformat.v4.new_notebook(), []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                together.cells.append(cell)
                owners.append(path)
    nbclient.NotebookClient(together, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(paths[0].parent)}}).execute()
    found = {path: [] for path in paths}
    for path, cell in zip(owners, together.cells):
        found[path].append((cell.source, cell.outputs))
    return found


def test_every_notebook_runs_blank_and_then_filled_with_the_librarys_code(workbook,
                                                                           kernel_path):
    """Blank: each check cell says what to write, and no cell raises. Filled with tinyvit's
    own backward: each check passes, each comparison is close, each picture is drawn. The
    training exercise's notebook runs blank (its training is tested in
    ``test_the_training_runs_on_the_exercises_passed_so_far``)."""
    paths = [workbook / ex.notebook for ex in EXERCISES]
    training_notebook = workbook / TRAINING_FILE.replace(".py", ".ipynb")
    blank = run_together(paths + [training_notebook])
    for ex, path in zip(EXERCISES, paths):
        said = {source.splitlines()[0]: outputs for source, outputs in blank[path]}
        assert ": not written yet: write " in printed(said[f"check({ex.yours})"])
        assert len(images(said[f"where({ex.number})  # where the layer sits in the ViT, and "
                                "its shapes"])) == 1
    assert "none of exercises 1-19 has passed yet" in printed(blank[training_notebook][-1][1])
    for ex, path in zip(EXERCISES, paths):
        fill_notebook(path, ex)
    filled = run_together(paths)
    for ex, path in zip(EXERCISES, paths):
        said = {source.splitlines()[0]: outputs for source, outputs in filled[path]}
        assert re.fullmatch(rf"exercise {ex.number} \(.+\): PASS, every stage of \d+ cases?\n",
                            printed(said[f"check({ex.yours})"]))
        table = printed(said[f"compare({ex.yours})"]).splitlines()
        assert table and all("close: True" in row for row in table)
    assert Progress(workbook).read() == {TRAINING: "blank",
                                         **{ex.number: "pass" for ex in EXERCISES}}


def test_a_failure_under_pytest_draws_the_difference_beside_the_file(workbook):
    """A bias averaged over the 3 rows, not summed: every entry of its gradient is 1/3 of
    the library's, the difference two thirds of it, the largest entries outlined."""
    ex = by_name("linear")
    path = workbook / ex.filename
    path.write_text(fill(path.read_text(), ex).replace(*BIAS_MEAN))
    with pytest.raises(ExerciseFailed) as failed:
        load_exercise(path).test_linear()
    picture = workbook / "ex01_linear.difference.png"
    assert str(failed.value).splitlines()[-1] == f"The difference, drawn: {picture}"
    pixels = np.asarray(Image.open(picture).convert("RGB"))
    assert pixels.shape[1] > 300 and (pixels == (33, 33, 33)).all(axis=-1).sum() > 100
    path.write_text(path.read_text().replace(*BIAS_MEAN[::-1]))  # the mistake corrected
    load_exercise(path).test_linear()
    assert not picture.exists()  # a picture of a difference there is no longer


def test_the_diagram_highlights_the_layer_and_names_a_wrong_box():
    plain = np.asarray(block_diagram(set()))
    lit = np.asarray(block_diagram({"batchnorm"}, "(2, 3, 4, 5) -> (2, 3, 4, 5)"))
    assert not (plain == FILL).all(axis=-1).any()
    assert (lit == FILL).all(axis=-1).sum() > 1000 and (lit == EDGE).all(axis=-1).sum() > 100
    with pytest.raises(ValueError, match=r"block_diagram: no box \['batch_norm'\]; the boxes"):
        block_diagram({"batch_norm"})


TOKENS = re.compile(r"\([^()]*\)|[A-Za-z_]\w*|\d+(?:\.\d+)?|\*\*|[-+*/^=@]")  # shapes as one


@pytest.mark.parametrize("ex", EXERCISES, ids=lambda ex: ex.name)
def test_each_hint_says_what_the_ones_before_it_did_not(ex):
    """Each level holds 3 tokens (names, numbers, operators, parenthesised groups) or more
    that no level before it holds; level 1 names shapes, level 2 leaves one term out, and
    no equation of level 3 (the formula) is in level 2."""
    shapes, chain, formula = HINTS[ex.name]
    seen = set()
    for level in (shapes, chain, formula):
        tokens = set(TOKENS.findall(level))
        assert len(tokens - seen) >= 3, (level, tokens - seen)
        seen |= tokens
    assert "shape" in shapes or re.search(r"\((\.\.\., )?\w+(, [\w*^ +]+)*,?\)", shapes)
    assert "cache" in shapes  # what the backward takes from it, or that it has none
    assert chain.count(HOLE) == 1 and HOLE not in shapes + formula
    equations = [part.strip() for part in re.split(r"; |: ", formula) if "=" in part]
    assert equations and not [e for e in equations if e in chain]


def test_after_the_third_hint_there_are_no_more(workbook, capsys):
    for _ in range(5):
        assert command.main(["hint", "23", str(workbook)]) == 0
    calls = capsys.readouterr().out.split("hint 1 of 3")[1:]
    assert len(calls) == 3
    done = ("no more hints for exercise 23 (BatchNorm2d): python -m tinyvit.learn solution 23 "
            "shows tinyvit's code")
    assert calls[-1].splitlines()[-3:] == [
        f"The derivation: {exercises.BACKPROP}#batchnorm2d", done, done]  # not hints again


def test_a_hint_of_a_level_shows_up_to_it_and_keeps_the_highest_shown(workbook, capsys,
                                                                      monkeypatch):
    from tinyvit.learn import cells
    monkeypatch.chdir(workbook)
    cells.hint(23, 2)
    cells.hint(23, 1)
    first, second = capsys.readouterr().out.split("hint 1 of 3")[1:]
    assert first.count("\nhint ") == 1 and second.count("\nhint ") == 0  # levels 2, then 1
    assert json.loads((workbook / ".learn-hints.json").read_text()) == {"23": 2}
    with pytest.raises(ValueError, match="hint: expected a level of 1 to 3, got 4"):
        cells.hint(23, 4)


def test_a_solution_shows_its_method_then_what_it_calls_in_the_order_they_run():
    batchnorm = solution(by_number(23))
    heads = [line for line in batchnorm.splitlines() if line.startswith("# ")]
    assert heads == ["# tinyvit.nn.conv.BatchNorm2d.backward",
                     "# tinyvit.nn.conv.BatchNorm2d.channel_mean",
                     "# tinyvit.nn.functional.standardize_backward"]
    assert "def standardize_backward(g, xhat, rstd, axes, average=None):" in batchnorm
    attention = solution(by_number(15))
    assert [line for line in attention.splitlines() if line.startswith("# ")] == [
        "# tinyvit.nn.layers.Attention.backward", "# tinyvit.nn.layers.split_heads_grad",
        "# tinyvit.nn.layers.Attention.attend_backward",
        "# tinyvit.nn.functional.softmax_backward", "# tinyvit.nn.layers.merge_qkv_grads",
        "# the backward passes of the layers it calls, each an exercise of its own:",
        "# Dropout.backward (exercise 5), Linear.backward (exercise 1)"]
    assert solution(by_number(2)).startswith("# tinyvit.nn.layers.Tanh.backward\ndef backward(")


def test_the_training_runs_on_the_exercises_passed_so_far(workbook, capsys, monkeypatch):
    """Linear written in its notebook, LayerNorm in its file, both passed: the model trains
    on those two of the learner's and the library's other layers, and says so (3 steps)."""
    monkeypatch.setattr(training, "STEPS", 3)
    linear, layernorm = by_name("linear"), by_name("layernorm")
    fill_notebook(workbook / linear.notebook, linear)
    path = workbook / layernorm.filename
    path.write_text(fill(path.read_text(), layernorm))
    for ex in (linear, layernorm):
        Progress(workbook).record(ex.number, "pass")
    yours, said = _learners_classes(workbook, [1, 9])
    assert set(yours) == {Linear, LayerNorm}
    assert yours[Linear].backward.__code__.co_filename == str(workbook / linear.notebook)
    check_training(workbook)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"exercise {TRAINING} (training): PASS, 3 steps")
    assert lines[1] == ("yours: Linear (1), LayerNorm, fused (9); the library's: every other "
                        "layer (exercises not passed: 3, 5, 6, 7, 11, 12, 13, 14, 15, 16, 17, "
                        "18, 19)")  # not those whose code the preset never runs: 2, 4, 8, 10
    assert lines[-1] == f"The curves, drawn: {workbook / 'ex20_training.png'}"
    width, height = Image.open(workbook / "ex20_training.png").size
    assert width > 800 and height > 300


def test_a_wrong_head_shows_as_its_own_maps(tmp_path):
    """dq (B, NH, N, Dh) = (2, 2, 5, 4), head 1 off by 0.5 in both images: a grid of four
    N x Dh maps, the two of head 1 in coolwarm's top colour, the others grey."""
    right = np.random.default_rng(0).normal(size=(2, 2, 5, 4))
    wrong = right.copy()
    wrong[:, 1] += 0.5
    pixels = np.asarray(Image.open(pictures.difference("dq", wrong, right, tmp_path / "d.png")))
    top = (pixels == CMAPS["coolwarm"][-1]).all(axis=-1).sum()
    side = -(-pictures.MAP_PX // 5)  # the scale of a 5 x 4 map: ceil(120 / 5) = 24 px a cell
    assert 2 * (5 * side) * (4 * side) <= top < 2 * (5 * side) * (4 * side) + 200  # + the bar


def test_the_comparison_says_a_wrong_shape_and_what_raised():
    def softmax_backward(A, dA):
        return dA[..., :1]

    assert comparison(softmax_backward) == [
        "input yours has shape (2, 3, 1), the library's (2, 3, 5)"]

    def merge_qkv_grads(dq, dk, dv):
        raise NotImplementedError("exercise 14: write merge_qkv_grads here")

    assert comparison(merge_qkv_grads)[0].startswith(
        "your backward raised NotImplementedError: exercise 14: write merge_qkv_grads here at "
        "line ")
