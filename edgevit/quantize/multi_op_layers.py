"""The quantization-aware twins of edgevit's layers that LiteRT runs as
several int8 ops: activations (SiLU is LOGISTIC then MUL), LayerNorm (nine
ops, RSQRT among them), the attention layers (FULLY_CONNECTED projections,
BATCH_MATMULs, SOFTMAX with its fixed output range), the token and
position-embedding layers, ResMLP's Affine and LayerScale, and Average.

Each lists its int8 tensors by ``quantize_point`` tag in the class
attributes of :class:`~edgevit.quantize.quantized_points.QuantizedPoints`;
what a layer does beyond that is where its int8 ops differ from its float
ones (a folded BatchNorm, a constant the converter folds, a mask that
saturates).
"""
from __future__ import annotations

import functools

import keras
import numpy as np
from keras import ops

from edgevit.errors import EdgevitError
from edgevit.layers.attention import MultiHeadSelfAttention, SeparableSelfAttention, masked_scores_range
from edgevit.layers.mha import HeadAttention
from edgevit.layers.norm import LayerNorm
from edgevit.layers.tokens import BicubicResize, PositionEmbedding
from edgevit.models.convit import GatedPositionalSelfAttention
from edgevit.models.deepvit import ReAttention
from edgevit.models.resmlp import Affine, LayerScale
from edgevit.models.swin import CosineWindowAttention, WindowAttention
from edgevit.models.t2t_vit import TokenAttention, TokenPerformer
from edgevit.quantize.conv_dense_layers import QuantDense, fold_batchnorm
from edgevit.quantize.export_trace import float_while_exporting, traced_constant
from edgevit.quantize.int8_ranges import FIXED_OUTPUT_RANGES, UNIT_RANGE, quantization_params, weight_scales
from edgevit.quantize.quantized_points import QuantizedPoints, copy_weights, unquantized, with_gradient_of
from edgevit.quantize.quantizers import PACKAGE, fake_quant, kernel_bound, round_kernel_to_grid


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantActivation(QuantizedPoints, keras.layers.Layer):
    """An activation as TFLite computes it in int8.

    SiLU is LOGISTIC (fixed output range) then MUL; sigmoid, softmax and
    tanh have LiteRT's fixed output ranges; any other activation is one op
    with a tracked output range."""

    def __init__(self, activation: str, **kwargs):
        self.activation = str(activation)
        super().__init__(**kwargs)

    @classmethod
    def from_float(cls, layer, momentum: float, sites: int, name: str):
        return cls(activation_name(layer.get_config()["activation"]), momentum=momentum, sites=sites, name=name)

    def point_tags(self):
        return ("sigmoid",) if self.activation in ("silu", "swish") else ()

    def output_product(self):
        return (0, "sigmoid") if self.activation in ("silu", "swish") else None

    def fixed_range(self, tag):
        return UNIT_RANGE

    def output_range(self):
        return FIXED_OUTPUT_RANGES.get(self.activation)

    def float_call(self, x, training):
        if self.activation in ("silu", "swish"):
            return ops.multiply(x, self.quantize_point("sigmoid", ops.sigmoid(x)))
        return keras.activations.get(self.activation)(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "activation": self.activation}


