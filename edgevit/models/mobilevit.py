"""MobileViT v1 and the v1-based MobileViT v3 (xxs / xs / s and their _l2
low-latency variants).

v1 (Mehta & Rastegari, 2021): a 3x3 conv and a 1x1 conv give local features,
a transformer mixes patches, a 1x1 conv projects back and a 3x3 conv fuses
the result with the block input.
v3 (Wadekar & Chaurasia, 2022): the local 3x3 conv is depthwise, the fusion is
a 1x1 conv over [local features, global features], and the block input is
added back as a residual; channel widths of layers 3-5 are larger.

The stem, MobileNetV2 stages, patch grid and classifier defined here are
shared with MobileViT v2 (``mobilevit_v2.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import keras
from keras import layers

from edgevit.layers import (Fold, LayerNorm, ResizeBilinear, Unfold, conv_norm_act, inverted_residual,
                            transformer_encoder)
from edgevit.layers.conv import DENSE_INIT
from edgevit.models.common import image_input
from edgevit.registry import TOP1, Preprocessing, builder_options, register_model, timm_weights, url_weights

PATCH_SIZE = 2
REFERENCE_CVNETS = "https://github.com/apple/ml-cvnets"
REFERENCE_V3 = "https://github.com/micronDLA/MobileViTv3"
# ml-cvnets v0.1 (MobileViT v1, and MobileViTv3-XXS/XS/S on top of it)
# evaluates at 256x256 after resizing the shorter side to 288 (OpenCV
# bilinear), on pixels in [0, 1] with no mean/std normalisation.
PREPROCESS_CVNETS_V01 = Preprocessing(input_size=256, resize_size=288, interpolation="bilinear")
# timm evaluates its copies of the v1 weights with crop 0.9, bicubic
# (timm's default_cfgs; results-imagenet.csv gives the top-1 below).
PREPROCESS_V1 = Preprocessing(input_size=256, resize_size=284, interpolation="bicubic")
NUM_HEADS = 4
MAX_HEAD_CHANNELS = 960
# Strides of the last feature map a backbone can give (32: the classifiers').
OUTPUT_STRIDES = (8, 16, 32)


@dataclass(frozen=True)
class MobileViTConfig:
    expand_ratio: int
    channels: tuple[int, int, int, int, int]   # output of layers 1..5
    dims: tuple[int, int, int]                 # transformer width in layers 3..5
    depths: tuple[int, int, int] = (2, 4, 3)   # transformer blocks in layers 3..5
    version: int = 1

    @property
    def ffn_dims(self):
        return tuple(2 * d for d in self.dims)


CONFIGS = {
    "mobilevit_v1_xxs": MobileViTConfig(2, (16, 24, 48, 64, 80), (64, 80, 96)),
    "mobilevit_v1_xs": MobileViTConfig(4, (32, 48, 64, 80, 96), (96, 120, 144)),
    "mobilevit_v1_s": MobileViTConfig(4, (32, 64, 96, 128, 160), (144, 192, 240)),
    "mobilevit_v3_xxs": MobileViTConfig(2, (16, 24, 64, 80, 128), (64, 80, 96), version=3),
    "mobilevit_v3_xs": MobileViTConfig(4, (32, 48, 96, 160, 160), (96, 120, 144), version=3),
    "mobilevit_v3_s": MobileViTConfig(4, (32, 64, 128, 256, 320), (144, 192, 240), version=3),
    # "_fast" in the official configs: two transformer blocks in layer 4
    "mobilevit_v3_xxs_l2": MobileViTConfig(2, (16, 24, 64, 80, 128), (64, 80, 96), (2, 2, 3), 3),
    "mobilevit_v3_xs_l2": MobileViTConfig(4, (32, 48, 96, 160, 160), (96, 120, 144), (2, 2, 3), 3),
    "mobilevit_v3_s_l2": MobileViTConfig(4, (32, 64, 128, 256, 320), (144, 192, 240), (2, 2, 3), 3),
}

CVNETS_LICENCE = "Apple ml-cvnets licence (https://github.com/apple/ml-cvnets/blob/main/LICENSE)"
MOBILEVITV3_LICENCE = ("non-commercial only: Micron licence for personal, non-commercial use "
                       "(https://github.com/micronDLA/MobileViTv3/blob/main/LICENSE), on Apple's ml-cvnets")
MOBILEVITV3_RELEASE = "https://github.com/micronDLA/MobileViTv3/releases/download/v1.0.0/"


def mobilevitv3_release(folder: str, top1: float, channel_order: str, metric: str = TOP1):
    """A MobileViTv3 release checkpoint: ``checkpoint_ema_best.pt`` (the file
    its README's accuracies come from) in the release's ``folder``.zip, whose
    README gives no checksum."""
    return url_weights(f"{MOBILEVITV3_RELEASE}{folder}.zip", f"{folder}/checkpoint_ema_best.pt", top1,
                       MOBILEVITV3_LICENCE, tag=folder, naming="cvnets", channel_order=channel_order, metric=metric)


# Official ImageNet weights (``weights="imagenet"``). v1: timm's copies of
# Apple's weights, which take RGB (Apple's own .pt files take BGR; see
# docs/pretrained.md for how this is known). v3: the MobileViTv3 release;
# the v1-based variants were trained on cvnets v0.1, which reads images with
# OpenCV (BGR), so their stem gets its input channels swapped at import.
PRETRAINED = {
    "mobilevit_v1_xxs": timm_weights("mobilevit_xxs.cvnets_in1k", 68.936, CVNETS_LICENCE),
    "mobilevit_v1_xs": timm_weights("mobilevit_xs.cvnets_in1k", 74.618, CVNETS_LICENCE),
    "mobilevit_v1_s": timm_weights("mobilevit_s.cvnets_in1k", 78.298, CVNETS_LICENCE),
    "mobilevit_v3_xxs": mobilevitv3_release("mobilevitv3_XXS_e300_7098", 70.98, "BGR"),
    "mobilevit_v3_xs": mobilevitv3_release("mobilevitv3_XS_e300_7671", 76.7, "BGR"),
    "mobilevit_v3_s": mobilevitv3_release("mobilevitv3_S_e300_7930", 79.3, "BGR"),
    "mobilevit_v3_xxs_l2": mobilevitv3_release("mobilevitv3_XXS_L2_e300_7023", 70.23, "BGR"),
    "mobilevit_v3_xs_l2": mobilevitv3_release("mobilevitv3_XS_L2_e300_7610", 76.10, "BGR"),
    "mobilevit_v3_s_l2": mobilevitv3_release("mobilevitv3_S_L2_e300_7906", 79.06, "BGR"),
}

# Official training settings, the builder's defaults; dropout only acts while training.
DROPOUT, ATTN_DROPOUT, FFN_DROPOUT, CLASSIFIER_DROPOUT = 0.1, 0.0, 0.0, 0.1


def stem(x, channels: int):
    return conv_norm_act(x, channels, 3, 2, name="stem")


def mobilenet_stage(x, out_channels: int, num_blocks: int, strides: int, expand_ratio: float, name: str):
    for i in range(num_blocks):
        x = inverted_residual(x, out_channels, strides if i == 0 else 1, expand_ratio, name=f"{name}.{i}")
    return x


def patch_grid(x):
    """(height, width) of ``x`` rounded up to whole patches."""
    h, w = x.shape[1:3]
    return (math.ceil(h / PATCH_SIZE) * PATCH_SIZE, math.ceil(w / PATCH_SIZE) * PATCH_SIZE)


def resize_to(x, size, *, align_corners: bool, name: str):
    """Bilinear resize when the map is off the patch grid (only at input
    sizes that are not multiples of 64), identity otherwise."""
    if tuple(x.shape[1:3]) == tuple(size):
        return x
    return ResizeBilinear(size, align_corners=align_corners, name=name)(x)


def classifier(x, num_classes: int, dropout: float, name: str = "head"):
    x = layers.GlobalAveragePooling2D(name=f"{name}.pool")(x)
    if dropout:
        x = layers.Dropout(dropout, name=f"{name}.drop")(x)
    return layers.Dense(num_classes, kernel_initializer=DENSE_INIT, name=f"{name}.fc")(x)


def mobilevit_block(x, dim: int, ffn_dim: int, depth: int, *, version: int, dropout: float, attn_dropout: float,
                    ffn_dropout: float, name: str):
    channels = x.shape[-1]
    shortcut = x
    local = conv_norm_act(x, channels, 3, depthwise=version == 3, name=f"{name}.local_rep.conv_3x3")
    local = conv_norm_act(local, dim, 1, norm=False, activation=None, use_bias=False,
                          name=f"{name}.local_rep.conv_1x1")

    size, grid = tuple(local.shape[1:3]), patch_grid(local)
    y = resize_to(local, grid, align_corners=False, name=f"{name}.resize_in")
    y = Unfold(PATCH_SIZE, pixels_in_batch=True, name=f"{name}.unfold")(y)
    for i in range(depth):
        y = transformer_encoder(y, dim, ffn_dim, NUM_HEADS, dropout=dropout, attn_dropout=attn_dropout,
                                ffn_dropout=ffn_dropout, name=f"{name}.global_rep.{i}")
    y = LayerNorm(name=f"{name}.global_rep.{depth}")(y)
    y = Fold(grid, PATCH_SIZE, pixels_in_batch=True, name=f"{name}.fold")(y)
    y = resize_to(y, size, align_corners=False, name=f"{name}.resize_out")
    y = conv_norm_act(y, channels, 1, name=f"{name}.conv_proj")

    if version == 1:
        y = layers.Concatenate(name=f"{name}.concat")([shortcut, y])
        return conv_norm_act(y, channels, 3, name=f"{name}.fusion")
    y = layers.Concatenate(name=f"{name}.concat")([local, y])
    y = conv_norm_act(y, channels, 1, name=f"{name}.fusion")
    return layers.Add(name=f"{name}.add")([y, shortcut])


def downsampling(output_stride: int) -> tuple[tuple[int, int], ...]:
    """(stride, dilation) of the inverted residual that opens layers 3, 4 and 5
    (each halves the map at ``output_stride`` 32). Below 32, a layer that would
    pass ``output_stride`` keeps the map's size and the layers from there on
    dilate instead (DeepLabV3): its own inverted residual takes the dilation
    reached before it (cvnets' ``prev_dilation``, transformers'
    ``dilation // 2``), the next layer's twice that. The MobileViT blocks'
    convolutions are never dilated: transformers' ports, which the public
    segmentation checkpoints run on, dilate none of them."""
    if output_stride not in OUTPUT_STRIDES:
        raise ValueError(f"output_stride must be one of {OUTPUT_STRIDES}, got {output_stride}")
    plan, dilation = [(2, 1)], 1
    for reached in (16, 32):  # the stride layer 4, then layer 5, would reach
        if reached > output_stride:
            plan.append((1, dilation))
            dilation *= 2
        else:
            plan.append((2, 1))
    return tuple(plan)


def mobilevit_features(inputs, name: str, output_stride: int = 32, *, dropout: float = DROPOUT,
                       attn_dropout: float = ATTN_DROPOUT, ffn_dropout: float = FFN_DROPOUT) -> list:
    """The outputs of layers 3, 4 and 5: feature maps at strides 8, 16 and 32,
    or 8, 16, 16 and 8, 8, 8 at ``output_stride`` 16 and 8."""
    cfg = CONFIGS[name]
    x = stem(inputs, 16)
    x = mobilenet_stage(x, cfg.channels[0], 1, 1, cfg.expand_ratio, name="layer_1")
    x = mobilenet_stage(x, cfg.channels[1], 3, 2, cfg.expand_ratio, name="layer_2")
    features = []
    for i, (strides, dilation) in enumerate(downsampling(output_stride)):
        stage = f"layer_{i + 3}"
        x = inverted_residual(x, cfg.channels[i + 2], strides, cfg.expand_ratio, dilation=dilation,
                              name=f"{stage}.0")
        x = mobilevit_block(x, cfg.dims[i], cfg.ffn_dims[i], cfg.depths[i], version=cfg.version, dropout=dropout,
                            attn_dropout=attn_dropout, ffn_dropout=ffn_dropout, name=f"{stage}.1")
        features.append(x)
    return features


def build_mobilevit(name: str, num_classes: int = 1000, input_size: int = 256, *, dropout: float = DROPOUT,
                    attn_dropout: float = ATTN_DROPOUT, ffn_dropout: float = FFN_DROPOUT,
                    classifier_dropout: float = CLASSIFIER_DROPOUT) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    x = mobilevit_features(inputs, name, dropout=dropout, attn_dropout=attn_dropout, ffn_dropout=ffn_dropout)[-1]
    x = conv_norm_act(x, min(4 * cfg.channels[4], MAX_HEAD_CHANNELS), 1, name="conv_1x1_exp")
    outputs = classifier(x, num_classes, classifier_dropout)
    return keras.Model(inputs, outputs, name=name)


_V1 = dict(family="mobilevit_v1", default_input_size=256, preprocessing=PREPROCESS_V1,
           reference=REFERENCE_CVNETS, checkpoint_formats=("timm", "cvnets"), options=builder_options(build_mobilevit),
           pretrained=PRETRAINED)
_V3 = dict(family="mobilevit_v3", default_input_size=256, preprocessing=PREPROCESS_CVNETS_V01,
           reference=REFERENCE_V3, checkpoint_formats=("cvnets",), options=builder_options(build_mobilevit),
           pretrained=PRETRAINED)


@register_model(**_V1)
def mobilevit_v1_xxs(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v1_xxs", num_classes, input_size, **options)


@register_model(**_V1)
def mobilevit_v1_xs(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v1_xs", num_classes, input_size, **options)


@register_model(**_V1)
def mobilevit_v1_s(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v1_s", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_xxs(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v3_xxs", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_xs(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v3_xs", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_s(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v3_s", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_xxs_l2(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v3_xxs_l2", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_xs_l2(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v3_xs_l2", num_classes, input_size, **options)


@register_model(**_V3)
def mobilevit_v3_s_l2(num_classes: int = 1000, input_size: int = 256, **options):
    return build_mobilevit("mobilevit_v3_s_l2", num_classes, input_size, **options)
