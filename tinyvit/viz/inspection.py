"""See inside a trained ViT: the ViT paper's inspection pictures, drawn with pillow.

``write_pictures`` (and ``python -m tinyvit.inspect``) writes four PNGs
(Dosovitskiy et al. 2020, figures 6 and 7):

    filters.png               leading principal components of the patch-embedding filters
    pos_embed_similarity.png  cosine similarity of every patch's position embedding with every
                              other's
    attention_distance.png    mean attention distance (pixels) of every head against depth
    attention_maps.png        attention rollout of what the head reads (the class token, or the
                              mean of the patch tokens) over the image, and the last layer's raw
                              attention of the same per head

Computations (each returns host NumPy arrays, ready for ``plot``):

    patch_embed_components(model, k)     (k, C, P, P) principal components, (k,) explained variance
    pos_embed_similarity(model)          (G, G, G, G) cosine similarity of the patches' position
                                         embeddings
    attention_distance(attentions, P)    (depth, NH) attention-weighted query-key distance in pixels
    mean_attention_distance(model, x)    the same averaged over a set of images, running the model
    attention_rollout(attentions, pool)  (B, G, G) the pooled output's rolled-out attention to the
                                         patches
    last_layer_attention(model)          (B, NH, G, G) the pooled output's raw attention in the last
                                         block

Parameters are small and analysed on the host (NumPy after ``to_host``);
attention maps stay on the active backend (``xp``) until they are reduced.

Shape legend (the letters of the legend that heads ``docs/backprop.md``): B images,
depth the number of blocks, NH heads, N tokens = 1 + G*G (class token first), G
patches per side, P patch size in pixels, C channels, D embed_dim.
"""

import contextlib
import math
from pathlib import Path

import numpy as np  # host-side analysis and pictures only

from ..backend import to_device, to_host, xp
from ..nn.functional import softmax
from .canvas import FRAME, INK
from .charts import Panel, Series, line_chart
from .images import image_grid, overlay
from .matrices import heatmap_grid

PICTURES = ("filters.png", "pos_embed_similarity.png", "attention_distance.png",
            "attention_maps.png")
TILE_PX = 112  # images are upscaled to about this many pixels per side
READOUT = {"cls": "class-token", "mean": "mean patch-token"}  # what the head reads, per pooling


# ---------------------------------------------------------------- computations


@contextlib.contextmanager
def _inspection_mode(model):
    """Eval mode with the attention maps kept; the model's modes are restored after."""
    was_training, kept = model.training, model.keeps_attention
    model.eval().keep_attention()
    try:
        yield model
    finally:
        model.train(was_training)
        model.keep_attention(kept)


def _grid_side(num_patches):
    """G for G*G patches; a ValueError for a count that is not a square."""
    side = math.isqrt(num_patches)
    if side * side != num_patches:
        raise ValueError(f"expected a square grid of patches, got {num_patches} patches")
    return side


def patch_embed_components(model, k=28):
    """The top-k principal components of the patch-embedding filters (paper, fig. 7 left).

    The D rows of ``patch_embed.proj.weight`` (D, C*P*P) are D filters, each a
    C x P x P image. PCA over them: subtract the mean filter, take the SVD
    W - mean = U S V^T; the rows of V^T are the components (orthonormal) and
    S_i^2 / sum S^2 is the share of the filters' variance each explains. Each
    component's sign is fixed so its largest-magnitude entry is positive.

    Args:
        model: a ViT.
        k: how many components; at most min(D, C*P*P) are returned.
    Returns:
        components (k, C, P, P) and explained-variance ratios (k,), descending.
    """
    if k < 1:
        raise ValueError(f"patch_embed_components: k must be at least 1, got {k}")
    filters = input_filters(model)  # (D, C, P, P)
    weight = filters.reshape(len(filters), -1).astype(np.float64)  # (D, C*P*P)
    k = min(k, *weight.shape)
    _, s, vt = np.linalg.svd(weight - weight.mean(axis=0), full_matrices=False)
    components = vt[:k]  # (k, C*P*P), orthonormal rows
    peak = np.abs(components).argmax(axis=1)
    components = components * np.sign(components[np.arange(k), peak])[:, None]
    variance = s**2
    ratios = variance[:k] / (variance.sum() or 1.0)
    return components.reshape(k, *filters.shape[1:]), ratios