def activation_name(activation) -> str:
    """The name of a Keras activation as a layer config holds it."""
    if isinstance(activation, str):
        return activation
    if isinstance(activation, dict):
        return activation.get("config", activation.get("class_name", "linear"))
    return getattr(activation, "__name__", str(activation))


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantLayerNorm(QuantizedPoints, LayerNorm):
    """LayerNorm with every one of its nine int8 ops fake-quantized.

    In int8 the variance (+ epsilon) can round to zero, and TFLite's RSQRT
    then outputs the top of its range. Here RSQRT gives +inf there, which
    range tracking ignores and the fake-quant clamps to the top of the
    range: the same value, and the range stays that of real tokens.

    Training takes the gradient of the float LayerNorm (a straight-through
    estimator over the whole layer): the rounded path's own gradient runs
    through RSQRT at rounded, near-zero variances and explodes (seen as NaN
    in the first QAT epoch of MobileViT-v3-XXS at 160 px)."""

    TAGS = ("mean", "centred", "square", "variance", "variance_eps", "rsqrt", "normalised", "scaled")
    CONSTANTS = ("gamma", "beta")
    PRODUCTS = {"square": ("centred", "centred"), "normalised": ("centred", "rsqrt"), "scaled": ("normalised", "gamma")}
    SUMS = {"centred": (0, "mean", -1.0)}
    OUTPUT_SUM = ("scaled", "beta", 1.0)
    IDENTITY_TAIL = (("normalised", "gamma", 1.0), ("scaled", "beta", 0.0))

    def output_sum_shape(self):
        return tuple(self.beta.shape)

    @classmethod
    def from_config(cls, config):
        # saved before the per-channel means (see LayerNorm.position_axes): its one MEAN, as before
        return super().from_config({"per_channel_means": False, **config})

    def point_tags(self) -> tuple[str, ...]:
        return self.TAGS + (("channel_mean", "channel_variance") if self.position_axes else ())

    @property
    def MEANS(self):  # noqa: N802  (the class attribute of the other quantized layers)
        if not self.position_axes:
            return {"mean": (0, self.axes), "variance": ("square", self.axes)}
        last = self.axes[-1:]
        return {"channel_mean": (0, self.position_axes), "mean": ("channel_mean", last),
                "channel_variance": ("square", self.position_axes), "variance": ("channel_variance", last)}
    FLOAT_WHEN_MIXED = {"variance_eps": "RSQRT"}  # a range on the RSQRT output quantizes it after the float op

    def float_call(self, x, training):
        quantized = self.normalise(x, self.quantize_point)
        if not training:
            return quantized
        return with_gradient_of(self.normalise(x, unquantized), quantized)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantMultiHeadSelfAttention(QuantizedPoints, MultiHeadSelfAttention):
    dense_class = QuantDense
    TAGS = ("qkv", "query_scaled", "scores", "softmax", "context")
    FIXED = {"softmax": UNIT_RANGE}
    SOFTMAXES = {"softmax": "scores"}
    MATMULS = {"scores": ("query_scaled", "qkv"), "context": ("softmax", "qkv")}
    DENSE_INPUTS = {"qkv": 0, "proj": "context"}
    DENSE_OUTPUTS = {"qkv": "qkv"}
    OUTPUT_DENSE = "proj"
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL", "softmax": "SOFTMAX"}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantSeparableSelfAttention(QuantizedPoints, SeparableSelfAttention):
    dense_class = QuantDense
    TAGS = ("qkv", "softmax", "weighted_keys", "context_mean", "context", "values", "gated")
    FIXED = {"softmax": UNIT_RANGE}
    SOFTMAXES = {"softmax": "qkv"}
    DENSE_INPUTS = {"qkv": 0, "proj": "gated"}
    DENSE_OUTPUTS = {"qkv": "qkv", "values": "qkv"}
    PRODUCTS = {"weighted_keys": ("qkv", "softmax"), "gated": ("values", "context")}
    MEANS = {"context_mean": ("weighted_keys", (1,))}
    OUTPUT_DENSE = "proj"

    def project(self, x, start, stop):
        return self.qkv.channels(x, start, stop, training=self.training_call)

    def dense_output(self, tag):
        # query | keys, then the values: two FULLY_CONNECTED ops from one kernel
        channels = (0, 1 + self.dim) if tag == "qkv" else (1 + self.dim, 1 + 2 * self.dim)
        return self.accumulator_of("qkv", *channels)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantHeadAttention(QuantizedPoints, HeadAttention):
    TAGS = ("query_scaled", "scores", "softmax")
    FIXED = {"softmax": UNIT_RANGE}
    SOFTMAXES = {"softmax": "scores"}
    MATMULS = {"scores": ("query_scaled", 1)}
    OUTPUT_MATMUL = ("softmax", 2)
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL", "softmax": "SOFTMAX"}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantGatedPositionalSelfAttention(QuantizedPoints, GatedPositionalSelfAttention):
    dense_class = QuantDense
    TAGS = ("qk", "query_scaled", "scores", "softmax", "v", "content_context", "position_context",
            "content_gated", "position_gated", "mixed")
    FIXED = {"softmax": UNIT_RANGE}
    SOFTMAXES = {"softmax": "scores"}
    MATMULS = {"scores": ("query_scaled", "qk"), "content_context": ("softmax", "v")}
    DENSE_INPUTS = {"qk": 0, "v": 0, "proj": "mixed"}
    DENSE_OUTPUTS = {"qk": "qk", "v": "v"}
    OUTPUT_DENSE = "proj"
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL", "softmax": "SOFTMAX"}
    CONSTANTS = ("content_gate", "position_gate")
    PRODUCTS = {"content_gated": ("content_context", "content_gate"),
                "position_gated": ("position_context", "position_gate")}
    SUMS = {"mixed": ("content_gated", "position_gated", 1.0)}
    # each head's positional scores are FULLY_CONNECTED weights with the query positions as output channels
    KERNELS = {"position": (-1,)}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantReAttention(QuantizedPoints, ReAttention):
    """ReAttention with the head-mixing BatchNorm folded into the head-mixing
    matrix (one FULLY_CONNECTED in the int8 file)."""

    dense_class = QuantDense
    TAGS = ("qkv", "query_scaled", "scores", "softmax", "mixed", "mixed_scaled", "context")
    FIXED = {"softmax": UNIT_RANGE}
    SOFTMAXES = {"softmax": "scores"}
    DENSE_INPUTS = {"qkv": 0, "proj": "context", "reatten_matrix": "softmax"}
    DENSE_OUTPUTS = {"qkv": "qkv"}
    OUTPUT_DENSE = "proj"
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL"}  # the softmax feeds the head-mixing FULLY_CONNECTED

    @property
    def MATMULS(self):  # noqa: N802  (the class attribute of the other quantized layers)
        return {"scores": ("query_scaled", "qkv"),
                "context": ("mixed_scaled" if self.apply_transform else "softmax", "qkv")}

    @classmethod
    def from_float(cls, layer, momentum: float, sites: int, name: str):
        new = cls.from_config({**layer.get_config(), "momentum": momentum, "sites": sites, "name": name})
        new.build_like(layer)
        source = [layer.qkv.kernel, layer.qkv.bias, layer.proj.kernel, layer.proj.bias]
        target = [new.qkv.kernel, new.qkv.bias, new.proj.kernel, new.proj.bias]
        if layer.apply_transform:
            kernel, bias = fold_batchnorm(np.asarray(layer.reatten_matrix.kernel),
                                          np.asarray(layer.reatten_matrix.bias), layer.var_norm)
            source += [kernel, bias]
            target += [new.reatten_matrix.kernel, new.reatten_matrix.bias]
        copy_weights(source, target, layer.name)
        return new

    def head_norm(self):
        return None

    def point_tags(self):
        return self.TAGS if self.apply_transform else tuple(t for t in self.TAGS if not t.startswith("mixed"))


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantWindowAttention(QuantizedPoints, WindowAttention):
    """Swin's window attention. The shift mask's MUL by 1/0 keeps the
    biased scores' grid (exact), and its ADD of 0/-100 writes them on the
    grid :func:`masked_scores_range` derives from that one: masked pairs
    saturate at its bottom, as in a post-training int8 file."""

    dense_class = QuantDense
    TAGS = ("qkv", "query_scaled", "scores", "biased", "softmax", "context")
    FIXED = {"softmax": UNIT_RANGE}
    SOFTMAXES = {"softmax": "biased"}
    CONSTANTS = ("bias", "keep", "drop")
    MATMULS = {"scores": ("query_scaled", "qkv"), "context": ("softmax", "qkv")}
    DENSE_INPUTS = {"qkv": 0, "proj": "context"}
    DENSE_OUTPUTS = {"qkv": "qkv"}
    OUTPUT_DENSE = "proj"
    # the position bias and the mask stay in float with the scores and the softmax
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL", "biased": "SOFTMAX", "kept": "SOFTMAX", "masked": "SOFTMAX",
                        "softmax": "SOFTMAX"}
    ON_BIASED_GRID = ("kept", "masked")

    def position_bias(self):
        # computed from weights only: while exporting, the constant itself, so
        # that the converter meets its fake-quant op on a constant
        return traced_constant(self, "position_bias", super().position_bias)

    def quantize_point(self, tag: str, x):
        if tag not in self.ON_BIASED_GRID or self.constant or float_while_exporting("SOFTMAX"):
            return super().quantize_point(tag, x)
        biased = self.quantizer("biased")
        if biased.observing:
            return x
        lo, hi = biased.quantization_range()
        if tag == "masked":
            lo, hi = masked_scores_range(lo, hi, self.tokens)
        return fake_quant(x, lo, hi)

    def softmax_logit_params(self, tag):
        if "masked" not in self.operands:
            return super().softmax_logit_params(tag)
        return quantization_params(*masked_scores_range(*self.quantizer("biased").quantization_range(), self.tokens))


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantCosineWindowAttention(QuantWindowAttention, CosineWindowAttention):
    """SwinV2's window attention: the query and key normalisations are the
    integer LayerNorm's ops, and the q/v biases are the int32 bias of the
    one FULLY_CONNECTED that projects q, k and v."""

    TAGS = ("qkv", "q_square", "q_mean", "q_mean_eps", "q_rsqrt", "query", "query_scaled",
            "k_square", "k_mean", "k_mean_eps", "k_rsqrt", "keys", "scores", "biased", "softmax", "context")
    CONSTANTS = ("query_scale", "bias", "keep", "drop")
    MATMULS = {"scores": ("query_scaled", "keys"), "context": ("softmax", "qkv")}
    MEANS = {"q_mean": ("q_square", (-1,)), "k_mean": ("k_square", (-1,))}
    PRODUCTS = {"query_scaled": ("query", "query_scale"), "q_square": ("qkv", "qkv"), "query": ("qkv", "q_rsqrt"),
                "k_square": ("qkv", "qkv"), "keys": ("qkv", "k_rsqrt")}
    FLOAT_WHEN_MIXED = {**QuantWindowAttention.FLOAT_WHEN_MIXED, "q_mean_eps": "RSQRT", "k_mean_eps": "RSQRT"}

    def query_scale(self):
        return traced_constant(self, "query_scale", super().query_scale)

    def project(self, x):
        kernel = round_kernel_to_grid(self.qkv.kernel)
        return self.qkv.accumulate(ops.matmul, x, kernel, kernel_bound(kernel, -1), None,
                                   self.projection_bias() if self.qkv_bias else None, training=self.training_call)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantTokenPerformer(QuantizedPoints, TokenPerformer):
    """T2T-ViT's Performer with every int8 op fake-quantized: the random
    feature directions are the FULLY_CONNECTED weights of both projections
    (per output channel, one channel per direction)."""

    dense_class = QuantDense
    TAGS = ("kqv", *(f"{role}_{tag}" for role in ("key", "query")
                     for tag in ("square", "square_mean", "half_norm", "projected", "exponent", "features")),
            "key_mean", "key_sum", "weighted", "normaliser_mean", "normaliser", "context", "mixed",
            "normaliser_eps", "inverse_root", "mixed_scaled", "attended", "proj")
    KERNELS = {"directions": (0,)}
    MATMULS = {"context": ("key_features", "kqv"), "mixed": ("query_features", "context")}
    PRODUCTS = {"key_square": ("kqv", "kqv"), "query_square": ("kqv", "kqv"),
                "weighted": ("query_features", "key_sum"), "mixed_scaled": ("mixed", "inverse_root"),
                "attended": ("mixed_scaled", "inverse_root")}
    DENSE_INPUTS = {"kqv": 0, "proj": "attended"}
    DENSE_OUTPUTS = {"kqv": "kqv", "proj": "proj", "key_projected": "w", "query_projected": "w"}
    FLOAT_WHEN_MIXED = {"context": "BATCH_MATMUL", "normaliser_eps": "RSQRT"}

    def float_call(self, x, training):
        """Training takes the gradient of the float Performer (see
        :func:`with_gradient_of`): the rounded chain's runs through RSQRT at
        normalisers rounded to near zero and through EXP, and was infinite
        at the first step of T2T-ViT-7's QAT at 64 px."""
        values, update = self.attend(x, self.quantize_point, self.matmul)
        if training:
            exact_values, exact_update = self.attend(x, unquantized, functools.partial(TokenPerformer.matmul, self))
            values, update = with_gradient_of(exact_values, values), with_gradient_of(exact_update, update)
        return values + self.dropout(update, training=training)

    def dense_output(self, tag):
        if self.DENSE_OUTPUTS[tag] != "w":
            return super().dense_output(tag)
        # keys or queries (a split of kqv, its scale) times the directions
        return {"input_params": self.params_of("kqv"), "kernel_scales": weight_scales(kernel_bound(self.w, 0))}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantTokenAttention(QuantizedPoints, TokenAttention):
    dense_class = QuantDense
    TAGS = ("qkv", "query_scaled", "scores", "softmax", "context", "proj")
    FIXED = {"softmax": UNIT_RANGE}
    SOFTMAXES = {"softmax": "scores"}
    MATMULS = {"scores": ("query_scaled", "qkv"), "context": ("softmax", "qkv")}
    DENSE_INPUTS = {"qkv": 0, "proj": "context"}
    DENSE_OUTPUTS = {"qkv": "qkv", "proj": "proj"}
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL", "softmax": "SOFTMAX"}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantPositionEmbedding(QuantizedPoints, PositionEmbedding):
    """Added to [prefix tokens, patches], the prefix part is a constant sum
    of constants, folded by the converter."""

    CONSTANTS = ("prefix_embedding", "embedding")

    @classmethod
    def constant_outputs(cls, constant_inputs, outputs):
        return list(constant_inputs) if outputs == 2 else super().constant_outputs(constant_inputs, outputs)

    def quantize_point(self, tag, x):
        if tag == "prefix_embedding" and self.input_params and self.input_params[0] is None:
            return x
        return super().quantize_point(tag, x)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantBicubicResize(QuantizedPoints, BicubicResize):
    """The two resampling matrices become FULLY_CONNECTED weights."""

    TAGS = ("rows",)
    KERNELS = {"matrix_h": (0,), "matrix_w": (0,)}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantAffine(QuantizedPoints, Affine):
    TAGS = ("scaled",)
    CONSTANTS = ("alpha", "beta")
    PRODUCTS = {"scaled": (0, "alpha")}
    OUTPUT_SUM = ("scaled", "beta", 1.0)
    IDENTITY_TAIL = (("scaled", "beta", 0.0),)

    def output_sum_shape(self):
        return tuple(self.beta.shape)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantLayerScale(QuantizedPoints, LayerScale):
    CONSTANTS = ("gamma",)
    OUTPUT_PRODUCT = (0, "gamma")


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantAverage(QuantizedPoints, keras.layers.Average):
    """The mean of two tensors: ADD, then MUL by 1/2."""

    TAGS = ("sum",)

    def _merge_function(self, inputs):
        if len(inputs) != 2:
            raise EdgevitError(f"Layer {self.name!r} averages {len(inputs)} tensors; QAT takes an Average of two.")
        return ops.multiply(self.quantize_point("sum", ops.add(*inputs)), 0.5)

    def compute_output_spec(self, inputs, **call_options):
        return super().compute_output_spec(inputs)
