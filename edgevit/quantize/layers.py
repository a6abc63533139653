"""Quantization-aware layers: fake quantization where TFLite quantizes.

Every tensor that becomes an int8 tensor of the TFLite graph passes through
``keras.quantizers.fake_quant_with_min_max_vars`` (TF backend:
``tf.quantization.fake_quant_with_min_max_vars*``), whose ranges the
converter takes as the tensor's scale and zero point. So the Keras model
computes in training what the int8 file computes on the phone.

- Activations: :class:`ActivationQuantizer`, one per-tensor range tracked by
  a moving average of batch min/max (a running mean over the first batches,
  non-finite values ignored), or a fixed range where TFLite fixes it
  (LOGISTIC and SOFTMAX outputs: scale 1/256, zero point -128).
- Conv and depthwise-conv kernels: per-output-channel symmetric ranges
  (narrow range, [-127, 127]) through the per-channel fake-quant op.
- Dense kernels: the same per-output-channel symmetric grid, but rounded with
  plain ops (straight-through gradient). A per-channel fake-quant op on a
  Dense kernel does not convert (the FULLY_CONNECTED weight is the transposed
  kernel: "'tfl.transpose' op has mismatched quantized axes"); the converter
  quantizes a kernel that already lies on that grid to exactly that grid.
- BatchNorm is folded into the preceding convolution when the QAT model is
  built (see ``edgevit.quantize.qat``), so the trained kernel is the
  deployed kernel.
"""
from __future__ import annotations

import keras
from keras import ops

from edgevit.layers.attention import MultiHeadSelfAttention, SeparableSelfAttention
from edgevit.layers.norm import LayerNorm

PACKAGE = "edgevit.qat"
# TFLite fixes the int8 output of LOGISTIC and SOFTMAX to scale 1/256,
# zero point -128: the range [0, 255/256].
UNIT_RANGE = (0.0, 255.0 / 256.0)
DEFAULT_MOMENTUM = 0.99
# A range narrower than this is widened (a constant-zero tensor still gets
# a valid scale).
MIN_RANGE_WIDTH = 1e-6


def _fake_quant(x, lo, hi, **kwargs):
    return keras.quantizers.fake_quant_with_min_max_vars(x, lo, hi, num_bits=8, **kwargs)


def fake_quant_kernel(kernel, channel_axis: int):
    """Per-output-channel symmetric int8 (narrow range) fake quantization."""
    axes = [a for a in range(len(kernel.shape)) if a != channel_axis % len(kernel.shape)]
    bound = ops.stop_gradient(ops.maximum(ops.max(ops.abs(kernel), axis=axes), 1e-8))
    return _fake_quant(kernel, -bound, bound, narrow_range=True, axis=channel_axis)


