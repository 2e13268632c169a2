"""A wrong backward is reported with its mistake named (tinyvit/gradcheck/diagnose.py):
bugs a learner makes, each planted in a reference layer (monkeypatched for the
test), each with the diagnosis it must produce."""

import pytest

from conftest import jitter, randn
from tinyvit import backend as B
from tinyvit.gradcheck import gradient_check, seeded_dropout
from tinyvit.gradcheck.answer import changes
from tinyvit.models import ViT
from tinyvit.nn import layers
from tinyvit.nn.functional import normal_cdf
from tinyvit.nn.loss import SoftmaxCrossEntropy

pytestmark = pytest.mark.usefixtures("backend")  # each test on NumPy, and on CuPy with a GPU


def failures(report):
    """{tensor name: its findings} of the tensors that failed."""
    return {c.name: c.findings for c in report.checks if not c.passed(report.tol)}


def linear_backward(weight_gradient, bias_gradient, assign=False):
    """Linear.backward with the weight's and the bias's gradients as given."""
    def backward(self, dout):
        x2 = self._take_cache()
        dout2 = dout.reshape(-1, self.out_features)  # (M, out)
        if assign:
            self.weight.grad = weight_gradient(dout2, x2)
        else:
            self.weight.grad += weight_gradient(dout2, x2)
        self.bias.grad += bias_gradient(dout2)
        return (dout2 @ self.weight.data).reshape(*dout.shape[:-1], self.in_features)
    return backward


def check_linear(monkeypatch, backward, features=6):
    monkeypatch.setattr(layers.Linear, "backward", backward)
    return failures(gradient_check(jitter(layers.Linear(8, features, rng=B.host_rng(0))),
                                   randn(2, 5, 8)))


def test_a_bias_gradient_averaged_instead_of_summed(monkeypatch):
    found = check_linear(monkeypatch, linear_backward(lambda dy, x: dy.T @ x,
                                                      lambda dy: dy.mean(axis=0)))
    assert found == {"bias": [
        "computed/expected = 1/10 everywhere: a sum over 10 values (the rows of the batch) "
        "taken as their mean, or a factor of 1/10 too many; a gradient adds up the shares of "
        "every value that used it"]}


def test_a_transposed_weight_gradient(monkeypatch):
    found = check_linear(monkeypatch, linear_backward(lambda dy, x: x.T @ dy,
                                                      lambda dy: dy.sum(axis=0)), features=8)
    assert found == {"weight": [
        "computed is the expected gradient transposed: an (in, out) matrix where (out, in) is "
        "meant (dW = dy^T x, not x^T dy)"]}


def test_a_gradient_assigned_instead_of_accumulated(monkeypatch):
    found = check_linear(monkeypatch, linear_backward(lambda dy, x: dy.T @ x,
                                                      lambda dy: dy.sum(axis=0), assign=True))
    assert found == {"weight": [
        "assigned, not accumulated: a second backward without zero_grad left it as it was "
        "instead of doubling it; gradients add up (+=), so that residual branches and shared "
        "layers sum"]}


def test_a_weight_gradient_wrong_in_one_output_row(monkeypatch):
    def weight_gradient(dy, x):
        dW = dy.T @ x
        dW[2] = 0  # the gradient of output unit 2 dropped
        return dW

    found = check_linear(monkeypatch, linear_backward(weight_gradient, lambda dy: dy.sum(axis=0)))
    assert found == {"weight": ["wrong in whole rows 2 (output units), right in the others"]}


def test_an_upstream_gradient_changed_in_place_is_said_and_not_taken_for_a_ratio(monkeypatch):
    def backward(self, dout):  # right values, but dout doubled in its caller's array
        y = self._take_cache()
        dout *= 2
        return 0.5 * dout * (1.0 - y * y)

    monkeypatch.setattr(layers.Tanh, "backward", backward)
    report = gradient_check(layers.Tanh(), randn(3, 4))
    assert report["input"].rel_err < 1e-9  # measured against dout as it was drawn
    assert str(report).splitlines()[1].endswith(", the values right")
    assert failures(report) == {"input": [
        "the backward changes its upstream gradient in place (dout, or a name for the same "
        "array, with *=, -=, += or a slice written): dout is its caller's too; compute into an "
        "array of your own"]}
    assert [(c.before[0].strip(), c.after[0].strip()) for c in changes(report.fix)] == [
        ("dout *= 2", "dout = dout * 2")]


