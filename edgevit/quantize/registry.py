"""How quantization-aware training treats each layer class.

One entry per layer class, looked up by exact class (a subclass may compute
something else and must have its own entry), in the manner of
tensorflow-model-optimization's default 8-bit registry for Keras 2. An entry
says where the layer's int8 tensors get a range, which weights are int8 per
output channel, and which quantization-aware class replaces it:

- ``"input"``: no range of its own. LiteRT gives the op's output its input's
  scale (reshape, transpose, slice, split, pad, max pool, resize, dropout,
  and the unfold/fold and token slicing built from them).
- ``"output"``: one op; one range at each output of each call.
- ``"points"``: several ops; a range at every ``quantize_point`` of the
  layer (``edgevit.layers.quantize_points``), per call site.
- ``"folded"``: BatchNormalization, folded into the convolution before it.
- ``"shared"``: CONCATENATION, whose inputs and output LiteRT keeps at one
  scale: they share one range.

A model with a layer class that has no entry cannot be made
quantization-aware: :func:`rule_for` names the class. :func:`register` adds
an entry for a layer class of your own.
"""
from __future__ import annotations

from dataclasses import dataclass

import keras

from edgevit.errors import EdgevitError
from edgevit.layers import (BicubicResize, DropPath, Fold, HeadAttention, LayerNorm, MultiHeadSelfAttention,
                            PositionEmbedding, PrefixTokens, ResizeBilinear, SeparableSelfAttention, SpaceToChannels,
                            TokenSlice, Unfold)
from edgevit.layers.soft_split import SoftSplit
from edgevit.layers.transformer import TokenSplit
from edgevit.layers.windows import WindowMerge, WindowPartition
from edgevit.models.convit import GatedPositionalSelfAttention
from edgevit.models.cswin import ChannelSplit
from edgevit.models.deepvit import ReAttention
from edgevit.models.resmlp import Affine, LayerScale
from edgevit.models.swin import CosineWindowAttention, WindowAttention
from edgevit.models.t2t_vit import TokenAttention, TokenPerformer
from edgevit.quantize.conv_dense_layers import QuantConv2D, QuantDense, QuantDepthwiseConv2D
from edgevit.quantize.int8_ranges import UNIT_RANGE
from edgevit.quantize.multi_op_layers import (QuantActivation, QuantAffine, QuantAverage, QuantBicubicResize,
                                              QuantCosineWindowAttention, QuantGatedPositionalSelfAttention,
                                              QuantHeadAttention, QuantLayerNorm, QuantLayerScale,
                                              QuantMultiHeadSelfAttention, QuantPositionEmbedding, QuantReAttention,
                                              QuantSeparableSelfAttention, QuantTokenAttention, QuantTokenPerformer,
                                              QuantWindowAttention)

RANGE_KINDS = ("input", "output", "points", "folded", "shared")


@dataclass(frozen=True)
class QuantizeRule:
    """``ranges``: one of RANGE_KINDS. ``quantized_class``: the class that
    replaces the layer (built with :meth:`from_float` for ``"points"``).
    ``per_channel``: weights (attribute paths) on a per-output-channel int8
    grid; every other weight is a per-tensor int8 constant.
    ``fixed_range``: the output range LiteRT fixes for the op, if any.
    ``constant_output``: the output does not depend on the input's values
    (learned tokens): the converter folds what is computed from it alone."""

    ranges: str
    quantized_class: type | None = None
    per_channel: tuple[str, ...] = ()
    fixed_range: tuple[float, float] | None = None
    constant_output: bool = False

    def __post_init__(self):
        if self.ranges not in RANGE_KINDS:
            raise ValueError(f"ranges must be one of {RANGE_KINDS}, not {self.ranges!r}")


KEEPS_INPUT_SCALE = QuantizeRule("input")
ONE_OP = QuantizeRule("output")
ATTENTION_PROJECTIONS = ("qkv.kernel", "proj.kernel")

