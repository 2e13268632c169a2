"""The README's Python examples run as written, and they show what runs: a backward
edited in tinyvit/nn/layers.py is what the gradient-check example checks and what a
model built by ``create_model`` runs."""

import re
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