def check_attention(monkeypatch, attend_backward):
    monkeypatch.setattr(layers.Attention, "attend_backward", attend_backward)
    attention = jitter(layers.Attention(8, num_heads=2, rng=B.host_rng(0)))  # Dh = 4
    return failures(gradient_check(attention, randn(2, 5, 8)))


def test_the_softmax_backward_without_its_row_sum_term(monkeypatch):
    def attend_backward(self, dctx):
        q, k, v, A, Ad = self._take_cache()
        dS = A * (dctx @ v.transpose(0, 1, 3, 2))  # - sum_j dA_j A_j forgotten
        dv = Ad.transpose(0, 1, 3, 2) @ dctx
        return dS @ k * self.scale, dS.transpose(0, 1, 3, 2) @ q * self.scale, dv

    found = check_attention(monkeypatch, attend_backward)
    assert found["qkv.weight"] == ["q rows, every head: wrong", "k rows, every head: wrong",
                                   "v rows, every head: right"]
    *parts, invariant = found["qkv.bias"]
    assert parts == ["q entries, every head: wrong", "k entries, every head: wrong",
                     "v entries, every head: right"]
    assert invariant.startswith(
        "the key bias's gradient must be exactly zero (it adds the same q.b to every score of a "
        "row, and each row of dS sums to zero) but reaches ")
    assert invariant.endswith(
        ": dq is wrong too, so the mistake is in dS, which both use (the softmax backward's "
        "row-sum term, dS = A * (dA - sum_j dA_j A_j)), or in the formulas of dq and dk both")


def test_the_key_gradient_without_its_transpose(monkeypatch):
    def attend_backward(self, dctx):
        q, k, v, A, Ad = self._take_cache()
        dA = dctx @ v.transpose(0, 1, 3, 2)
        dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
        return dS @ k * self.scale, dS @ q * self.scale, Ad.transpose(0, 1, 3, 2) @ dctx  # dS^T

    found = check_attention(monkeypatch, attend_backward)
    assert found["qkv.weight"] == ["q rows, every head: right", "k rows, every head: wrong",
                                   "v rows, every head: right"]
    assert found["qkv.bias"][-1].endswith(
        ": dq, which uses the same dS, is right, so dS is: dk's own formula is wrong, "
        "dk = dS^T q scale")


def test_the_key_gradient_without_its_transpose_and_the_scale_forgotten(monkeypatch):
    def attend_backward(self, dctx):  # dq off by sqrt(Dh) alone: dS is still right
        q, k, v, A, Ad = self._take_cache()
        dA = dctx @ v.transpose(0, 1, 3, 2)
        dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
        return dS @ k, dS @ q, Ad.transpose(0, 1, 3, 2) @ dctx

    found = check_attention(monkeypatch, attend_backward)
    assert found["qkv.bias"][0] == (
        "q entries, every head: computed/expected = 2 = sqrt(Dh), Dh = 4 (the 1/sqrt(Dh) scale "
        "of the scores is missing in the backward, or a factor of 2 too many)")
    assert found["qkv.bias"][-1].endswith(
        ": dq, which uses the same dS, is right but for a constant factor, so dS is: dk's own "
        "formula is wrong, dk = dS^T q scale")


def test_a_loss_gradient_whose_rows_do_not_sum_to_zero(monkeypatch):
    def backward(self, dout=1.0):
        log_probs, t = self._take_cache()
        return (B.xp.exp(log_probs) - 0.9 * t) * (dout / log_probs.shape[0])  # t scaled

    monkeypatch.setattr(SoftmaxCrossEntropy, "backward", backward)
    target = B.to_device(B.host_rng(3).integers(0, 5, 4))
    found = failures(gradient_check(SoftmaxCrossEntropy(0.1), randn(4, 5), target))
    assert found["input"][0].startswith(
        "each row of the logits' gradient must sum to zero (p = softmax(z) and the target t "
        "each sum to 1; adding a constant to a row of logits changes nothing) but its rows "
        "sum to up to ")


