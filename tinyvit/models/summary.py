"""A ViT's summary: a table of its layers, output shapes, parameter counts and
forward FLOPs per image, and which code its layers run (reference or fast)."""

from ..nn.layers import ClassAttentionBlock
from .config import stem_output_size


def summary(model, print_fn=print):
    """Print (and return) a table of layers, output shapes, parameter counts and
    forward FLOPs per image, like the torchsummary tables people print for ViT
    (B = batch), and which code the layers run (``Module.describe_tier``). FLOPs
    count the matmuls and convolutions, 2 per multiply-add."""
    rows = summary_rows(model)
    width = max(len(r[0]) for r in rows) + 2
    rule = "-" * (width + 50)
    lines = [rule, f"{'Layer (type)':<{width}}{'Output shape':<22}{'Param #':>14}{'FLOPs':>14}",
             rule]
    for name, shape, owner, flops in rows:
        shape_text = "[B, " + ", ".join(str(s) for s in shape) + "]"
        lines.append(f"{name:<{width}}{shape_text:<22}{_count(owner):>14,}{flops:>14,}")
    c, total = model.config, model.num_parameters()
    tokens = f"{c.num_patches} patches + 1 class token"
    source = f"of its {c.feature_size}x{c.feature_size} feature map" if c.stem else ""
    lines += [
        rule,
        f"Total params: {total:,}",
        f"Trainable params: {total:,}",
        f"Forward FLOPs per image: {flops_per_image(model):,}",
        f"Input: [B, {c.in_channels}, {c.image_size}, {c.image_size}], "
        f"patch_size {c.patch_size} {source}".rstrip() + f", {tokens}",
        f"Layers: {model.describe_tier()}",
        rule,
    ]
    text = "\n".join(lines)
    print_fn(text)
    return text


def flops_per_image(model):
    """Forward FLOPs of one image's matmuls and convolutions (2 per multiply-add)."""
    return sum(row[3] for row in summary_rows(model))


def summary_rows(model):
    """(name, output shape, parameter owner, forward FLOPs per image) per layer."""
    c = model.config
    N, D, K = c.num_patches + 1, c.embed_dim, c.num_classes
    hidden = int(D * c.mlp_ratio)
    rows, channels, size = [], c.in_channels, c.image_size
    if c.stem:
        stem = model.patch_embed.backbone
        for i, (out, k, stride) in enumerate(c.stem, start=1):
            size = stem_output_size(size, [(out, k, stride)], False)
            flops = 2 * channels * k * k * out * size * size
            rows += [(f"patch_embed.backbone.conv{i} (Conv2d {k}x{k}/{stride})",
                      (out, size, size), getattr(stem, f"conv{i}"), flops),
                     (f"patch_embed.backbone.norm{i} + ReLU", (out, size, size),
                      getattr(stem, f"norm{i}"), 0)]
            channels = out
        if c.stem_pool:
            size = stem_output_size(size, (), True)
            rows.append(("patch_embed.backbone.pool (MaxPool2d 3x3/2)", (channels, size, size),
                         None, 0))
    fan_in = channels * c.patch_size**2
    rows.append(("patch_embed.proj (Conv2d as Linear)", (N - 1, D), model.patch_embed.proj,
                 2 * (N - 1) * fan_in * D))
    rows.append(("cls_token + pos_embed", (N, D), (model.cls_token, model.pos_embed), 0))
    for i, block in enumerate(model.blocks):
        p = f"blocks.{i}"
        Q = 1 if isinstance(block, ClassAttentionBlock) else N  # rows after its attention
        rows += [
            (f"{p}.norm1 (LayerNorm)", (N, D), block.norm1, 0),
            (f"{p}.attn.qkv (Linear)", (N, 3 * D), block.attn.qkv, 2 * N * D * 3 * D),
            (f"{p}.attn.softmax ({c.num_heads} heads)", (c.num_heads, Q, N), None,
             2 * 2 * Q * N * D),  # q k^T and A v, all heads
            (f"{p}.attn.proj (Linear)", (Q, D), block.attn.proj, 2 * Q * D * D),
            (f"{p}.norm2 (LayerNorm)", (Q, D), block.norm2, 0),
            (f"{p}.mlp.fc1 (Linear)", (Q, hidden), block.mlp.fc1, 2 * Q * D * hidden),
            (f"{p}.mlp.act (GELU)", (Q, hidden), None, 0),
            (f"{p}.mlp.fc2 (Linear)", (Q, D), block.mlp.fc2, 2 * Q * hidden * D),
        ]
    norm_name = "fc_norm" if c.pool == "mean" else "norm"
    rows.append((f"pool ({c.pool})", (D,), None, 0))
    rows.append((f"{norm_name} (LayerNorm)", (D,), model.norm, 0))
    R = c.representation_size
    if R:
        rows.append(("pre_logits (Linear + tanh)", (R,), model.pre_logits, 2 * D * R))
    rows.append(("head (Linear)", (K,), model.head, 2 * (R or D) * K))
    return rows

def _count(owner):
    """Parameters of a module, of a tuple of Parameters, or 0 for None."""
    if owner is None:
        return 0
    if isinstance(owner, tuple):
        return sum(p.data.size for p in owner)
    return owner.num_parameters()
