"""Vision Transformer (Dosovitskiy et al., 2020): a 16x16 (or 32x32) patch
embedding, a learned class token, a learned 1-D position embedding over
[class token, patches], pre-norm encoder blocks (GELU MLP, LayerNorm eps
1e-6), a final LayerNorm and a linear head on the class token.

Layer names follow timm's module paths (``patch_embed.proj``, ``blocks.3.attn``,
``norm``, ``head``). The position embedding follows the input size: it is
built for the patch grid of ``input_size`` and weights saved at another size
are resampled bicubically on load (class token entry kept).
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers

from edgevit.layers import (PositionEmbedding, PrefixTokens, TokenSlice, drop_path_rates, patch_embed,
                            transformer_encoder)
from edgevit.layers.conv import DENSE_INIT
from edgevit.models.common import class_token_head, image_input
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

REFERENCE_TIMM_VIT = "https://github.com/huggingface/pytorch-image-models (vision_transformer.py)"
LN_EPS = 1e-6

# timm's augreg checkpoints: mean/std 0.5, bicubic resize of the shorter side
# to 248 (crop 0.9), centre crop 224.
PREPROCESS_VIT = Preprocessing(224, 248, "bicubic", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))


@dataclass(frozen=True)
class ViTConfig:
    patch_size: int
    dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0
    distilled: bool = False
    cls_std: float = 1e-6      # timm ViT init of the class token


def build_vit(name: str, cfg: ViTConfig, num_classes: int, input_size: int, *,
              drop_path_rate: float = 0.0) -> keras.Model:
    inputs = image_input(input_size)
    grid = (input_size // cfg.patch_size,) * 2
    x = patch_embed(inputs, cfg.dim, cfg.patch_size)
    prefix = ["cls_token", "dist_token"] if cfg.distilled else ["cls_token"]
    # The class (and distillation) tokens travel as a tensor of their own
    # (int8 scale of their own); identical math to timm's concatenated tokens.
    tokens = PrefixTokens(prefix, [cfg.cls_std, 0.02][:len(prefix)], concat=False, name="prefix_tokens")(x)
    tokens, x = PositionEmbedding(grid, num_prefix=len(prefix), name="pos_embed")([tokens, x])
    groups = [tokens, x]
    for i, rate in enumerate(drop_path_rates(drop_path_rate, cfg.depth)):
        groups = transformer_encoder(groups, cfg.dim, int(cfg.dim * cfg.mlp_ratio), cfg.num_heads,
                                     activation="gelu", epsilon=LN_EPS, drop_path=rate, name=f"blocks.{i}")
    x, logits = class_token_head(groups[0], num_classes, epsilon=LN_EPS)  # only the prefix tokens reach the heads
    if cfg.distilled:  # DeiT: at inference the class and distillation heads are averaged
        dist = TokenSlice(1, 2, squeeze=True, name="pool_dist")(x)
        dist = layers.Dense(num_classes, kernel_initializer=DENSE_INIT, name="head_dist")(dist)
        logits = layers.Average(name="head_average")([logits, dist])
    return keras.Model(inputs, logits, name=name)


CONFIGS = {
    "vit_tiny16": ViTConfig(16, 192, 12, 3),
    "vit_small16": ViTConfig(16, 384, 12, 6),
    "vit_base16": ViTConfig(16, 768, 12, 12),
    "vit_base32": ViTConfig(32, 768, 12, 12),
    "vit_large16": ViTConfig(16, 1024, 24, 16),
}

# Official ImageNet weights (``weights="imagenet"``): timm's default tags,
# Google's AugReg ImageNet-21k pretrained, ImageNet-1k fine-tuned weights
# (base/16: timm's further fine-tune of them, "augreg2"); top-1 from timm.
PRETRAINED = {
    "vit_tiny16": timm_weights("vit_tiny_patch16_224.augreg_in21k_ft_in1k", 75.452, "Apache-2.0"),
    "vit_small16": timm_weights("vit_small_patch16_224.augreg_in21k_ft_in1k", 81.402, "Apache-2.0"),
    "vit_base16": timm_weights("vit_base_patch16_224.augreg2_in21k_ft_in1k", 85.108, "Apache-2.0"),
    "vit_base32": timm_weights("vit_base_patch32_224.augreg_in21k_ft_in1k", 80.732, "Apache-2.0"),
    "vit_large16": timm_weights("vit_large_patch16_224.augreg_in21k_ft_in1k", 85.856, "Apache-2.0"),
}

_VIT16 = dict(family="vit", default_input_size=224, preprocessing=PREPROCESS_VIT, input_size_multiple=16,
              reference=REFERENCE_TIMM_VIT, checkpoint_formats=("timm",), options=builder_options(build_vit),
              pretrained=PRETRAINED)
_VIT32 = {**_VIT16, "input_size_multiple": 32}


@register_model(**_VIT16)
def vit_tiny16(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("vit_tiny16", CONFIGS["vit_tiny16"], num_classes, input_size, **options)


@register_model(**_VIT16)
def vit_small16(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("vit_small16", CONFIGS["vit_small16"], num_classes, input_size, **options)


@register_model(**_VIT16)
def vit_base16(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("vit_base16", CONFIGS["vit_base16"], num_classes, input_size, **options)


@register_model(**_VIT32)
def vit_base32(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("vit_base32", CONFIGS["vit_base32"], num_classes, input_size, **options)


@register_model(**_VIT16)
def vit_large16(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("vit_large16", CONFIGS["vit_large16"], num_classes, input_size, **options)
