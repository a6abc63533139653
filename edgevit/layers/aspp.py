"""Atrous spatial pyramid pooling (DeepLabV3, Chen et al. 2017), laid out as
transformers' and ml-cvnets' MobileViT segmenters have it.

Five branches over the same map: a 1x1 convolution, three 3x3 convolutions
dilated at ``rates``, and image pooling (global mean -> 1x1 convolution ->
back to the map's size); their concatenation is projected by a 1x1
convolution. Every convolution is followed by BatchNorm and ReLU.
"""
from __future__ import annotations

from keras import layers

from edgevit.layers.conv import conv_norm_act
from edgevit.layers.patches import ResizeBilinear


def image_pooling(x, channels: int, *, name: str):
    """Global mean -> 1x1 conv -> the map's size again. The 1x1 map is spread
    with a bilinear resize (half-pixel centres, as PyTorch's
    ``align_corners=False``): from one pixel it copies that pixel, the int8
    kernel keeps its input's scale (no arithmetic to round), and both
    delegates' rule tables take RESIZE_BILINEAR (``edgevit/litert/gpu_rules.py``,
    ``nnapi_rules.py``). A broadcast would be BROADCAST_TO or an elementwise op
    between operands of different shapes, which the GPU delegate lays out by
    rank (DEVELOPERS.md, "Right answers on GPUs")."""
    size = tuple(x.shape[1:3])
    y = layers.GlobalAveragePooling2D(keepdims=True, name=f"{name}.pool")(x)
    y = conv_norm_act(y, channels, 1, activation="relu", name=f"{name}.conv_1x1")
    return ResizeBilinear(size, align_corners=False, name=f"{name}.resize")(y)


def aspp(x, channels: int, rates: tuple[int, ...], *, dropout: float = 0.0, name: str):
    """ASPP over ``x``: ``[B, H, W, channels]`` at the input's resolution."""
    branches = [conv_norm_act(x, channels, 1, activation="relu", name=f"{name}.convs.0")]
    branches += [conv_norm_act(x, channels, 3, dilation=rate, activation="relu", name=f"{name}.convs.{i + 1}")
                 for i, rate in enumerate(rates)]
    branches.append(image_pooling(x, channels, name=f"{name}.convs.{len(rates) + 1}"))
    y = layers.Concatenate(name=f"{name}.concat")(branches)
    y = conv_norm_act(y, channels, 1, activation="relu", name=f"{name}.project")
    if dropout:
        y = layers.Dropout(dropout, name=f"{name}.drop")(y)
    return y
