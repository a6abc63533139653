"""What MobileViT v1, v2 and v3 share: stem, MobileNetV2 stages, the patch
grid around the transformer, classifier head and preprocessing."""
from __future__ import annotations

import math

import keras
from keras import layers

from edgevit.layers import ResizeBilinear, conv_norm_act, inverted_residual
from edgevit.layers.conv import DENSE_INIT
from edgevit.registry import Preprocessing

PATCH_SIZE = 2
REFERENCE_CVNETS = "https://github.com/apple/ml-cvnets"
REFERENCE_V3 = "https://github.com/micronDLA/MobileViTv3"

# ml-cvnets evaluates at 256x256 after resizing the shorter side to 288, on
# pixels in [0, 1] with no mean/std normalisation.
PREPROCESS_V1 = Preprocessing(input_size=256, resize_size=288, interpolation="bilinear")
PREPROCESS_V2 = Preprocessing(input_size=256, resize_size=288, interpolation="bicubic")


def image_input(input_size: int):
    return keras.Input((input_size, input_size, 3), batch_size=None, name="image")


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


def stem(x, channels: int):
    return conv_norm_act(x, channels, 3, 2, name="stem")
