"""Official T2T-ViT checkpoints (the ``*.pth.tar`` release files of
yitu-opensource/T2T-ViT: ``state_dict`` / ``state_dict_ema`` entries,
``module.`` prefixes, all read by ``checkpoints.load_checkpoint``).

Module paths followed: yitu-opensource/T2T-ViT 0f63dc9 (``models/t2t_vit.py``,
``token_performer.py``, ``token_transformer.py``, ``transformer_block.py``).
edgevit's layer names are those module paths, so the rules are renames
except for two tensors:

- ``tokens_to_token.project`` is a linear layer over the last soft split's
  ``(c, kh, kw)``-ordered patches, ``[E, C * 3 * 3]``; edgevit runs split and
  projection as one 3x3 convolution, whose kernel is the same numbers
  ``[E, C, 3, 3]`` in HWIO order.
- ``pos_embed`` (a fixed sinusoid table the checkpoint stores) is resampled
  for another input size as the official ``load_for_transfer_learning``
  does: bicubic without antialiasing, class-token entry kept.

The Performer's random feature directions ``w`` are stored in the
checkpoint and loaded like a weight (they were drawn once, at training time).
"""
from __future__ import annotations

import numpy as np

from .layouts import pos_embed_transform
from .registry import Importer, register
from .rules import Rule

T2T = "https://github.com/yitu-opensource/T2T-ViT"
T2T_COMMIT = "0f63dc9"


def patch_projection_kernel(w, shape):
    """``[E, C*kh*kw]`` linear weight -> ``[kh, kw, C, E]`` conv kernel."""
    kh, kw, channels, out = shape
    if w.ndim != 2 or w.shape != (out, channels * kh * kw):
        return w  # the shape check names it
    return np.transpose(w.reshape(out, channels, kh, kw), (2, 3, 1, 0))


def inverse_patch_projection(w, as_conv):
    kh, kw, channels, out = w.shape
    return np.transpose(w, (3, 2, 0, 1)).reshape(out, channels * kh * kw)


RULES = [
    Rule(r"tokens_to_token\.project/kernel", "tokens_to_token.project.weight", variable=True,
         transform=patch_projection_kernel, inverse=inverse_patch_projection),
    Rule(r"pos_embed/pos_embed", "pos_embed", variable=True,
         transform=pos_embed_transform(num_prefix_tokens=1, antialias=False)),
    Rule(r"(cls_token)/\w+", r"\1", variable=True),
    Rule(r"([\w.]+)/(\w+)", r"\1.\2"),
    Rule(r"([\w.]+)", r"\1"),
]

register(Importer("official", "t2t_vit", lambda model: RULES, reference=f"{T2T}/tree/{T2T_COMMIT}", head=("head",),
                  notes="official T2T-ViT release checkpoints (71.7_T2T_ViT_7.pth.tar ...)"))