_REGISTRY: dict[type, QuantizeRule] = {
    **dict.fromkeys((keras.layers.InputLayer, keras.layers.ZeroPadding2D, keras.layers.Cropping2D,
                     keras.layers.Dropout, keras.layers.SpatialDropout2D, keras.layers.ActivityRegularization,
                     keras.layers.Identity, keras.layers.Reshape, keras.layers.Flatten, keras.layers.Permute,
                     keras.layers.MaxPooling2D, keras.layers.UpSampling2D, DropPath, Unfold, Fold,
                     ResizeBilinear, TokenSlice, TokenSplit), KEEPS_INPUT_SCALE),
    **dict.fromkeys((keras.layers.Add, keras.layers.Subtract, keras.layers.Multiply,
                     keras.layers.GlobalAveragePooling1D, keras.layers.GlobalAveragePooling2D,
                     keras.layers.AveragePooling2D, keras.layers.Rescaling), ONE_OP),
    PrefixTokens: QuantizeRule("output", constant_output=True),
    keras.layers.Concatenate: QuantizeRule("shared"),
    keras.layers.Softmax: QuantizeRule("output", fixed_range=UNIT_RANGE),
    keras.layers.Conv2D: QuantizeRule("output", QuantConv2D, ("kernel",)),
    keras.layers.DepthwiseConv2D: QuantizeRule("output", QuantDepthwiseConv2D, ("kernel",)),
    keras.layers.Dense: QuantizeRule("output", QuantDense, ("kernel",)),
    keras.layers.BatchNormalization: QuantizeRule("folded"),
    keras.layers.Activation: QuantizeRule("points", QuantActivation),
    keras.layers.Average: QuantizeRule("points", QuantAverage),
    LayerNorm: QuantizeRule("points", QuantLayerNorm),
    MultiHeadSelfAttention: QuantizeRule("points", QuantMultiHeadSelfAttention, ATTENTION_PROJECTIONS),
    SeparableSelfAttention: QuantizeRule("points", QuantSeparableSelfAttention, ATTENTION_PROJECTIONS),
    HeadAttention: QuantizeRule("points", QuantHeadAttention),
    GatedPositionalSelfAttention: QuantizeRule("points", QuantGatedPositionalSelfAttention,
                                               ("qk.kernel", "v.kernel", "proj.kernel")),
    ReAttention: QuantizeRule("points", QuantReAttention, (*ATTENTION_PROJECTIONS, "reatten_matrix.kernel")),
    PositionEmbedding: QuantizeRule("points", QuantPositionEmbedding),
    BicubicResize: QuantizeRule("points", QuantBicubicResize),
    Affine: QuantizeRule("points", QuantAffine),
    LayerScale: QuantizeRule("points", QuantLayerScale),
    SpaceToChannels: KEEPS_INPUT_SCALE,
    WindowAttention: QuantizeRule("points", QuantWindowAttention, ATTENTION_PROJECTIONS),
    CosineWindowAttention: QuantizeRule("points", QuantCosineWindowAttention, ATTENTION_PROJECTIONS),
    **dict.fromkeys((WindowPartition, WindowMerge, ChannelSplit), KEEPS_INPUT_SCALE),
    # one-hot depthwise convolution: the int8 copy keeps its input's levels
    SoftSplit: ONE_OP,
    TokenPerformer: QuantizeRule("points", QuantTokenPerformer, ("kqv.kernel", "proj.kernel")),
    TokenAttention: QuantizeRule("points", QuantTokenAttention, ATTENTION_PROJECTIONS),
}


def register(layer_class: type, rule: QuantizeRule) -> None:
    """Add (or replace) the entry of ``layer_class``."""
    _REGISTRY[layer_class] = rule


def rule_for(layer) -> QuantizeRule:
    """The entry of ``layer``'s class (a layer, or a Keras op applied to a
    symbolic tensor); an error naming the class if it has none. A global
    average over a single position that keeps its dims keeps its input's
    scale: the converter drops that MEAN (a detector's pooled level at
    256 px and less). Without keepdims (a classifier's head) the file keeps
    a MEAN, which needs its own output range."""
    if _averages_one_position(layer):
        return KEEPS_INPUT_SCALE
    cls = type(layer)
    rule = _REGISTRY.get(cls)
    if rule is None:
        raise EdgevitError(f"Quantization-aware training has no rule for layer class "
                           f"{cls.__module__}.{cls.__qualname__} (layer {layer.name!r}); register one with "
                           "edgevit.quantize.registry.register().")
    return rule


def rule_of_quantized(layer) -> QuantizeRule | None:
    """The entry whose quantization-aware class ``layer`` is, if any."""
    return next((rule for rule in _REGISTRY.values() if rule.quantized_class is type(layer)), None)


def _averages_one_position(layer) -> bool:
    """Whether ``layer`` is a global average pooling keeping its dims whose
    every call reads a map of one position (the mean is its input)."""
    if type(layer) not in (keras.layers.GlobalAveragePooling1D, keras.layers.GlobalAveragePooling2D) or \
            not layer.keepdims:
        return False
    shapes = [node.input_tensors[0].shape for node in layer._inbound_nodes]
    spatial = (lambda shape: shape[1:-1]) if layer.data_format == "channels_last" else (lambda shape: shape[2:])
    return bool(shapes) and all(all(d == 1 for d in spatial(shape)) for shape in shapes)
