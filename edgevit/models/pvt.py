"""PVT v2, Pyramid Vision Transformer v2 (Wang et al., 2022): four stages
at 1/4, 1/8, 1/16 and 1/32 of the input, each entered through an
overlapping patch embedding (a 7x7 stride-4 convolution, then 3x3 stride-2
ones, each followed by LayerNorm). In the blocks the keys and values come
from a spatially reduced map (spatial-reduction attention: an sr x sr
stride-sr convolution + LayerNorm, sr = 8, 4, 2, 1 by stage), and the MLP
has a 3x3 depthwise convolution between its two linears, which gives the
position information (no position embedding). Every stage ends with a
LayerNorm; the head averages the last map.

The linear variant (``_li``) average-pools the map to 7x7 for the keys and
values (a 1x1 convolution, LayerNorm and GELU follow) and adds a ReLU before
the depthwise convolution.

Tokens stay ``[B, N, C]`` and become maps only around the convolutions, so
every tensor has rank <= 4 and no op depends on the batch size. Names
follow timm's ``pvt_v2_*`` modules (``patch_embed.proj``,
``stages.1.downsample.norm``, ``stages.0.blocks.1.attn.sr``,
``stages.2.blocks.0.mlp.dwconv``, ``stages.3.norm``, ``head``).
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers

from edgevit.layers import HeadAttention, LayerNorm, drop_path_rates, to_map, to_tokens
from edgevit.layers.conv import CONV_INIT, DENSE_INIT
from edgevit.layers.transformer import TokenSplit, residual
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, image_input, mean_pool_head
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

REFERENCE_PVT = "https://github.com/whai362/PVT (timm pvt_v2.py)"
# timm's evaluation of the weights `--weights imagenet` loads (its copies of the
# official release): crop 0.9 (shorter side 248), bicubic, ImageNet mean/std.
# The official code evaluated with shorter side 256 (DeiT's pipeline).
PREPROCESS_PVT = Preprocessing(224, 248, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
# timm's LayerNorm (blocks, stage ends) vs torch.nn.LayerNorm (patch
# embeddings, the norm of the reduced keys/values)
LN_EPS = 1e-6
EMBED_LN_EPS = 1e-5
LINEAR_POOL = 7  # the _li variants pool keys/values to 7x7


@dataclass(frozen=True)
class PVTv2Config:
    depths: tuple[int, int, int, int]
    dims: tuple[int, int, int, int] = (64, 128, 320, 512)
    heads: tuple[int, int, int, int] = (1, 2, 5, 8)
    mlp_ratios: tuple[float, float, float, float] = (8.0, 8.0, 4.0, 4.0)
    sr_ratios: tuple[int, int, int, int] = (8, 4, 2, 1)
    linear: bool = False


CONFIGS = {
    "pvt_v2_b0": PVTv2Config((2, 2, 2, 2), dims=(32, 64, 160, 256)),
    "pvt_v2_b1": PVTv2Config((2, 2, 2, 2)),
    "pvt_v2_b2": PVTv2Config((3, 4, 6, 3)),
    "pvt_v2_b2_li": PVTv2Config((3, 4, 6, 3), linear=True),
    "pvt_v2_b3": PVTv2Config((3, 4, 18, 3)),
    "pvt_v2_b4": PVTv2Config((3, 8, 27, 3)),
    "pvt_v2_b5": PVTv2Config((3, 6, 40, 3), mlp_ratios=(4.0, 4.0, 4.0, 4.0)),
}


def overlap_patch_embed(x, dim: int, kernel_size: int, strides: int, name: str):
    """Conv with PyTorch's symmetric ``kernel_size // 2`` padding, then LayerNorm; ``[B, H, W, dim]``."""
    x = layers.ZeroPadding2D(kernel_size // 2, name=f"{name}.pad")(x)
    x = layers.Conv2D(dim, kernel_size, strides, kernel_initializer=CONV_INIT, name=f"{name}.proj")(x)
    return LayerNorm(epsilon=EMBED_LN_EPS, name=f"{name}.norm")(x)


def reduced_keys_values(x, grid, sr_ratio: int, linear: bool, name: str):
    """The tokens keys and values are computed from: the map reduced by an
    sr x sr stride-sr conv + LayerNorm, pooled to 7x7 (+ 1x1 conv, LayerNorm,
    GELU) for the linear variant, or ``x`` itself where sr is 1."""
    if not linear and sr_ratio == 1:
        return x
    dim = x.shape[-1]
    x = to_map(x, grid, f"{name}.to_map")
    if linear:
        pool = (grid[0] // LINEAR_POOL, grid[1] // LINEAR_POOL)
        x = layers.AveragePooling2D(pool, pool, name=f"{name}.pool")(x)
        x = layers.Conv2D(dim, 1, kernel_initializer=CONV_INIT, name=f"{name}.sr")(x)
    else:
        x = layers.Conv2D(dim, sr_ratio, sr_ratio, kernel_initializer=CONV_INIT, name=f"{name}.sr")(x)
    x = LayerNorm(epsilon=EMBED_LN_EPS, name=f"{name}.norm")(to_tokens(x, f"{name}.reduced"))
    if linear:
        x = layers.Activation("gelu", name=f"{name}.act")(x)
    return x


def spatial_reduction_attention(x, grid, num_heads: int, sr_ratio: int, linear: bool, name: str):
    """Queries from every token, keys and values from the reduced map (one
    ``kv`` projection ordered (k | v, head, head_dim), as in timm)."""
    dim = x.shape[-1]
    q = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.q")(x)
    kv = layers.Dense(2 * dim, kernel_initializer=DENSE_INIT,
                      name=f"{name}.kv")(reduced_keys_values(x, grid, sr_ratio, linear, name))
    k, v = TokenSplit([dim, dim], axis=-1, name=f"{name}.split_kv")(kv)
    out = HeadAttention(num_heads, name=f"{name}.heads")([q, k, v])
    return layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.proj")(out)


def depthwise_conv_mlp(x, grid, hidden: int, extra_relu: bool, name: str):
    """fc1 -> 3x3 depthwise conv on the map -> GELU -> fc2."""
    dim = x.shape[-1]
    x = to_map(layers.Dense(hidden, kernel_initializer=DENSE_INIT, name=f"{name}.fc1")(x), grid, f"{name}.to_map")
    if extra_relu:
        x = layers.ReLU(name=f"{name}.relu")(x)
    x = layers.DepthwiseConv2D(3, padding="same", depthwise_initializer=CONV_INIT, name=f"{name}.dwconv")(x)
    x = layers.Activation("gelu", name=f"{name}.act")(to_tokens(x, f"{name}.to_tokens"))
    return layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.fc2")(x)


def pvt_block(x, grid, num_heads: int, mlp_ratio: float, sr_ratio: int, linear: bool, drop_path: float, name: str):
    dim = x.shape[-1]
    y = spatial_reduction_attention(LayerNorm(epsilon=LN_EPS, name=f"{name}.norm1")(x), grid, num_heads, sr_ratio,
                                    linear, name=f"{name}.attn")
    x = residual(x, y, drop_path, name, 1)
    y = depthwise_conv_mlp(LayerNorm(epsilon=LN_EPS, name=f"{name}.norm2")(x), grid, int(dim * mlp_ratio), linear,
                           name=f"{name}.mlp")
    return residual(x, y, drop_path, name, 2)


def build_pvt_v2(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    x = overlap_patch_embed(inputs, cfg.dims[0], 7, 4, name="patch_embed")
    rates = drop_path_rates(drop_path_rate, sum(cfg.depths))
    for s, depth in enumerate(cfg.depths):
        prefix = f"stages.{s}"
        if s:
            x = overlap_patch_embed(x, cfg.dims[s], 3, 2, name=f"{prefix}.downsample")
        grid = tuple(x.shape[1:3])
        x = to_tokens(x, f"{prefix}.flatten")
        for i in range(depth):
            x = pvt_block(x, grid, cfg.heads[s], cfg.mlp_ratios[s], cfg.sr_ratios[s], cfg.linear, rates.pop(0),
                          name=f"{prefix}.blocks.{i}")
        x = LayerNorm(epsilon=LN_EPS, name=f"{prefix}.norm")(x)
        if s < len(cfg.depths) - 1:
            x = to_map(x, grid, f"{prefix}.unflatten")
    return keras.Model(inputs, mean_pool_head(x, num_classes), name=name)


# timm's copies of the official release (timm's own ImageNet top-1).
PRETRAINED = {
    "pvt_v2_b0": timm_weights("pvt_v2_b0.in1k", 70.654, "Apache-2.0"),
    "pvt_v2_b1": timm_weights("pvt_v2_b1.in1k", 78.698, "Apache-2.0"),
    "pvt_v2_b2": timm_weights("pvt_v2_b2.in1k", 82.062, "Apache-2.0"),
    "pvt_v2_b2_li": timm_weights("pvt_v2_b2_li.in1k", 82.200, "Apache-2.0"),
    "pvt_v2_b3": timm_weights("pvt_v2_b3.in1k", 83.120, "Apache-2.0"),
    "pvt_v2_b4": timm_weights("pvt_v2_b4.in1k", 83.710, "Apache-2.0"),
    "pvt_v2_b5": timm_weights("pvt_v2_b5.in1k", 83.760, "Apache-2.0"),
}

_PVT = dict(family="pvt_v2", default_input_size=224, preprocessing=PREPROCESS_PVT, input_size_multiple=32,
            reference=REFERENCE_PVT, checkpoint_formats=("timm", "official"), options=builder_options(build_pvt_v2),
            pretrained=PRETRAINED)


@register_model(**_PVT)
def pvt_v2_b0(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pvt_v2("pvt_v2_b0", num_classes, input_size, **options)


@register_model(**_PVT)
def pvt_v2_b1(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pvt_v2("pvt_v2_b1", num_classes, input_size, **options)


@register_model(**_PVT)
def pvt_v2_b2(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pvt_v2("pvt_v2_b2", num_classes, input_size, **options)


@register_model(**{**_PVT, "input_size_multiple": 32 * LINEAR_POOL})
def pvt_v2_b2_li(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pvt_v2("pvt_v2_b2_li", num_classes, input_size, **options)


@register_model(**_PVT)
def pvt_v2_b3(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pvt_v2("pvt_v2_b3", num_classes, input_size, **options)


@register_model(**_PVT)
def pvt_v2_b4(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pvt_v2("pvt_v2_b4", num_classes, input_size, **options)


@register_model(**_PVT)
def pvt_v2_b5(num_classes: int = 1000, input_size: int = 224, **options):
    return build_pvt_v2("pvt_v2_b5", num_classes, input_size, **options)
