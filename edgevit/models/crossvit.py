"""CrossViT (Chen et al., 2021): two ViT branches over the same image, a
small-patch branch (12x12 patches of the 240x240 image) and a large-patch
branch (16x16 patches of the image resized to 224x224). Three multi-scale
blocks run each branch's transformer blocks, then fuse the branches through
the class tokens: each branch's class token is projected to the other
branch's width, attends (as the only query) to the other branch's patch
tokens, and is projected back. The two heads' logits are averaged.

The 240 -> 224 bicubic resize of the reference (PyTorch ``F.interpolate``,
``align_corners=False``) is computed exactly as two constant matrices along H
and W (:class:`edgevit.layers.BicubicResize`): TFLite has no bicubic op, and
the PyTorch export route lowers it to GATHER_ND chains; here it is two
FULLY_CONNECTED ops, int8 and delegate friendly.

Class tokens travel as tensors of their own (int8 scale of their own).
Names follow timm's ``crossvit_*`` modules (``patch_embed.0.proj``,
``cls_token_0``, ``blocks.0.blocks.1.3.attn``, ``blocks.0.fusion.0.attn.wq``,
``blocks.0.projs.0.2``, ``head.1``).
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers

from edgevit.layers import (BicubicResize, HeadAttention, LayerNorm, PositionEmbedding, PrefixTokens,
                            TokenSlice, drop_path_rates, patch_embed, transformer_encoder)
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.transformer import join_groups
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, image_input
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

REFERENCE_CROSSVIT = "https://github.com/IBM/CrossViT (timm crossvit.py)"
# timm crossvit_*_240: bicubic, crop 0.875 (shorter side 274), ImageNet mean/std.
PREPROCESS_CROSSVIT = Preprocessing(240, 274, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
LN_EPS = 1e-6
PATCH_SIZES = (12, 16)
SCALE = 224 / 240   # the large-patch branch sees the image resized by this factor
SIZE_MULTIPLE = 120  # keeps both patch grids whole (120 -> 10x10 and 112 / 16 = 7x7)


@dataclass(frozen=True)
class CrossViTConfig:
    dims: tuple[int, int]
    depth: int             # blocks of the large-patch branch per multi-scale block
    heads: tuple[int, int]
    mlp_ratio: tuple[float, float]


CONFIGS = {
    "crossvit_tiny": CrossViTConfig((96, 192), 4, (3, 3), (4, 4)),
    "crossvit_small": CrossViTConfig((192, 384), 4, (6, 6), (4, 4)),
    "crossvit_base": CrossViTConfig((384, 768), 4, (12, 12), (4, 4)),
    "crossvit_9": CrossViTConfig((128, 256), 3, (4, 4), (3, 3)),
    "crossvit_15": CrossViTConfig((192, 384), 5, (6, 6), (3, 3)),
    "crossvit_18": CrossViTConfig((224, 448), 6, (7, 7), (3, 3)),
}
NUM_MULTISCALE_BLOCKS = 3


def project_token(cls, out_dim: int, name: str):
    """LayerNorm -> GELU -> Linear of a class token (``projs.d`` / ``revert_projs.d``)."""
    y = LayerNorm(epsilon=LN_EPS, name=f"{name}.0")(cls)
    y = layers.Activation("gelu", name=f"{name}.1")(y)
    return layers.Dense(out_dim, kernel_initializer=DENSE_INIT, name=f"{name}.2")(y)


def cross_attention_block(cls, patches, num_heads: int, name: str):
    """``cls + CrossAttention(LN([cls, patches]))`` with the class token as
    the only query (``fusion.d``)."""
    dim = cls.shape[-1]
    norm = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm1")
    normed_cls = norm(cls)
    tokens = join_groups([normed_cls, norm(patches)], f"{name}.join")
    q = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.attn.wq")(normed_cls)
    k = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.attn.wk")(tokens)
    v = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.attn.wv")(tokens)
    y = HeadAttention(num_heads, name=f"{name}.attn.heads")([q, k, v])
    y = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.attn.proj")(y)
    return layers.Add(name=f"{name}.add")([cls, y])


def build_crossvit(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    sizes = (input_size, int(input_size * SCALE))
    branches = []
    for i, (size, patch, dim) in enumerate(zip(sizes, PATCH_SIZES, cfg.dims)):
        x = inputs if size == input_size else BicubicResize((size, size), name=f"resize_{i}")(inputs)
        x = patch_embed(x, dim, patch, name=f"patch_embed.{i}")
        cls = PrefixTokens([f"cls_token_{i}"], [0.02], concat=False, name=f"cls_token_{i}")(x)
        grid = size // patch
        branches.append(PositionEmbedding((grid, grid), num_prefix=1, name=f"pos_embed_{i}")([cls, x]))
    depths = (1, cfg.depth)
    rates = drop_path_rates(drop_path_rate, NUM_MULTISCALE_BLOCKS * (cfg.depth + 0))
    for b in range(NUM_MULTISCALE_BLOCKS):
        prefix = f"blocks.{b}"
        block_rates = rates[b * cfg.depth:(b + 1) * cfg.depth]
        for d in range(2):
            for j in range(depths[d]):
                branches[d] = transformer_encoder(
                    branches[d], cfg.dims[d], int(cfg.dims[d] * cfg.mlp_ratio[d]), cfg.heads[d],
                    activation="gelu", epsilon=LN_EPS, drop_path=block_rates[j],
                    name=f"{prefix}.blocks.{d}.{j}")
        fused = []
        for d in range(2):
            other = (d + 1) % 2
            cls = project_token(branches[d][0], cfg.dims[other], f"{prefix}.projs.{d}")
            cls = cross_attention_block(cls, branches[other][1], cfg.heads[other], f"{prefix}.fusion.{d}")
            fused.append(project_token(cls, cfg.dims[d], f"{prefix}.revert_projs.{d}"))
        branches = [[fused[d], branches[d][1]] for d in range(2)]
    logits = []
    for d in range(2):
        cls = LayerNorm(epsilon=LN_EPS, name=f"norm.{d}")(branches[d][0])
        cls = TokenSlice(0, 1, squeeze=True, name=f"pool_cls_{d}")(cls)
        logits.append(layers.Dense(num_classes, kernel_initializer=DENSE_INIT, name=f"head.{d}")(cls))
    return keras.Model(inputs, layers.Average(name="head_average")(logits), name=name)


# Official ImageNet weights (``weights="imagenet"``): IBM's, as timm hosts
# them; top-1 from timm.
PRETRAINED = {
    "crossvit_tiny": timm_weights("crossvit_tiny_240.in1k", 73.352, "Apache-2.0"),
    "crossvit_small": timm_weights("crossvit_small_240.in1k", 81.036, "Apache-2.0"),
    "crossvit_base": timm_weights("crossvit_base_240.in1k", 82.212, "Apache-2.0"),
    "crossvit_9": timm_weights("crossvit_9_240.in1k", 73.994, "Apache-2.0"),
    "crossvit_15": timm_weights("crossvit_15_240.in1k", 81.522, "Apache-2.0"),
    "crossvit_18": timm_weights("crossvit_18_240.in1k", 82.390, "Apache-2.0"),
}

_CROSSVIT = dict(family="crossvit", default_input_size=240, preprocessing=PREPROCESS_CROSSVIT,
                 input_size_multiple=SIZE_MULTIPLE, reference=REFERENCE_CROSSVIT, checkpoint_formats=("timm",),
                 options=builder_options(build_crossvit),
                 pretrained=PRETRAINED)


@register_model(**_CROSSVIT)
def crossvit_tiny(num_classes: int = 1000, input_size: int = 240, **options):
    return build_crossvit("crossvit_tiny", num_classes, input_size, **options)


@register_model(**_CROSSVIT)
def crossvit_small(num_classes: int = 1000, input_size: int = 240, **options):
    return build_crossvit("crossvit_small", num_classes, input_size, **options)


@register_model(**_CROSSVIT)
def crossvit_base(num_classes: int = 1000, input_size: int = 240, **options):
    return build_crossvit("crossvit_base", num_classes, input_size, **options)


@register_model(**_CROSSVIT)
def crossvit_9(num_classes: int = 1000, input_size: int = 240, **options):
    return build_crossvit("crossvit_9", num_classes, input_size, **options)


@register_model(**_CROSSVIT)
def crossvit_15(num_classes: int = 1000, input_size: int = 240, **options):
    return build_crossvit("crossvit_15", num_classes, input_size, **options)


@register_model(**_CROSSVIT)
def crossvit_18(num_classes: int = 1000, input_size: int = 240, **options):
    return build_crossvit("crossvit_18", num_classes, input_size, **options)
