"""The workbook's exercises, in order: from one line to the whole model, then the
hybrid's stem. Each names the library's own code that the learner writes again
(``reference``: a layer's method, or a function), how to build it for the checks
(``cases``), what the blank asks for, with every shape (``task``); ``hints.py`` holds their
hints.

Shapes follow docs/backprop.md's legend: B batch, N tokens, D features, NH heads,
Dh head dim, Q query rows, M rows, K classes, C channels, F filters.
"""

import dataclasses
from pathlib import Path

from ..backend import default_dtype, host_rng, using_backend, xp
from ..gradcheck import jitter, randn, seeded_dropout
from ..gradcheck.report import anchor
from ..models import ViT
from ..nn import conv, functional, layers
from ..nn.loss import SoftmaxCrossEntropy
from . import harness
from .steps import LayerNormSteps, softmax_jacobian_backward

TRACKS = {"vit": "the Vision Transformer", "stem": "the hybrid's convolutional stem"}
# the derivations: the page in a checkout of tinyvit, else the package's copy of it (package
# data, built from the same file: tinyvit/learn/backprop.md links to docs/backprop.md)
CHECKOUT = Path(__file__).resolve().parents[2] / "docs" / "backprop.md"
BACKPROP = CHECKOUT if CHECKOUT.is_file() else Path(__file__).with_name("backprop.md")


def derivation(section):
    """Where ``section`` of docs/backprop.md is: the page in this checkout of tinyvit (or
    in the installed package), by its path, or the page in tinyvit's repository where
    tinyvit came without it."""
    if BACKPROP.is_file():
        return f"{BACKPROP}#{anchor(section)}"
    return f"docs/backprop.md#{anchor(section)} in tinyvit's repository"


def derivation_text(section):
    """The Markdown of ``section`` of docs/backprop.md, its heading first, up to the next
    heading of its level or above: read when a notebook is written, so the two agree."""
    if not BACKPROP.is_file():
        raise FileNotFoundError(f"the derivations ({BACKPROP}) are missing from this "
                                "install of tinyvit: reinstall it (pip install tinyvit), or "
                                "install it from a checkout (pip install -e .)")
    lines = BACKPROP.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines)
              if line.startswith("#") and line.lstrip("#").strip() == section]
    if not starts:
        raise LookupError(f"{BACKPROP} has no section {section!r}")
    level = len(lines[starts[0]]) - len(lines[starts[0]].lstrip("#"))
    end = next((i for i in range(starts[0] + 1, len(lines)) if lines[i].startswith("#")
                and len(lines[i]) - len(lines[i].lstrip("#")) <= level), len(lines))
    return "\n".join(lines[starts[0]:end]).strip() + "\n"


@dataclasses.dataclass(frozen=True)
class Exercise:
    number: int
    name: str  # the exercise's file is ex{number:02d}_{name}.py
    title: str
    track: str  # a key of TRACKS
    reference: object  # the library's class whose method is written again, or its function
    method: str  # that method ("backward", "attend_backward"); "" for a function
    yours: str  # the learner's class or function, as the file names it
    forward: object  # what the file quotes: the forward the learner differentiates
    section: str  # the heading of docs/backprop.md that derives it
    intro: str
    task: str  # the comment above the blank: what is given, what to compute, every shape
    cases: tuple = ()  # build(make) -> (module, inputs, before_forward), make a class or function
    imports: tuple = ()  # names the file imports for the learner, as (module, name)

    @property
    def filename(self):
        return f"ex{self.number:02d}_{self.name}.py"

    @property
    def notebook(self):
        return f"ex{self.number:02d}_{self.name}.ipynb"

    @property
    def is_function(self):
        return not self.method

    def first_case(self, run):
        """``run(module, inputs, output)`` on the library's layer of the first case after its
        forward, in float64 on NumPy (what the pictures and the solution show)."""
        with using_backend("numpy"), default_dtype("float64"):
            module, inputs, before_forward = self.cases[0](self.reference)
            if before_forward:
                before_forward()
            return run(module, inputs, module.forward(*inputs))


def _linear(make, shape, bias=True):
    return jitter(make(7, 5, bias=bias, rng=host_rng(0))), (randn(*shape),), None


def _plain(make, shape, scale=2.0, *args):
    return make(*args), (scale * randn(*shape),), None


def _dropout(make, shape, p=0.3, training=True):
    layer = make(p).train(training)
    return layer, (randn(*shape),), seeded_dropout(layer)