def test_the_scale_missing_in_the_backward(monkeypatch):
    def attend_backward(self, dctx):
        q, k, v, A, Ad = self._take_cache()
        dA = dctx @ v.transpose(0, 1, 3, 2)
        dS = A * (dA - (dA * A).sum(axis=-1, keepdims=True))
        return dS @ k, dS.transpose(0, 1, 3, 2) @ q, Ad.transpose(0, 1, 3, 2) @ dctx  # no scale

    found = check_attention(monkeypatch, attend_backward)
    scale = ("every head: computed/expected = 2 = sqrt(Dh), Dh = 4 (the 1/sqrt(Dh) scale of the "
             "scores is missing in the backward, or a factor of 2 too many)")
    assert found["qkv.weight"] == [f"q rows, {scale}", f"k rows, {scale}",
                                   "v rows, every head: right"]
    assert found["qkv.bias"] == [f"q entries, {scale}", "k entries, every head: right",
                                 "v entries, every head: right"]


def test_layernorm_without_the_mean_of_g(monkeypatch):
    def backward(self, dout):
        xhat, rstd = self._take_cache()
        self.weight.grad += self.column_sum(dout, xhat)
        self.bias.grad += self.column_sum(dout)
        g = dout * self.weight.data
        return rstd * (g - xhat * (g * xhat).mean(axis=-1, keepdims=True))  # - mean(g) forgotten

    monkeypatch.setattr(layers.LayerNorm, "backward", backward)
    found = failures(gradient_check(jitter(layers.LayerNorm(8)), randn(2, 5, 8)))
    invariant, term = found["input"]
    assert invariant.startswith("the input gradient must sum to zero over the features of each "
                                "row (adding a constant to a row changes nothing) but its rows "
                                "sum to up to ")
    assert term == ("the term -rstd * mean(g) of dx = rstd * (g - mean(g) - xhat * "
                    "mean(g * xhat)) is missing")
    assert list(found) == ["input"]


def test_the_dropout_mask_not_applied_in_the_backward(monkeypatch):
    def backward(self, dout):
        self._take_cache()
        return dout  # the mask forgotten

    monkeypatch.setattr(layers.Dropout, "backward", backward)
    dropout = layers.Dropout(0.3)
    found = failures(gradient_check(dropout, randn(2, 5, 8),
                                    before_forward=seeded_dropout(dropout)))
    assert found == {"input": [
        "computed is dout as it came: the backward passes the upstream gradient on unchanged "
        "(the forward's mask is not applied: dx = dout * mask)"]}


def test_gelu_without_its_x_phi_term(monkeypatch):
    def backward(self, dout):
        return dout * normal_cdf(self._take_cache())  # + x phi(x) forgotten

    monkeypatch.setattr(layers.GELU, "backward", backward)
    found = failures(gradient_check(layers.GELU(), 2 * randn(2, 5, 8)))
    assert found == {"input": ["the term x * phi(x) of y' = Phi(x) + x * phi(x) is missing"]}


def test_a_residual_branch_whose_gradient_is_not_added(monkeypatch):
    def backward(self, dout):
        self.branch.backward(dout)
        return dout  # + the branch's gradient forgotten

    monkeypatch.setattr(layers.Residual, "backward", backward)
    residual = layers.Residual(jitter(layers.Linear(8, 8, rng=B.host_rng(0))))
    found = failures(gradient_check(residual, randn(2, 5, 8)))
    assert found == {"input": [
        "computed is dout as it came: the backward passes the upstream gradient on unchanged "
        "(the skip's share alone: the branch's gradient is not added, dx = dout + df)"]}


def test_the_class_token_gradient_dropped(monkeypatch):
    def backward(self, dlogits):
        B_, N, D = self._take_cache()
        dpooled = self.norm.backward(self.head.backward(dlogits))
        dx = B.xp.zeros((B_, N, D), dtype=dpooled.dtype)
        dx[:, 0] = dpooled
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        self.pos_embed.grad += dx.sum(axis=0, keepdims=True)  # the class token's line forgotten
        return self.patch_embed.backward(dx[:, 1:])

    monkeypatch.setattr(ViT, "backward", backward)
    model = jitter(ViT(image_size=8, patch_size=4, in_channels=2, num_classes=3, embed_dim=8,
                       depth=1, num_heads=2))
    found = failures(gradient_check(model, randn(2, 2, 8, 8)))
    assert found == {"cls_token": ["computed is zero everywhere: this gradient is never added"]}