def input_filters(model):
    """The learned filters that look at the input pixels, (D, C, P, P) on the host:
    the patch embedding's, or for a hybrid the stem's first convolution's."""
    if model.config.stem:
        return to_host(model.patch_embed.backbone.conv1.weight.data)
    return to_host(model.patch_embed.weight_to_conv(model.patch_embed.proj.weight.data))


def pos_embed_similarity(model):
    """Cosine similarity of the patches' position embeddings (paper, fig. 7 centre).

    With e_i the embedding of patch i (the class token's row left out),
    sim[r, c, r', c'] = e_(r,c) . e_(r',c') / (|e_(r,c)| |e_(r',c')|), so
    ``sim[r, c]`` is a (G, G) map of how patch (r, c)'s embedding resembles every
    patch's. The diagonal is 1 (for nonzero embeddings); values are clipped to [-1, 1].

    Returns:
        (G, G, G, G) float64.
    """
    pe = to_host(model.pos_embed.data)[0, 1:].astype(np.float64)  # (G*G, D)
    G = _grid_side(len(pe))
    norms = np.linalg.norm(pe, axis=1, keepdims=True)  # (G*G, 1)
    unit = pe / np.maximum(norms, np.finfo(np.float64).tiny)
    return np.clip(unit @ unit.T, -1.0, 1.0).reshape(G, G, G, G)


