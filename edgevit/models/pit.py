"""PiT, Pooling-based Vision Transformer (Heo et al., 2021): an overlapping
conv patch embedding (16x16 stride 8; 14x14 stride 7 for PiT-B) with a
learned 2-D position embedding, then three transformer stages; between
stages the spatial tokens are pooled by a stride-2 3x3 depthwise conv that
doubles the channels (channel multiplier 2) and the class token by a
fully-connected layer to the new width.

The class token and the spatial tokens are separate tensors throughout
(joined only after each LayerNorm inside the blocks), so pooling needs no
slicing and int8 keeps a scale per group. Names follow timm's ``pit_*``
modules (``patch_embed.conv``, ``transformers.1.pool.conv``,
``transformers.1.blocks.0.attn``).
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers

from edgevit.layers import (PositionEmbedding, PrefixTokens, drop_path_rates, to_map, to_tokens,
                            transformer_encoder)
from edgevit.layers.conv import DENSE_INIT
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, class_token_head, image_input
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

REFERENCE_PIT = "https://github.com/naver-ai/pit (timm pit.py)"
PREPROCESS_PIT = Preprocessing(224, 248, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
LN_EPS = 1e-6


@dataclass(frozen=True)
class PiTConfig:
    patch_size: int
    stride: int
    base_dims: tuple[int, int, int]
    depths: tuple[int, int, int]
    heads: tuple[int, int, int]
    mlp_ratio: float = 4.0

    def dim(self, stage: int) -> int:
        return self.base_dims[stage] * self.heads[stage]


CONFIGS = {
    "pit_ti": PiTConfig(16, 8, (32, 32, 32), (2, 6, 4), (2, 4, 8)),
    "pit_xs": PiTConfig(16, 8, (48, 48, 48), (2, 6, 4), (2, 4, 8)),
    "pit_s": PiTConfig(16, 8, (48, 48, 48), (2, 6, 4), (3, 6, 12)),
    "pit_b": PiTConfig(14, 7, (64, 64, 64), (3, 6, 4), (4, 8, 16)),
}


def grid_size(cfg: PiTConfig, input_size: int) -> int:
    return (input_size - cfg.patch_size) // cfg.stride + 1


def pool(x_map, cls, dim: int, name: str):
    """Depthwise-conv pooling of the spatial map (stride 2, channels x2) and
    fully-connected pooling of the class token."""
    multiplier = dim // x_map.shape[-1]
    x_map = layers.ZeroPadding2D(1, name=f"{name}.pad")(x_map)
    x_map = layers.DepthwiseConv2D(3, 2, depth_multiplier=multiplier, depthwise_initializer=DENSE_INIT,
                                   name=f"{name}.conv")(x_map)
    cls = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.fc")(cls)
    return x_map, cls


def build_pit(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    grid = grid_size(cfg, input_size)
    x = layers.Conv2D(cfg.dim(0), cfg.patch_size, cfg.stride, kernel_initializer=DENSE_INIT,
                      name="patch_embed.conv")(inputs)
    x = PositionEmbedding((grid, grid), layout="map", name="pos_embed")(x)
    cls = PrefixTokens(["cls_token"], [0.02], concat=False, name="cls_token")(to_tokens(x, "patch_embed.flatten"))
    rates = drop_path_rates(drop_path_rate, sum(cfg.depths))
    for stage, depth in enumerate(cfg.depths):
        prefix = f"transformers.{stage}"
        dim = cfg.dim(stage)
        if stage:
            x, cls = pool(x, cls, dim, name=f"{prefix}.pool")
        map_grid = tuple(x.shape[1:3])
        groups = [cls, to_tokens(x, f"{prefix}.flatten")]
        for i in range(depth):
            groups = transformer_encoder(groups, dim, int(dim * cfg.mlp_ratio), cfg.heads[stage],
                                         activation="gelu", epsilon=LN_EPS, drop_path=rates.pop(0),
                                         name=f"{prefix}.blocks.{i}")
        cls, x = groups[0], to_map(groups[1], map_grid, f"{prefix}.unflatten")
    _, logits = class_token_head(cls, num_classes, epsilon=LN_EPS)
    return keras.Model(inputs, logits, name=name)


# Official ImageNet weights (``weights="imagenet"``): NAVER's, as timm hosts
# them; top-1 from timm.
PRETRAINED = {
    "pit_ti": timm_weights("pit_ti_224.in1k", 72.926, "Apache-2.0"),
    "pit_xs": timm_weights("pit_xs_224.in1k", 78.196, "Apache-2.0"),
    "pit_s": timm_weights("pit_s_224.in1k", 81.114, "Apache-2.0"),
    "pit_b": timm_weights("pit_b_224.in1k", 82.458, "Apache-2.0"),
}

_PIT = dict(family="pit", default_input_size=224, preprocessing=PREPROCESS_PIT, input_size_multiple=8,
            reference=REFERENCE_PIT, checkpoint_formats=("timm",), options=builder_options(build_pit),
            pretrained=PRETRAINED)


@register_model(**_PIT)
def pit_ti(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pit("pit_ti", num_classes, input_size, **options)


@register_model(**_PIT)
def pit_xs(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pit("pit_xs", num_classes, input_size, **options)


@register_model(**_PIT)
def pit_s(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pit("pit_s", num_classes, input_size, **options)


@register_model(**{**_PIT, "input_size_multiple": 7})
def pit_b(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pit("pit_b", num_classes, input_size, **options)
