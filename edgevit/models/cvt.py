"""CvT, Convolutional vision Transformer (Wu et al., 2021): three stages,
each starting with a convolutional token embedding (overlapping strided conv
+ LayerNorm) that shrinks the map and widens the channels; in every block
the queries, keys and values are depthwise 3x3 conv + BatchNorm projections
of the token map (stride 2 for keys and values), followed by linear
projections. No position embedding; a class token joins in the last stage
only and feeds the head.

Sizes and conventions follow Hugging Face transformers' ``CvtConfig``
(CvT-13: depths 1/2/10, CvT-21: 1/4/16; widths 64/192/384, heads 1/3/6),
including the original attention scale ``dim ** -0.5`` (not per head) and
LayerNorm eps 1e-5. Layer names follow the official Microsoft code
(``stage2.blocks.0.attn.conv_proj_k.conv``, ``stage2.cls_token``).
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers

from edgevit.layers import (HeadAttention, LayerNorm, PrefixTokens, conv_norm_act, mlp, to_map, to_tokens)
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.tokens import DropPath, drop_path_rates
from edgevit.layers.transformer import join_groups, split_groups
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, class_token_head, image_input
from edgevit.registry import Preprocessing, builder_options, register_model, hub_weights

REFERENCE_CVT = "https://github.com/microsoft/CvT (Hugging Face transformers CvtConfig)"
# Official evaluation (experiments/imagenet/cvt/cvt-*-224x224.yaml set
# TEST.INTERPOLATION 3 = PIL bicubic over the default 2; the Hub's
# preprocessor_config says resample 3 too): shorter side 256 (crop 0.875),
# centre crop 224, ImageNet mean/std.
PREPROCESS_CVT = Preprocessing(224, 256, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
LN_EPS = 1e-5


@dataclass(frozen=True)
class CvTConfig:
    depths: tuple[int, int, int]
    dims: tuple[int, int, int] = (64, 192, 384)
    heads: tuple[int, int, int] = (1, 3, 6)
    patch_sizes: tuple[int, int, int] = (7, 3, 3)
    patch_strides: tuple[int, int, int] = (4, 2, 2)
    patch_padding: tuple[int, int, int] = (2, 1, 1)
    mlp_ratio: float = 4.0


CONFIGS = {"cvt_13": CvTConfig((1, 2, 10)), "cvt_21": CvTConfig((1, 4, 16))}


def conv_attention(groups, grid, dim: int, num_heads: int, name: str):
    """CvT attention on [class token group?, patch tokens] (already normalised)."""
    patches = to_map(groups[-1], grid, f"{name}.to_map")
    q = to_tokens(conv_norm_act(patches, None, 3, 1, depthwise=True, activation=None,
                                name=f"{name}.conv_proj_q"), f"{name}.q_tokens")
    k = to_tokens(conv_norm_act(patches, None, 3, 2, depthwise=True, activation=None,
                                name=f"{name}.conv_proj_k"), f"{name}.k_tokens")
    v = to_tokens(conv_norm_act(patches, None, 3, 2, depthwise=True, activation=None,
                                name=f"{name}.conv_proj_v"), f"{name}.v_tokens")
    if len(groups) > 1:  # the class token skips the conv projections
        q = join_groups([groups[0], q], f"{name}.join_q")
        k = join_groups([groups[0], k], f"{name}.join_k")
        v = join_groups([groups[0], v], f"{name}.join_v")
    q = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.proj_q")(q)
    k = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.proj_k")(k)
    v = layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.proj_v")(v)
    out = HeadAttention(num_heads, scale=dim ** -0.5, name=f"{name}.heads")([q, k, v])
    return layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.proj")(out)


def cvt_block(groups, grid, dim: int, num_heads: int, mlp_ratio: float, drop_path: float, name: str):
    norm1 = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm1")
    y = conv_attention([norm1(g) for g in groups], grid, dim, num_heads, name=f"{name}.attn")
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path1")(y)
    groups = [layers.Add(name=f"{name}.add1.{i}")([g, b])
              for i, (g, b) in enumerate(zip(groups, split_groups(y, groups, f"{name}.split1")))]
    norm2 = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm2")
    y = join_groups([norm2(g) for g in groups], f"{name}.join2")
    y = mlp(y, int(dim * mlp_ratio), dim, activation="gelu", dropout=0.0, name=f"{name}.mlp")
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path2")(y)
    return [layers.Add(name=f"{name}.add2.{i}")([g, b])
            for i, (g, b) in enumerate(zip(groups, split_groups(y, groups, f"{name}.split2")))]


def build_cvt(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    x = inputs
    rates = drop_path_rates(drop_path_rate, sum(cfg.depths))
    cls = None
    for s, depth in enumerate(cfg.depths):
        stage = f"stage{s}"
        x = layers.ZeroPadding2D(cfg.patch_padding[s], name=f"{stage}.patch_embed.pad")(x)
        x = layers.Conv2D(cfg.dims[s], cfg.patch_sizes[s], cfg.patch_strides[s], kernel_initializer=DENSE_INIT,
                          name=f"{stage}.patch_embed.proj")(x)
        grid = tuple(x.shape[1:3])
        tokens = LayerNorm(epsilon=LN_EPS, name=f"{stage}.patch_embed.norm")(to_tokens(x, f"{stage}.flatten"))
        groups = [tokens]
        if s == len(cfg.depths) - 1:  # class token in the last stage only, its own tensor
            cls = PrefixTokens(["cls_token"], [0.02], concat=False, name=f"{stage}.cls_token")(tokens)
            groups = [cls, tokens]
        for i in range(depth):
            groups = cvt_block(groups, grid, cfg.dims[s], cfg.heads[s], cfg.mlp_ratio, rates.pop(0),
                               name=f"{stage}.blocks.{i}")
        x = to_map(groups[-1], grid, f"{stage}.to_map")
        cls = groups[0]
    _, logits = class_token_head(cls, num_classes, epsilon=LN_EPS)
    return keras.Model(inputs, logits, name=name)


# Official ImageNet weights (``weights="imagenet"``): Microsoft's, on the
# Hub in transformers' naming; top-1 from microsoft/CvT's README. cvt-21 has
# no safetensors file, so it needs torch (pip install "edgevit[torch]").
CVT_LICENCE = "MIT (github.com/microsoft/CvT; the Hub model card says Apache-2.0)"
PRETRAINED = {
    "cvt_13": hub_weights("microsoft/cvt-13", "model.safetensors", 81.6, CVT_LICENCE, naming="huggingface"),
    "cvt_21": hub_weights("microsoft/cvt-21", "pytorch_model.bin", 82.5, CVT_LICENCE, naming="huggingface"),
}

_CVT = dict(family="cvt", default_input_size=224, preprocessing=PREPROCESS_CVT, input_size_multiple=16,
            reference=REFERENCE_CVT, checkpoint_formats=("huggingface",), options=builder_options(build_cvt),
            pretrained=PRETRAINED)


@register_model(**_CVT)
def cvt_13(num_classes: int = 1000, input_size: int = 224, **options):
    return build_cvt("cvt_13", num_classes, input_size, **options)


@register_model(**_CVT)
def cvt_21(num_classes: int = 1000, input_size: int = 224, **options):
    return build_cvt("cvt_21", num_classes, input_size, **options)