def _residual(make, shape):
    branch = jitter(layers.Linear(shape[-1], shape[-1], rng=host_rng(0)))
    return make(branch), (randn(*shape),), None


def _layernorm(make, shape):
    return jitter(make(shape[-1])), (randn(*shape),), None


def _attention(make, shape, heads=2, attn_dropout=0.0, proj_dropout=0.0):
    layer = jitter(make(shape[-1], heads, attn_dropout=attn_dropout, proj_dropout=proj_dropout,
                        rng=host_rng(0)))
    return layer, (randn(*shape),), seeded_dropout(layer)


def _mlp(make, shape, dropout=0.0):
    layer = jitter(make(shape[-1], 2 * shape[-1], dropout, rng=host_rng(0)))
    return layer, (randn(*shape),), seeded_dropout(layer)


def _block(make, shape, dropout=0.0):
    layer = jitter(make(shape[-1], 2, 2.0, dropout=dropout, attn_dropout=dropout,
                        rng=host_rng(0)))
    return layer, (randn(*shape),), seeded_dropout(layer)


TINY_VIT = dict(image_size=8, patch_size=4, in_channels=2, num_classes=3, embed_dim=8, depth=2,
                num_heads=2)


def _vit(make, batch, pool, dropout=0.0):
    model = jitter(make(**TINY_VIT, pool=pool, dropout=dropout, attn_dropout=dropout))
    return model, (randn(batch, 2, 8, 8),), lambda: model.seed_dropout(5)


def _loss(make, batch, classes, soft):
    target = (functional.softmax(randn(batch, classes, seed=3)) if soft
              else xp.asarray(host_rng(3).integers(0, classes, batch)))
    return make(0.1), (randn(batch, classes), target), None


def _conv(make, shape, *args, **options):
    return jitter(make(*args, rng=host_rng(0), **options)), (randn(*shape),), None


def _norm(make, shape, *args):
    return jitter(make(*args)), (randn(*shape),), None


def cases(build, *shapes):
    """One case per shape: ``build(make, shape)``."""
    return tuple((lambda make, shape=shape: build(make, shape)) for shape in shapes)


# the two softmax exercises (the Jacobian, then fused) check the same cases
SOFTMAX_CASES = cases(lambda make, shape: (harness.Softmax(make), (2 * randn(*shape),), None),
                      (2, 3, 5), (1, 1, 7), (4, 9))