def patch_distances(grid, patch_size):
    """(G*G, G*G) distances in pixels between patch centres, patches in row-major
    order: patch_size * Euclidean distance of their (row, col) grid positions."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)  # (G*G,) each
    return patch_size * np.hypot(rows[:, None] - rows, cols[:, None] - cols)


def attention_distance(attentions, patch_size):
    """Mean attention distance of every layer and head, from given attention maps.

    The class token has no position, so it is dropped both as a query and as a
    key, and each patch query's row is renormalized over the patch keys:

        Ã_ij = A_ij / sum_k A_ik                        i, j, k patches (1 .. N-1)
        dist = mean over images and queries i of  sum_j Ã_ij * d_ij

    with d_ij the distance between the centres of patches i and j in pixels
    (``patch_distances``). Uniform attention gives the mean pairwise distance;
    attention on itself only gives 0. (A row with all its weight on the class
    token counts as distance 0.)

    Args:
        attentions: one (B, NH, N, N) array per block, rows = queries (``model.attention_maps()``).
        patch_size: pixels per patch side (``ViTConfig.token_size``: for a hybrid,
            the input pixels one token of the feature map stands for).
    Returns:
        (depth, NH) float64, averaged over the B images.
    """
    if not attentions:
        raise ValueError("attention_distance: no attention maps given")
    tokens = attentions[0].shape[-1]
    dist = to_device(patch_distances(_grid_side(tokens - 1), patch_size))  # (N-1, N-1)
    out = []
    for attn in attentions:
        if attn.ndim != 4 or attn.shape[-2:] != (tokens, tokens):
            raise ValueError(
                f"attention_distance: expected (B, NH, {tokens}, {tokens}) maps, got {attn.shape}")
        a = to_device(attn)[:, :, 1:, 1:].astype(xp.float64)  # (B, NH, N-1, N-1)
        a /= xp.maximum(a.sum(axis=-1, keepdims=True), xp.finfo(xp.float64).tiny)
        per_query = (a * dist).sum(axis=-1)  # (B, NH, N-1)
        out.append(per_query.mean(axis=(0, 2)))  # (NH,)
    return to_host(xp.stack(out))  # (depth, NH)


def mean_attention_distance(model, images, batch_size=128):
    """``attention_distance`` averaged over ``images``, run through ``model`` in
    eval mode with its attention maps kept (the paper's fig. 7 right); the
    model's modes are restored after.

    Args:
        model: a ViT.
        images: (B, C, H, W) normalized images, host or device.
        batch_size: images per forward pass (memory: depth * B * NH * N^2 attention weights).
    Returns:
        (depth, NH) distances in pixels.
    """
    if len(images) == 0:
        raise ValueError("mean_attention_distance: no images given")
    total = 0.0
    with _inspection_mode(model):
        for start in range(0, len(images), batch_size):
            x = to_device(images[start:start + batch_size])
            model.forward(x)
            total += attention_distance(model.attention_maps(), model.config.token_size) * len(x)
    return total / len(images)


def pooled_rows(a, pool):
    """The row of a (..., N, N) token-to-token matrix for what the head reads, over
    the patches: (..., N - 1). With ``pool="cls"`` the head reads the class token's
    output, so the row is a[..., 0, 1:]; with "mean" it reads the mean of the patch
    tokens' outputs, so a patch's share in it is the mean of its shares in those
    outputs: the patch rows a[..., 1:, 1:] averaged."""
    return a[..., 0, 1:] if pool == "cls" else a[..., 1:, 1:].mean(axis=-2)


def attention_rollout(attentions, pool="cls"):
    """Attention rollout (Abnar and Zuidema 2020) from the pooled output (the
    class token, or the mean of the patch tokens: ``pooled_rows``) to the patches.

    Per layer, average the heads, Ā = mean_h A_h (B, N, N), and account for the
    residual connection by mixing in the identity:

        Â = 0.5 Ā + 0.5 I      (= "add I, renormalize the rows", as rows of Ā sum to 1)

    then chain the layers, the first one rightmost:

        rollout = Â_depth ... Â_2 Â_1.

    rollout[b, i, j] is the share of token j's input that reaches token i's output.
    Uniform attention (every A = 1/N) gives every patch (1 - 2^-depth) / N from
    the class token; attention on itself only (A = I) gives 0 from the class
    token and 1 / (N - 1) from the mean of the patch tokens.

    Args:
        attentions: one (B, NH, N, N) array per block, first layer first.
        pool: "cls" or "mean", the model's pooling.
    Returns:
        (B, G, G): the pooled row of the rollout over the patches, not renormalized (the
        rest of the row stays on the class token).
    """
    if not attentions:
        raise ValueError("attention_rollout: no attention maps given")
    B, _, N, _ = attentions[0].shape
    G = _grid_side(N - 1)
    eye = xp.eye(N)
    rollout = eye  # (N, N), broadcast over B until the first layer
    for attn in attentions:
        mixed = 0.5 * to_device(attn).astype(xp.float64).mean(axis=1) + 0.5 * eye  # (B, N, N)
        rollout = mixed @ rollout  # (B, N, N)
    return to_host(pooled_rows(rollout, pool).reshape(B, G, G))


def last_layer_attention(model):
    """The pooled output's attention to the patches in the last block, per head,
    from the model's last forward pass: ``pooled_rows`` of A as (B, NH, G, G).
    Each head's values sum to 1 minus what goes to the class token (the model
    must keep its attention maps: ``model.keep_attention()``)."""
    attn = model.attention_maps()[-1]
    B, NH, N, _ = attn.shape
    G = _grid_side(N - 1)
    return to_host(pooled_rows(attn, model.config.pool).reshape(B, NH, G, G))


# ---------------------------------------------------------------- pictures


def _channels_last(image):
    """(C, H, W) -> (H, W) for one channel, (H, W, C) otherwise."""
    return image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)


def _repeat_pixels(image, factor):
    """Nearest-neighbour upscaling of an (H, W) or (H, W, C) array by an integer factor."""
    return image.repeat(factor, axis=0).repeat(factor, axis=1)


def plot_patch_embed_filters(model, path, k=28):
    """``patch_embed_components`` as grey tiles (black = most negative, white =
    most positive, per tile; colour for RGB models), captioned with the share of
    variance each explains."""
    components, ratios = patch_embed_components(model, k)
    D, _, P, _ = input_filters(model).shape
    which = "the stem's first convolution" if model.config.stem else "patch-embedding"
    tiles = [_channels_last(c) for c in components]
    titles = [f"PC{i + 1}  {100 * r:.1f}%" for i, r in enumerate(ratios)]
    return image_grid(
        tiles, path, cols=min(7, len(tiles)), tile_titles=titles,
        scale=math.ceil(TILE_PX * 0.75 / P),
        title=f"{which} filters: top {len(tiles)} principal components of the "
              f"{D} learned {P}x{P} filters (% of variance)",
    )


def plot_pos_embed_similarity(model, path):
    """``pos_embed_similarity`` as a G x G grid of G x G heatmaps: the tile at
    (row, col) shows how that patch's position embedding resembles every patch's.
    Each map's cells are repeated to about 70 px a tile (heatmap_grid alone
    draws tiles of about 48 px)."""
    sim = pos_embed_similarity(model)
    G = sim.shape[0]
    factor = max(1, 72 // G)
    tiles = sim.repeat(factor, axis=2).repeat(factor, axis=3)  # (G, G, G*f, G*f)
    return heatmap_grid(
        tiles, path, row_labels=range(1, G + 1), col_labels=range(1, G + 1),
        row_title="input patch row", col_title="input patch column",
        cmap="coolwarm", vmin=-1.0, vmax=1.0,
        title="position embeddings: cosine similarity of patch (row, col) with every patch",
    )


def plot_attention_distance(distances, path, token_size, image_size, num_images):
    """Mean attention distances (depth, NH) against depth, one marker per head and the
    mean of the heads as a line, in two panels: on an axis from 0 with two
    references, uniform attention over all patches (the mean pairwise patch
    distance) and attention on one's own patch only (0); and zoomed in on the heads."""
    distances = np.asarray(distances)
    depth, NH = distances.shape
    layers = np.arange(1, depth + 1)
    uniform = patch_distances(round(image_size / token_size), token_size).mean()

    heads = [Series(f"head {h + 1}", layers, distances[:, h], style="markers")
             for h in range(NH)]
    heads.append(Series("mean of heads", layers, distances.mean(axis=1), color=INK))
    references = [
        Series(f"uniform attention ({uniform:.1f} px)", [1, depth], [uniform, uniform],
               color=FRAME),
        Series("own patch only (0 px)", [1, depth], [0.0, 0.0], color=(200, 200, 200)),
    ]
    xlabel, ylabel = "network depth (layer)", "mean attention distance (pixels)"
    return line_chart(
        [Panel("from 0, with references", xlabel, ylabel, heads + references),
         Panel("zoomed in on the heads", xlabel, ylabel, heads)],
        path, panel_size=(520, 400),
        title=f"mean attention distance between query and key patches: {depth} layers x {NH} "
              f"heads, {num_images} images of {image_size}x{image_size} px, {token_size:g} px "
              "per token",
    )


