"""Weights fitted to a model of another shape: the position embeddings resized to
its patch grid, the final norm renamed for its pooling, the head and pre-logits
kept, left as initialized or zeroed (the ViT paper's fine-tuning)."""

import dataclasses

import numpy as np  # host-side state dicts only

from ..backend import to_device, to_host
from ..models import ViT
from ..nn.resample import resize_pos_embed
from .formats import PretrainedError


def _keys(state, prefix):
    return [k for k in state if k.startswith(prefix)]


def adapt_state(pretrained, model, head):
    """The file's state dict fitted to ``model``: pos_embed resized to its image
    size, the final norm renamed for its pooling, pre_logits and head chosen as
    ``head`` says. Returns (state, notes)."""
    state, notes, f, c = dict(pretrained.state), [], pretrained.fields, model.config
    built = model.state_dict()
    if f["image_size"] != c.image_size:
        grid = dataclasses.replace(c, image_size=f["image_size"]).feature_size // c.patch_size
        old, new = grid, c.feature_size // c.patch_size
        pos = resize_pos_embed(to_device(state["pos_embed"]), old, new)
        state["pos_embed"] = to_host(pos)
        notes.append(f"pos_embed resized from {old}x{old} to {new}x{new} patches (bicubic)")
    if f["pool"] != c.pool:
        old, new = ("norm", "fc_norm") if c.pool == "mean" else ("fc_norm", "norm")
        for key in _keys(state, old + "."):
            state[new + key[len(old):]] = state.pop(key)
        notes.append(f"{old} renamed {new}: the file pools by {f['pool']}, the model by {c.pool}")
    if f.get("representation_size", 0) != c.representation_size:
        for key in _keys(state, "pre_logits."):
            del state[key]
        state.update({k: built[k] for k in _keys(built, "pre_logits.")})
        notes.append(f"pre_logits: representation_size {f.get('representation_size', 0)} -> "
                     f"{c.representation_size}, not loaded")
    return _choose_head(pretrained.path, state, built, head, notes), notes


def _choose_head(path, state, built, head, notes):
    keys = ("head.weight", "head.bias")
    fits = all(k in state and state[k].shape == built[k].shape for k in keys)
    if head == "load" and not fits:
        got = [tuple(state[k].shape) if k in state else "absent" for k in keys]
        raise PretrainedError(f"{path}: head='load': expected head.weight "
                              f"{built['head.weight'].shape} and head.bias "
                              f"{built['head.bias'].shape}, the file has {got[0]} and {got[1]}; "
                              "pass head='fresh' or head='zero' to train a new head")
    if head == "zero":
        state.update({k: np.zeros_like(built[k]) for k in keys})
        notes.append("head set to zero (head='zero')")
    elif head == "fresh" or not fits:
        why = ("head='fresh'" if head == "fresh" else "the file's head has another shape"
               if "head.weight" in state else "no head in the file")
        state.update({k: built[k] for k in keys})
        notes.append(f"head.weight, head.bias not loaded, left as initialized ({why})")
    return state


def resize_image(model, image_size):
    """A new ViT for ``image_size`` x ``image_size`` images: the same config with
    the new image size, every weight copied, and ``pos_embed`` resized by
    ``resize_pos_embed`` (the class token's embedding kept). The patch size is
    unchanged, so the grid goes from image_size/P to the new image_size/P per side.
    The new model has the old one's dtype and train/eval mode, and reference layers."""
    config = dataclasses.replace(model.config, image_size=image_size)  # checks divisibility
    old_grid = model.config.feature_size // model.config.patch_size
    new_grid = config.feature_size // config.patch_size
    resized = ViT(config, dtype=model.pos_embed.data.dtype.type)
    state = model.state_dict()
    state["pos_embed"] = to_host(resize_pos_embed(model.pos_embed.data, old_grid, new_grid))
    resized.load_state_dict(state)
    return resized.train(model.training)
