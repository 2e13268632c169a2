"""The README's Python examples run as written, and they show what runs: a backward
edited in tinyvit/nn/layers.py is what the gradient-check example checks and what a
model built by ``create_model`` runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import tinyvit
from conftest import randn
from tinyvit import backend as B
from tinyvit.nn import layers

README = Path(__file__).resolve().parents[1] / "README.md"
NEEDS_DOWNLOADED_WEIGHTS = "load_pretrained("


def python_examples():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_workbook_commands_put_a_learner_on_exercise_1(tmp_path, stripes):
    """The two commands of "Learn backprop by doing", the install left out: the new
    workbook holds the notebook the second opens, and its first failure in pytest is
    exercise 1, not written yet (tests/test_notebooks.py runs that notebook in a kernel)."""
    block = README.read_text().split("## Learn backprop by doing")[1].split("```")[1]
    install, start = block.strip().splitlines()[0].split(" && ")
    assert install == 'pip install -e ".[learn,notebook]"'
    start = start.replace("../shared/data", str(stripes)).replace("python", sys.executable, 1)
    subprocess.run(start.split(), cwd=tmp_path, check=True, capture_output=True)
    enter, rest = block.strip().splitlines()[1].split(" && ")
    assert enter == "cd workbook"
    lab, run = rest.split("# or: ")
    jupyter, command, notebook = lab.split()
    assert (jupyter, command) == ("jupyter", "lab") and (tmp_path / "workbook" / notebook).is_file()
    result = subprocess.run([sys.executable, *run.split()[1:]], cwd=tmp_path / "workbook",
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "exercise 1 (Linear), case 1 of 4, input (3, 7): not written yet: write " \
        "MyLinear.backward between the markers of ex01_linear.py" in result.stdout
    assert "1 failed" in result.stdout


def test_the_examples_run_one_after_another(capsys):
    namespace = {}
    for example in python_examples():
        if NEEDS_DOWNLOADED_WEIGHTS not in example:
            exec(example, namespace)
    out = capsys.readouterr().out
    assert "Layers: reference layers (tinyvit.nn)" in out  # the quickstart's summary
    assert "rel_err" in out  # the gradient check's table
    assert "Linear(650 parameters; fast tinyvit.fast.cpu.Linear)" in out


REFERENCE_ATTEND_BACKWARD = layers.Attention.attend_backward


def _attend_backward_with_half_dk(self, dctx):
    dq, dk, dv = REFERENCE_ATTEND_BACKWARD(self, dctx)
    return dq, 0.5 * dk, dv


def test_an_edited_backward_is_what_is_checked_and_what_runs(monkeypatch):
    """A learner halves the key gradient in ``Attention.attend_backward``."""
    monkeypatch.setattr(layers.Attention, "attend_backward", _attend_backward_with_half_dk)
    example = next(e for e in python_examples() if "gradient_check(layer" in e)
    with pytest.raises(AssertionError, match="gradient check failed"):
        exec(example, {})
    with B.default_dtype("float64"):
        model = tinyvit.create_model("mnist", image_size=8, patch_size=4, embed_dim=8, depth=2,
                                     num_heads=2)
    with pytest.raises(AssertionError) as failed:
        tinyvit.gradient_check(model, randn(2, 1, 8, 8)).assert_ok(tol=1e-7)
    # the last block's keys: computed/expected = 1/2 in every head, its queries and values right
    assert ("blocks.1.attn.qkv (Linear)   docs/backprop.md#linear\n"
            "  FAIL  weight") in str(failed.value)
    assert ("        q rows, every head: right\n"
            "        k rows, every head: computed/expected = 0.5 = 1/sqrt(Dh), Dh = 4 (the "
            "1/sqrt(Dh) scale is applied twice, or a stray factor of 1/2)\n") in str(failed.value)


MY_LAYERS = '''from tinyvit.nn.layers import Linear


class MyLinear(Linear):
    def backward(self, dout):
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)
        self.weight.grad += dout2.T @ x2
        self.bias.grad += dout2.mean(axis=0)
        return (dout2 @ self.weight.data).reshape(*dout.shape[:-1], self.in_features)
'''


def test_the_printed_fix_is_the_one_a_layer_of_ones_own_gets(tmp_path, monkeypatch):
    """The README's failing report, line for line (the search's count and time aside), from
    the layer it describes in its own file."""
    (tmp_path / "my_layers.py").write_text(MY_LAYERS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_layers import MyLinear

    from tinyvit.gradcheck import assert_gradients, randn
    shown = README.read_text().split("it fails with\n\n```\n")[1].split("```")[0].splitlines()
    with pytest.raises(AssertionError) as failed:
        assert_gradients(MyLinear(8, 4), randn(2, 5, 8))
    lines = str(failed.value).splitlines()
    start = lines.index(shown[0])
    timing = re.compile(r"trying \d+ edits of the code in [\d.]+ s")
    assert [timing.sub("", line) for line in lines[start:start + len(shown)]] == [
        timing.sub("", line) for line in shown]