EXERCISES = (
    Exercise(
        1, "linear", "Linear", "vit", layers.Linear, "backward", "MyLinear",
        layers.Linear.forward, "Linear",
        "y = x W^T + b over the last axis: the layer every other one is built around.",
        """The cache: x2 = self._take_cache(), the forward's input as rows (M, in).
dout: (..., out), the gradient of the loss at y; dout.reshape(-1, self.out_features)
is (M, out). Add dW (out, in) to self.weight.grad and db (out,) to self.bias.grad (+=:
gradients accumulate; self.bias is None in a layer without one, as in one case); return dx,
shaped as the forward's input (..., in).""",
        (*cases(_linear, (3, 7), (2, 9, 7), (1, 7)),
         lambda make: _linear(make, (4, 7), bias=False)),
    ),
    Exercise(
        2, "tanh", "Tanh", "vit", layers.Tanh, "backward", "MyTanh", layers.Tanh.forward, "Tanh",
        "y = tanh(x), elementwise: the backward is a multiply by the local derivative.",
        """The cache: y = self._take_cache(), the forward's output, shaped as x.
dout: shaped as y. Return dx, shaped as x: no parameters.""",
        cases(_plain, (3, 7), (2, 5, 9), (1, 1, 4)),
    ),
    Exercise(
        3, "gelu", "GELU, the exact form", "vit", layers.GELU, "backward", "MyGELU",
        layers.GELU.forward, "GELU",
        "y = x Phi(x), Phi the standard normal CDF (as torch.nn.GELU()).",
        """The cache: x = self._take_cache(), the forward's input. dout: shaped as x.
Return dx, shaped as x. The normal CDF and density are normal_cdf and normal_pdf
(imported above). (This layer's approximate is "none"; exercise 4 is the tanh form.)""",
        cases(_plain, (3, 7), (2, 5, 9), (1, 1, 4)),
        (("tinyvit.backend", "xp"), ("tinyvit.nn.functional", "normal_cdf"),
         ("tinyvit.nn.functional", "normal_pdf"), ("tinyvit.nn.layers", "TANH_A"),
         ("tinyvit.nn.layers", "TANH_C")),
    ),
    Exercise(
        4, "gelu_tanh", "GELU, the tanh form", "vit", layers.GELU, "backward", "MyGELUTanh",
        layers.GELU.forward, "GELU",
        "y = x (1 + tanh(c (x + a x^3))) / 2, c = sqrt(2/pi), a = 0.044715 (TANH_C, TANH_A).",
        """The cache: x = self._take_cache(). dout: shaped as x. Return dx, shaped as x.
(This layer's approximate is "tanh"; write the exact form too if you like, as exercise 3.)""",
        cases(lambda make, shape: _plain(make, shape, 2.0, "tanh"), (3, 7), (2, 5, 9), (1, 1, 4)),
        (("tinyvit.backend", "xp"), ("tinyvit.nn.functional", "normal_cdf"),
         ("tinyvit.nn.functional", "normal_pdf"), ("tinyvit.nn.layers", "TANH_A"),
         ("tinyvit.nn.layers", "TANH_C")),
    ),
    Exercise(
        5, "dropout", "Dropout", "vit", layers.Dropout, "backward", "MyDropout",
        layers.Dropout.forward, "Dropout",
        "Inverted dropout: in training each entry is kept with probability 1 - p and "
        "scaled by 1/(1 - p).",
        """The cache: mask = self._take_cache(): 0 or 1/(1-p) per entry, shaped as x, or the
number 1.0 when nothing was dropped (eval mode, or p = 0). dout: shaped as x. Return dx.""",
        (*cases(_dropout, (3, 7), (2, 5, 9), (1, 4)),
         lambda make: _dropout(make, (2, 3), p=0.0),  # nothing dropped: the cache is 1.0
         lambda make: _dropout(make, (3, 2), training=False)),  # eval: nothing dropped either
    ),
    Exercise(
        6, "residual", "Residual", "vit", layers.Residual, "backward", "MyResidual",
        layers.Residual.forward, "Residual connections: gradients add up",
        "y = x + f(x) for a branch f (a Sequential of layers).",
        """No cache of its own. self.branch.backward(d) is the branch's backward: it returns the
branch's input gradient for an upstream gradient d. dout: shaped as x. Return dx.""",
        cases(_residual, (2, 5, 8), (1, 3, 8), (3, 1, 8)),
    ),
    Exercise(
        7, "patchify", "Patchify", "vit", layers.Patchify, "backward", "MyPatchify",
        layers.Patchify.forward, "Patchify moves entries",
        "Images cut into P x P patches, each flattened: a reshape and a transpose, no arithmetic.",
        """The cache: the input's shape, B, C, H, W = self._take_cache(); P = self.patch_size,
gh, gw = H // P, W // P. dout: (B, gh*gw, C*P*P). Return dx (B, C, H, W).""",
        cases(lambda make, shape: _plain(make, shape, 1.0, 4), (2, 2, 8, 8), (1, 3, 8, 20),
              (3, 1, 4, 4)),
    ),
    Exercise(
        8, "layernorm_steps", "LayerNorm, step by step", "vit", LayerNormSteps, "backward",
        "MyLayerNormSteps", LayerNormSteps.forward, "dx, step by step",
        "LayerNorm through each of its intermediates, the last step first, as "
        "'Becoming a backprop ninja' does BatchNorm. Your gradient of every intermediate is "
        "compared with the library's, one by one.",
        """The cache: xmu, var, rstd, xhat = self._take_cache(): xmu, xhat (..., D); var,
rstd (..., 1). D = xmu.shape[-1]. dout: (..., D). Add dgamma (D,) to self.weight.grad and
dbeta (D,) to self.bias.grad; set self.intermediate_grads = {"xhat": ..., "rstd": ...,
"var": ..., "xmu": ..., "mean": ...}, each shaped as its intermediate (dxmu with both of
its uses added); return dx (..., D).""",
        cases(_layernorm, (2, 5, 8), (1, 1, 8), (3, 7, 8)),
    ),
    Exercise(
        9, "layernorm", "LayerNorm, fused", "vit", layers.LayerNorm, "backward", "MyLayerNorm",
        layers.LayerNorm.forward, "LayerNorm",
        "The same LayerNorm, its backward in one formula (the one the library uses).",
        """The cache: xhat, rstd = self._take_cache(): xhat (..., D), rstd (..., 1).
dout: (..., D). Add dgamma (D,) and dbeta (D,) to the parameters' .grad (self.column_sum(a, b)
sums a * b over every axis but the last); return dx (..., D). (The library's own is
standardize_backward, in tinyvit/nn/functional.py: write the formula yourself.)""",
        cases(_layernorm, (2, 5, 8), (1, 1, 8), (3, 7, 8)),
    ),
    Exercise(
        10, "softmax_jacobian", "softmax, through its Jacobian", "vit", softmax_jacobian_backward,
        "", "softmax_jacobian_backward", functional.softmax, "Softmax: its Jacobian, applied "
        "without forming it",
        "A = softmax(S) over the last axis. Form each row's Jacobian dA_j/dS_k as an array, "
        "then multiply by it.",
        """A: the forward's output (..., N), each row summing to 1. dA: (..., N), the gradient at A.
Return dS (..., N). Form J (..., N, N) with J[..., j, k] = dA_j/dS_k (xp.eye helps: give it
dtype=A.dtype), then
dS = dA J, row by row.""",
        SOFTMAX_CASES,
        (("tinyvit.backend", "xp"),),
    ),
    Exercise(
        11, "softmax", "softmax, fused", "vit", functional.softmax_backward, "",
        "softmax_backward", functional.softmax, "Softmax: its Jacobian, applied without forming it",
        "The same backward without forming J: one line, N times fewer operations per row.",
        """A: the forward's output (..., N). dA: (..., N). Return dS (..., N), without an
(N, N) array.""",
        SOFTMAX_CASES,
        (("tinyvit.backend", "xp"),),
    ),
    Exercise(
        12, "attention_core", "the attention core", "vit", layers.Attention, "attend_backward",
        "MyAttentionCore", layers.Attention.attend, "Multi-head self-attention",
        "S = q k^T / sqrt(Dh), A = softmax(S), Ad = dropout(A), ctx = Ad v, for every head at "
        "once.",
        """The cache: q, k, v, A, Ad = self._take_cache(): q (B, NH, Q, Dh); k, v (B, NH, N, Dh);
A, Ad (B, NH, Q, N). dctx: (B, NH, Q, Dh). self.scale is 1/sqrt(Dh);
self.attn_drop.backward(d) is dropout's backward; softmax_backward(A, dA) is the library's
exercise 11. Return dq, dk, dv, shaped as q, k, v.""",
        (lambda make: _attention(make, (2, 5, 8)),
         lambda make: _attention(make, (1, 17, 12), heads=4, attn_dropout=0.3),
         lambda make: _attention(make, (3, 1, 8)),
         lambda make: _attention(make, (2, 6, 10), heads=2, attn_dropout=0.2)),
        (("tinyvit.nn.functional", "softmax_backward"),),
    ),
    Exercise(
        13, "merge_heads", "merging the heads", "vit", layers.split_heads_grad, "",
        "split_heads_grad", layers.merge_heads, "The output projection, and merging the heads",
        "The heads' outputs side by side again: (B, NH, N, Dh) -> (B, N, NH*Dh). Its backward "
        "splits the gradient back into heads.",
        """dctx: (B, N, NH*Dh), the gradient of the merged heads; num_heads: NH.
Return the gradient of ctx, (B, NH, N, Dh).""",
        cases(lambda make, shape: (harness.MergeHeads(make), (randn(*shape),), None),
              (2, 2, 5, 4), (1, 3, 7, 2), (3, 1, 1, 5)),
    ),
    Exercise(
        14, "split_heads", "splitting q, k, v into heads", "vit", layers.merge_qkv_grads, "",
        "merge_qkv_grads", layers.split_heads, "Undoing the head split: the fused qkv projection",
        "The fused projection's output (B, N, 3D) split into q, k, v, each (B, NH, N, Dh). Its "
        "backward stacks the three gradients back into one.",
        """dq, dk, dv: each (B, NH, N, Dh). Return dqkv (B, N, 3 * NH * Dh), q's gradient in the
first D columns, then k's, then v's, each with its heads side by side.""",
        cases(lambda make, shape, heads=2: (harness.SplitHeads(make, heads), (randn(*shape),),
                                            None),
              (2, 5, 24), (1, 7, 12), (3, 1, 24)),
        (("tinyvit.backend", "xp"),),
    ),
    Exercise(
        15, "attention", "Attention", "vit", layers.Attention, "backward", "MyAttention",
        layers.Attention.forward, "Multi-head self-attention",
        "The whole layer: the qkv projection, the heads, the core, the output projection.",
        """No cache of its own: each part keeps its own. self.proj, self.qkv: Linear;
self.proj_drop: Dropout; self.attend_backward(dctx) is exercise 12; split_heads_grad and
merge_qkv_grads are exercises 13 and 14 (the library's, imported above).
dout: (B, N, D). Return dx (B, N, D).""",
        (lambda make: _attention(make, (2, 5, 8)),
         lambda make: _attention(make, (1, 17, 12), heads=4, attn_dropout=0.2, proj_dropout=0.3)),
        (("tinyvit.nn.layers", "merge_qkv_grads"), ("tinyvit.nn.layers", "split_heads_grad")),
    ),
    Exercise(
        16, "mlp", "MLP", "vit", layers.MLP, "backward", "MyMLP", layers.MLP.forward, "MLP",
        "fc1 (D -> Dm), GELU, dropout, fc2 (Dm -> D), dropout: a Sequential of five layers.",
        """No cache of its own. self.layers lists the five layers in the forward's order, each
with its backward. dout: (B, N, D). Return dx (B, N, D).""",
        (lambda make: _mlp(make, (2, 5, 8)), lambda make: _mlp(make, (1, 3, 8), dropout=0.3)),
    ),
    Exercise(
        17, "block", "the encoder block", "vit", layers.Block, "backward", "MyBlock",
        layers.Block.forward, "The pre-norm encoder block",
        "x = x + Attention(LayerNorm(x)), then x = x + MLP(LayerNorm(x)) (ViT, eqs. 2-3).",
        """No cache of its own. self.attn_residual and self.mlp_residual are Residual layers
(exercise 6) around norm1 and attention, norm2 and the MLP. dout: (B, N, D). Return dx
(B, N, D).""",
        (lambda make: _block(make, (2, 5, 8)), lambda make: _block(make, (1, 3, 8), dropout=0.2)),
    ),
    Exercise(
        18, "vit", "the model's own backward", "vit", ViT, "backward", "MyViT", ViT.forward,
        "Class token and position embedding",
        "The class token, the position embedding and the pooling: what the ViT itself does "
        "around its blocks, for both poolings.",
        """The cache: B, N, D = self._take_cache(), the shape of the last block's output:
N = G^2 + 1 tokens (the class token and G^2 patches), or N = 1 under class-token pooling,
whose last block computes the class token's row alone and whose backward gives back all
G^2 + 1 rows. dlogits: (B, K). Go back through self.head, self.pre_logits (when not None),
self.norm, the pooling (self.config.pool: "cls" or "mean"), self.blocks (reversed),
self.pos_drop; add the class token's gradient (1, 1, D) and the position embedding's
(1, G^2 + 1, D) to their .grad; return self.patch_embed's backward of the patch rows:
dx (B, C, H, W). The pooling's derivation: """ + derivation("Pooling and the head") + ".",
        (lambda make: _vit(make, 2, "cls"), lambda make: _vit(make, 1, "mean"),
         lambda make: _vit(make, 2, "mean", dropout=0.2)),
        (("tinyvit.backend", "xp"),),
    ),
    Exercise(
        19, "cross_entropy", "softmax cross-entropy", "vit", SoftmaxCrossEntropy, "backward",
        "MyCrossEntropy", SoftmaxCrossEntropy.forward, "Softmax cross-entropy",
        "The loss: mean over the batch of -sum_k t_k log softmax(z)_k, with label smoothing "
        "or soft targets t.",
        """The cache: log_probs, t = self._take_cache(): log softmax of the logits (B, K) and
the target distributions (B, K), each row summing to 1. dout: the upstream gradient of the
loss, a number (1.0 when the loss is the end). Return dlogits (B, K).""",
        (lambda make: _loss(make, 4, 5, False), lambda make: _loss(make, 3, 6, True),
         lambda make: _loss(make, 1, 3, False)),
        (("tinyvit.backend", "xp"),),
    ),
    Exercise(
        21, "col2im", "im2col's backward, col2im", "stem", conv.col2im, "", "col2im",
        conv.sliding_windows,
        "Conv2d as a matmul on im2col columns",
        "A convolution reads overlapping windows of the padded image; their gradients go back "
        "into the pixels they were read from, summed where windows overlap.",
        """dwindows: (..., kh, kw, Ho, Wo), the gradient of sliding_windows' view; dxpad:
(..., Hp, Wp), zeros to add into (write into it and return it); stride: (sh, sw). Window
entry [..., i, j, ho, wo] was read from pixel [..., sh*ho + i, sw*wo + j].""",
        (lambda make: (harness.Windows(make, (3, 3), (2, 2), (1, 1)), (randn(2, 3, 7, 7),), None),
         lambda make: (harness.Windows(make, (2, 2), (1, 1), (0, 0)), (randn(1, 2, 5, 6),), None),
         lambda make: (harness.Windows(make, (3, 2), (1, 2), (1, 0)), (randn(2, 1, 4, 5),), None)),
    ),
    Exercise(
        22, "conv2d", "Conv2d", "stem", conv.Conv2d, "backward", "MyConv2d", conv.Conv2d.forward,
        "Conv2d as a matmul on im2col columns",
        "A 2-D convolution as one matmul on the im2col columns; with weight standardization "
        "in its third case.",
        """The cache: cols, w2, rstd, padded_shape = self._take_cache(): the columns (U, M),
U = C*kh*kw, M = B*Ho*Wo; the weight as the matrix the forward multiplied by, (F, U); rstd
(F, 1) under weight standardization, else None; the padded input's shape (C, B, Hp, Wp).
dout: (B, F, Ho, Wo). Add db (F,) and dW (F, C, kh, kw) to the parameters' .grad; return dx
(B, C, H, W). col2im (exercise 21), unpad_spatial and standardize_backward are imported.""",
        (lambda make: _conv(make, (2, 3, 7, 7), 3, 4, 3, 2, 1),
         lambda make: _conv(make, (1, 3, 6, 5), 3, 4, 3, 1, 1),
         lambda make: _conv(make, (2, 3, 5, 5), 3, 4, 3, 1, 1, bias=False,
                            weight_standardization=True),
         lambda make: _conv(make, (1, 2, 6, 5), 2, 3, (3, 2), (2, 1), (1, 0))),
        (("tinyvit.backend", "xp"), ("tinyvit.nn.conv", "col2im"),
         ("tinyvit.nn.conv", "unpad_spatial"), ("tinyvit.nn.functional", "standardize_backward")),
    ),
    Exercise(
        23, "batchnorm", "BatchNorm2d", "stem", conv.BatchNorm2d, "backward", "MyBatchNorm2d",
        conv.BatchNorm2d.forward, "BatchNorm2d",
        "Per channel, normalized over the batch and the pixels: every image's gradient "
        "reaches every other's through the batch's mean and variance.",
        """The cache (training): xhat, rstd, V = self._take_cache(): xhat (B, C, H, W), rstd
(1, C, 1, 1), V = B*H*W the values of a channel. dout: (B, C, H, W). Add dgamma (C,) and
dbeta (C,) to the parameters' .grad; return dx (B, C, H, W).""",
        (lambda make: _norm(make, (2, 3, 4, 5), 3), lambda make: _norm(make, (3, 2, 3, 3), 2),
         lambda make: _norm(make, (1, 4, 3, 2), 4)),
    ),
    Exercise(
        24, "maxpool", "MaxPool2d", "stem", conv.MaxPool2d, "backward", "MyMaxPool2d",
        conv.MaxPool2d.forward, "MaxPool2d",
        "The max of each window: its gradient goes to the one entry that won.",
        """The cache: argmax, padded_shape = self._take_cache(): argmax (B, C, Ho, Wo), the
winning entry of each window in row-major window order (i * kw + j); the padded input's
shape (B, C, Hp, Wp). dout: (B, C, Ho, Wo). Return dx (B, C, H, W). col2im and
unpad_spatial are imported.""",
        (lambda make: _norm(make, (2, 3, 7, 7), 3, 2, 1),
         lambda make: _norm(make, (1, 2, 4, 6), 2),
         lambda make: _norm(make, (2, 2, 5, 7), (2, 3), (1, 2), (1, 1))),
        (("tinyvit.backend", "xp"), ("tinyvit.nn.conv", "col2im"),
         ("tinyvit.nn.conv", "unpad_spatial")),
    ),
)

TRAINING = 20  # the exercise that trains the MNIST preset on the learner's backward passes
STEPS = 200  # its training steps


def by_number(number):
    for exercise in EXERCISES:
        if exercise.number == number:
            return exercise
    raise KeyError(number)


def by_name(name):
    for exercise in EXERCISES:
        if exercise.name == name:
            return exercise
    raise KeyError(name)
