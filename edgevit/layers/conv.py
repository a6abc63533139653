"""Convolution blocks shared by the CNN stages of every hybrid family.

Layouts and padding follow PyTorch so that official checkpoints load without
re-training: a stride-2 convolution pads one pixel on every side explicitly
(Keras "same" would pad only bottom/right on even inputs and shift the grid).
"""
from __future__ import annotations

from keras import layers

BN_EPSILON = 1e-5
BN_MOMENTUM = 0.9  # PyTorch momentum 0.1

# He-normal over fan-out and truncated-normal(0.02) dense layers, as the
# official MobileViT and timm training recipes initialise them. Configs, not
# instances: each layer deserialises its own initializer and so draws its own
# seed after keras.utils.set_random_seed. A module-level instance takes one
# seed at import time, gives every layer of a shape the same values, and makes
# random weights depend on what ran before the import.
CONV_INIT = {"class_name": "VarianceScaling",
             "config": {"scale": 2.0, "mode": "fan_out", "distribution": "untruncated_normal"}}
DENSE_INIT = {"class_name": "TruncatedNormal", "config": {"stddev": 0.02}}


def make_divisible(value: float, divisor: int = 8, min_value: int | None = None) -> int:
    """Round a channel count to a multiple of ``divisor`` without losing more than 10%."""
    min_value = min_value or divisor
    rounded = max(min_value, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return int(rounded)


def conv_norm_act(x, filters: int | None, kernel_size: int = 1, strides: int = 1, *,
                  depthwise: bool = False, norm: bool = True, activation: str | None = "silu",
                  use_bias: bool | None = None, dilation: int = 1, initializer=CONV_INIT, name: str):
    """Conv (or depthwise conv) -> BatchNorm -> activation, named like the
    PyTorch module path (``name.conv``, ``name.norm``); the kernel drawn by
    ``initializer`` (a Keras initializer config). A dilated
    convolution (stride 1 only) pads ``dilation`` pixels per side, as
    PyTorch's ``padding=(k - 1) // 2 * dilation``: Keras "same" does the same."""
    if dilation > 1 and strides > 1:
        raise ValueError(f"{name}: a convolution is either strided or dilated, not both")
    use_bias = (not norm) if use_bias is None else use_bias
    padding = "same"
    if strides > 1 and kernel_size > 1:
        x = layers.ZeroPadding2D(kernel_size // 2, name=f"{name}.pad")(x)
        padding = "valid"
    if depthwise:
        x = layers.DepthwiseConv2D(kernel_size, strides, padding=padding, use_bias=use_bias, dilation_rate=dilation,
                                   depthwise_initializer=initializer, name=f"{name}.conv")(x)
    else:
        x = layers.Conv2D(filters, kernel_size, strides, padding=padding, use_bias=use_bias, dilation_rate=dilation,
                          kernel_initializer=initializer, name=f"{name}.conv")(x)
    if norm:
        x = layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name=f"{name}.norm")(x)
    if activation:
        x = layers.Activation(activation, name=f"{name}.act")(x)
    return x


def inverted_residual(x, out_channels: int, strides: int, expand_ratio: float, *, dilation: int = 1, name: str):
    """MobileNetV2 block: 1x1 expand -> 3x3 depthwise (dilated in the
    backbones of dense predictors) -> 1x1 project (+ residual)."""
    in_channels = x.shape[-1]
    hidden = make_divisible(round(in_channels * expand_ratio), 8)
    shortcut = x
    if expand_ratio != 1:
        x = conv_norm_act(x, hidden, 1, name=f"{name}.exp_1x1")
    x = conv_norm_act(x, None, 3, strides, depthwise=True, dilation=dilation, name=f"{name}.conv_3x3")
    x = conv_norm_act(x, out_channels, 1, activation=None, name=f"{name}.red_1x1")
    if strides == 1 and in_channels == out_channels:
        x = layers.Add(name=f"{name}.add")([shortcut, x])
    return x