def round_kernel_to_grid(kernel):
    """The per-output-channel (last axis) symmetric int8 grid, with a
    straight-through gradient; for Dense kernels (see the module docstring)."""
    axes = list(range(len(kernel.shape) - 1))
    scale = ops.stop_gradient(ops.maximum(ops.max(ops.abs(kernel), axis=axes, keepdims=True), 1e-8) / 127.0)
    rounded = ops.clip(ops.round(kernel / scale), -127.0, 127.0) * scale
    return kernel + ops.stop_gradient(rounded - kernel)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ActivationQuantizer(keras.layers.Layer):
    """Per-tensor int8 fake quantization of an activation.

    The range follows the batch min/max: a running mean over the first
    ``1 / (1 - momentum)`` batches, then an exponential moving average. It is
    updated while training and while ``observing`` (calibration, where the
    input passes through unquantized); at inference the stored range is used.
    ``fixed_range`` pins the range (TFLite's fixed output ranges).
    """

    observing = False  # set on instances by edgevit.quantize.qat.calibrate

    def __init__(self, momentum: float = DEFAULT_MOMENTUM, fixed_range=None, **kwargs):
        super().__init__(**kwargs)
        self.momentum = float(momentum)
        self.fixed_range = None if fixed_range is None else (float(fixed_range[0]), float(fixed_range[1]))
        if self.fixed_range is None:
            self.range_min = self.add_weight(name="range_min", shape=(), initializer="zeros",
                                             trainable=False, aggregation="mean")
            self.range_max = self.add_weight(name="range_max", shape=(), initializer="zeros",
                                             trainable=False, aggregation="mean")
            self.batches_seen = self.add_weight(name="batches_seen", shape=(), initializer="zeros",
                                                trainable=False, aggregation="only_first_replica")
        self.built = True

    def build(self, input_shape):
        self.built = True

    def call(self, x, training=None):
        if self.fixed_range is not None:
            return _fake_quant(x, *self.fixed_range)
        if training or self.observing:
            self._track(x)
        if self.observing:
            return x
        lo, hi = self.quantization_range()
        return _fake_quant(x, lo, hi)

    def quantization_range(self):
        lo = ops.minimum(self.range_min, 0.0)
        hi = ops.maximum(ops.maximum(self.range_max, 0.0), lo + MIN_RANGE_WIDTH)
        return lo, hi

    def _track(self, x):
        x = ops.stop_gradient(ops.cast(x, "float32"))
        finite = ops.isfinite(x)
        values = ops.where(finite, x, ops.zeros_like(x))
        batch_min, batch_max = ops.min(values), ops.max(values)
        seen = self.batches_seen
        rate = ops.minimum(self.momentum, seen / (seen + 1.0))
        usable = ops.any(finite)
        new_min = ops.where(usable, rate * self.range_min + (1.0 - rate) * batch_min, self.range_min)
        new_max = ops.where(usable, rate * self.range_max + (1.0 - rate) * batch_max, self.range_max)
        self.range_min.assign(new_min)
        self.range_max.assign(new_max)
        self.batches_seen.assign(seen + ops.cast(usable, "float32"))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum,
                "fixed_range": None if self.fixed_range is None else list(self.fixed_range)}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantConv2D(keras.layers.Conv2D):
    """Conv2D with a per-output-channel fake-quantized kernel (BatchNorm
    already folded into kernel and bias)."""

    def convolution_op(self, inputs, kernel):
        return super().convolution_op(inputs, fake_quant_kernel(kernel, -1))


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantDepthwiseConv2D(keras.layers.DepthwiseConv2D):
    """DepthwiseConv2D with a per-channel fake-quantized kernel. TFLite keeps
    a depthwise kernel as [1, kh, kw, C * multiplier], quantized along the
    last axis; here that is axis 2 (input channels) for multiplier 1."""

    def call(self, inputs):
        kernel = self.kernel
        if self.depth_multiplier == 1:
            kernel = fake_quant_kernel(kernel, 2)
        else:
            shape = kernel.shape
            flat = ops.reshape(kernel, (shape[0], shape[1], 1, shape[2] * shape[3]))
            kernel = ops.reshape(fake_quant_kernel(flat, -1), shape)
        outputs = ops.depthwise_conv(inputs, kernel, strides=self.strides, padding=self.padding,
                                     dilation_rate=self.dilation_rate, data_format=self.data_format)
        if self.use_bias:
            outputs = ops.add(outputs, ops.reshape(self.bias, (1,) * (len(outputs.shape) - 1) + (-1,)))
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantDense(keras.layers.Dense):
    """Dense with its kernel on the per-output-channel int8 grid."""

    def call(self, inputs, training=None):
        outputs = ops.matmul(inputs, round_kernel_to_grid(self.kernel))
        if self.use_bias:
            outputs = ops.add(outputs, self.bias)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantActivation(keras.layers.Layer):
    """An activation as TFLite computes it in int8.

    SiLU is LOGISTIC (fixed output range) then MUL; sigmoid and softmax have
    fixed output ranges; any other activation is one op with a tracked
    output range."""

    def __init__(self, activation: str, momentum: float = DEFAULT_MOMENTUM, **kwargs):
        super().__init__(**kwargs)
        self.activation = str(activation)
        self.momentum = momentum
        fixed = UNIT_RANGE if self.activation in ("sigmoid", "softmax") else None
        if self.activation in ("silu", "swish"):
            self.sigmoid_quantizer = ActivationQuantizer(fixed_range=UNIT_RANGE, name="sigmoid")
        self.output_quantizer = ActivationQuantizer(momentum, fixed_range=fixed, name="output")

    def call(self, x, training=None):
        if self.activation in ("silu", "swish"):
            y = ops.multiply(x, self.sigmoid_quantizer(ops.sigmoid(x)))
        else:
            y = keras.activations.get(self.activation)(x)
        return self.output_quantizer(y, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "activation": self.activation, "momentum": self.momentum}


class _QuantizePoints:
    """Mixin for the edgevit layers with ``quantize_point`` hooks: one
    ActivationQuantizer per hook (fixed ranges for ``FIXED`` tags)."""

    TAGS: tuple[str, ...] = ()
    FIXED: dict[str, tuple[float, float]] = {}

    def __init__(self, *args, momentum: float = DEFAULT_MOMENTUM, **kwargs):
        super().__init__(*args, **kwargs)
        self.momentum = momentum
        for tag in self.TAGS:
            setattr(self, f"q_{tag}", ActivationQuantizer(momentum, fixed_range=self.FIXED.get(tag),
                                                          name=f"q_{tag}"))

    def quantize_point(self, tag: str, x):
        return getattr(self, f"q_{tag}")(x)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantLayerNorm(_QuantizePoints, LayerNorm):
    """LayerNorm with every one of its nine int8 ops fake-quantized.

    In int8 the variance (+ epsilon) can round to zero, and TFLite's RSQRT
    then outputs the top of its range. Here RSQRT gives +inf there, which
    range tracking ignores and the fake-quant clamps to the top of the
    range: the same value, and the range stays that of real tokens.

    Training takes the gradient of the float LayerNorm (a straight-through
    estimator over the whole layer): the rounded path's own gradient runs
    through RSQRT at rounded, near-zero variances and explodes (seen as NaN
    in the first QAT epoch of MobileViT-v3-XXS at 160 px)."""

    TAGS = ("mean", "centred", "square", "variance", "variance_eps", "rsqrt", "normalised", "scaled",
            "output")

    def call(self, x, training=None):
        quantized = self.normalise(x, self.quantize_point)
        if not training:
            return quantized
        exact = self.normalise(x, lambda tag, t: t)
        return exact + ops.stop_gradient(quantized - exact)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantMultiHeadSelfAttention(_QuantizePoints, MultiHeadSelfAttention):
    dense_class = QuantDense
    TAGS = ("qkv", "query_scaled", "scores", "softmax", "context", "output")
    FIXED = {"softmax": UNIT_RANGE}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantSeparableSelfAttention(_QuantizePoints, SeparableSelfAttention):
    dense_class = QuantDense
    TAGS = ("qkv", "softmax", "weighted_keys", "context_mean", "context", "values", "gated", "output")
    FIXED = {"softmax": UNIT_RANGE}


QUANTIZED_CUSTOM = {LayerNorm: QuantLayerNorm, MultiHeadSelfAttention: QuantMultiHeadSelfAttention,
                    SeparableSelfAttention: QuantSeparableSelfAttention}