def plot_attention_maps(model, images, path, class_names=None):
    """For each image, a row: the input, its attention rollout overlaid, and the
    last layer's attention per head overlaid, both for what the head reads (the
    class token, or the mean of the patch tokens). Each overlay's colours span
    its own min..max (yellow = most attended); a head's caption gives the share
    of that attention that goes to patches (the rest to the class token).

    Args:
        model: a ViT (run here in eval mode, keeping its attention maps; its modes are restored).
        images: (B, C, H, W) normalized images, host or device.
        path: where the PNG goes.
        class_names: if given, the input's caption is the prediction and its probability.
    """
    with _inspection_mode(model):
        probs = to_host(softmax(model.forward(to_device(images))))  # (B, K)
        rollout = attention_rollout(model.attention_maps(), model.config.pool)  # (B, G, G)
        heads = last_layer_attention(model)  # (B, NH, G, G)
    depth, num_heads = len(model.blocks), heads.shape[1]
    factor = max(1, TILE_PX // model.config.image_size)
    tiles, titles = [], []
    for b, image in enumerate(to_host(images)):
        base = _repeat_pixels(_channels_last(image.astype(np.float64)), factor)
        tiles += [base, overlay(base, rollout[b], alpha=0.6)]
        titles += [_input_caption(probs[b], class_names), "rollout"]
        for h in range(num_heads):
            tiles.append(overlay(base, heads[b, h], alpha=0.6))
            titles.append(f"head {h + 1}  {heads[b, h].sum():.0%}")
    return image_grid(
        tiles, path, cols=2 + num_heads, tile_titles=titles, scale=1,
        title=f"{READOUT[model.config.pool]} attention: rollout over all {depth} layers, then "
              f"layer {depth}'s heads (% on patches)",
    )


def _input_caption(probs, class_names):
    if class_names is None:
        return "input"
    k = int(probs.argmax())
    return f"pred {class_names[k]} {probs[k]:.0%}"


def write_pictures(model, out_dir, map_images, distance_images, class_names=None):
    """Write the four PNGs of ``PICTURES`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    c = model.config
    distances = mean_attention_distance(model, distance_images)
    return [
        plot_patch_embed_filters(model, out / PICTURES[0]),
        plot_pos_embed_similarity(model, out / PICTURES[1]),
        plot_attention_distance(distances, out / PICTURES[2], c.token_size, c.image_size,
                                len(distance_images)),
        plot_attention_maps(model, map_images, out / PICTURES[3], class_names),
    ]
