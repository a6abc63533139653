"""MobileViT v2 and the v2-based MobileViT v3 (width multipliers 0.5-2.0).

v2 (Mehta & Rastegari, 2022) replaces multi-head attention with separable
self-attention (linear in the number of patches, no activation-by-activation
matmul), uses GroupNorm(1) ("layer_norm_2d") and drops the fusion conv.
v3 on v2 fuses [global, local] features with the projection conv and adds the
block input back.
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers

from edgevit.layers import (Fold, LayerNorm, Unfold, conv_norm_act, inverted_residual, make_divisible,
                            separable_attention_block)
from edgevit.models.common import image_input
from edgevit.models.mobilevit import (CVNETS_LICENCE, PATCH_SIZE, REFERENCE_CVNETS, REFERENCE_V3, classifier,
                                      downsampling, mobilenet_stage, mobilevitv3_release, patch_grid, resize_to,
                                      stem)
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

# ml-cvnets v0.2 evaluates at 256x256 after resizing the shorter side to 288
# (bicubic), pixels in [0, 1], no mean/std; timm's crop 0.888 is the same.
PREPROCESS_V2 = Preprocessing(input_size=256, resize_size=288, interpolation="bicubic")
EXPAND_RATIO = 2
FFN_MULTIPLIER = 2
DEPTHS = (2, 4, 3)


@dataclass(frozen=True)
class MobileViTv2Config:
    """Every width follows from the multiplier as in the official config."""

    width: float
    version: int = 2

    @property
    def stem_channels(self) -> int:
        return make_divisible(min(max(32 * self.width, 16), 64), 8, min_value=16)

    @property
    def channels(self) -> tuple[int, ...]:
        return (make_divisible(64 * self.width, 16),
                *(make_divisible(c * self.width, 8) for c in (128, 256, 384, 512)))

    @property
    def dims(self) -> tuple[int, int, int]:
        return tuple(make_divisible(c * self.width, 8) for c in (128, 192, 256))


CONFIGS = {
    **{f"mobilevit_v2_{w}": MobileViTv2Config(int(w) / 100)
       for w in ("050", "075", "100", "125", "150", "175", "200")},
    **{f"mobilevit_v3_{w}": MobileViTv2Config(int(w) / 100, version=3) for w in ("050", "075", "100")},
}


def mobilevit_v2_block(x, dim: int, depth: int, *, version: int, dropout: float, attn_dropout: float,
                       ffn_dropout: float, dilation: int = 1, name: str):
    channels = x.shape[-1]
    # The official block resizes its input (align_corners=True) when the map
    # is off the patch grid, and keeps that size.
    x = resize_to(x, patch_grid(x), align_corners=True, name=f"{name}.resize_in")
    local = conv_norm_act(x, None, 3, depthwise=True, dilation=dilation, name=f"{name}.local_rep.conv_3x3")
    local = conv_norm_act(local, dim, 1, norm=False, activation=None, use_bias=False,
                          name=f"{name}.local_rep.conv_1x1")

    ffn_dim = FFN_MULTIPLIER * dim // 16 * 16
    y = Unfold(PATCH_SIZE, pixels_in_batch=False, name=f"{name}.unfold")(local)
    for i in range(depth):
        y = separable_attention_block(y, dim, ffn_dim, dropout=dropout, attn_dropout=attn_dropout,
                                      ffn_dropout=ffn_dropout, name=f"{name}.global_rep.{i}")
    y = LayerNorm(axes=(1, 2, 3), name=f"{name}.global_rep.{depth}")(y)
    y = Fold(tuple(local.shape[1:3]), PATCH_SIZE, pixels_in_batch=False, name=f"{name}.fold")(y)
    if version == 2:
        return conv_norm_act(y, channels, 1, activation=None, name=f"{name}.conv_proj")
    y = layers.Concatenate(name=f"{name}.concat")([y, local])
    y = conv_norm_act(y, channels, 1, activation=None, name=f"{name}.conv_proj")
    return layers.Add(name=f"{name}.add")([y, x])


def mobilevit_v2_features(inputs, name: str, output_stride: int = 32, *, dropout: float = 0.0,
                          attn_dropout: float = 0.0, ffn_dropout: float = 0.0, dilate_blocks: bool = False) -> list:
    """The outputs of layers 3, 4 and 5, as ``mobilevit.mobilevit_features``.
    ``dilate_blocks``: a layer that dilates (below output stride 32) dilates
    its block's depthwise 3x3 too, at the layer's dilation (twice its
    inverted residual's), as ml-cvnets' MobileViTBlockv2 does and its v2
    segmentation checkpoints were trained; transformers' port dilates none."""
    cfg = CONFIGS[name]
    x = stem(inputs, cfg.stem_channels)
    x = mobilenet_stage(x, cfg.channels[0], 1, 1, EXPAND_RATIO, name="layer_1")
    x = mobilenet_stage(x, cfg.channels[1], 2, 2, EXPAND_RATIO, name="layer_2")
    features = []
    for i, (strides, dilation) in enumerate(downsampling(output_stride)):
        stage = f"layer_{i + 3}"
        x = inverted_residual(x, cfg.channels[i + 2], strides, EXPAND_RATIO, dilation=dilation, name=f"{stage}.0")
        block_dilation = 2 * dilation if dilate_blocks and strides == 1 else 1
        x = mobilevit_v2_block(x, cfg.dims[i], DEPTHS[i], version=cfg.version, dropout=dropout,
                               attn_dropout=attn_dropout, ffn_dropout=ffn_dropout, dilation=block_dilation,
                               name=f"{stage}.1")
        features.append(x)
    return features


def build_mobilevit_v2(name: str, num_classes: int = 1000, input_size: int = 256, *, dropout: float = 0.0,
                       attn_dropout: float = 0.0, ffn_dropout: float = 0.0,
                       classifier_dropout: float = 0.0) -> keras.Model:
    inputs = image_input(input_size)
    x = mobilevit_v2_features(inputs, name, dropout=dropout, attn_dropout=attn_dropout,
                              ffn_dropout=ffn_dropout)[-1]
    outputs = classifier(x, num_classes, classifier_dropout)
    return keras.Model(inputs, outputs, name=name)


# Official ImageNet weights (``weights="imagenet"``). cvnets v0.2 reads
# images with PIL, so all of these take RGB. v2: timm's copies of Apple's
# weights; 1.5-2.0 take Apple's ImageNet-21k pretrained, ImageNet-1k
# fine-tuned weights at 256 (same size, same preprocessing, +1.1 top-1 over
# the ImageNet-1k ones). v3: the MobileViTv3 release.
PRETRAINED = {
    "mobilevit_v2_050": timm_weights("mobilevitv2_050.cvnets_in1k", 70.156, CVNETS_LICENCE),
    "mobilevit_v2_075": timm_weights("mobilevitv2_075.cvnets_in1k", 75.612, CVNETS_LICENCE),
    "mobilevit_v2_100": timm_weights("mobilevitv2_100.cvnets_in1k", 78.088, CVNETS_LICENCE),
    "mobilevit_v2_125": timm_weights("mobilevitv2_125.cvnets_in1k", 79.682, CVNETS_LICENCE),
    "mobilevit_v2_150": timm_weights("mobilevitv2_150.cvnets_in22k_ft_in1k", 81.466, CVNETS_LICENCE),
    "mobilevit_v2_175": timm_weights("mobilevitv2_175.cvnets_in22k_ft_in1k", 81.950, CVNETS_LICENCE),
    "mobilevit_v2_200": timm_weights("mobilevitv2_200.cvnets_in22k_ft_in1k", 82.320, CVNETS_LICENCE),
    "mobilevit_v3_050": mobilevitv3_release("mobilevitv3_0_5_0", 72.33, "RGB"),
    "mobilevit_v3_075": mobilevitv3_release("mobilevitv3_0_7_5", 76.55, "RGB"),
    "mobilevit_v3_100": mobilevitv3_release("mobilevitv3_1_0_0", 78.64, "RGB"),
}

_V2 = dict(family="mobilevit_v2", default_input_size=256, preprocessing=PREPROCESS_V2,
           reference=REFERENCE_CVNETS, checkpoint_formats=("timm", "cvnets"),
           options=builder_options(build_mobilevit_v2), pretrained=PRETRAINED)
_V3 = dict(family="mobilevit_v3", default_input_size=256, preprocessing=PREPROCESS_V2,
           reference=REFERENCE_V3, checkpoint_formats=("cvnets",), options=builder_options(build_mobilevit_v2),
           pretrained=PRETRAINED)


@register_model(**_V2)
def mobilevit_v2_050(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v2_050", num_classes, input_size, **options)


@register_model(**_V2)
def mobilevit_v2_075(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v2_075", num_classes, input_size, **options)


@register_model(**_V2)
def mobilevit_v2_100(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v2_100", num_classes, input_size, **options)


@register_model(**_V2)
def mobilevit_v2_125(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v2_125", num_classes, input_size, **options)


@register_model(**_V2)
def mobilevit_v2_150(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v2_150", num_classes, input_size, **options)


@register_model(**_V2)
def mobilevit_v2_175(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v2_175", num_classes, input_size, **options)


@register_model(**_V2)
def mobilevit_v2_200(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v2_200", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_050(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v3_050", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_075(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v3_075", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_100(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit_v2("mobilevit_v3_100", num_classes, input_size, **options)
