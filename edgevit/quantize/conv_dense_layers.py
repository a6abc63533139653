"""Conv2D, DepthwiseConv2D and Dense as LiteRT's int8 CONV_2D,
DEPTHWISE_CONV_2D and FULLY_CONNECTED compute them.

Each accumulates input levels times per-output-channel int8 weight levels
in int32, adds the int32 bias the converter rounds, and hands the
accumulator to the quantizer of its output, which requantizes it as XNNPACK
does (see :mod:`edgevit.quantize.kernel_arithmetic`). BatchNorm is folded
into the preceding convolution when the QAT model is built
(:func:`fold_batchnorm`, used by ``edgevit.quantize.qat``), so the trained
kernel is the deployed kernel.
"""
from __future__ import annotations

import keras
import numpy as np
from keras import ops

from edgevit.quantize.export_trace import kernel_arithmetic_applies
from edgevit.quantize.int8_ranges import part, weight_scales
from edgevit.quantize.kernel_arithmetic import bias_levels, on_levels
from edgevit.quantize.quantizers import PACKAGE, fake_quant_kernel, kernel_bound, round_kernel_to_grid


class IntegerAccumulation:
    """Mixin for the layers with an int8 kernel: their output as the int8
    kernel accumulates it, the integer sum of input level x weight level
    times input scale x channel weight scale, with the bias rounded to such
    steps (int32, as the converter rounds it). The products and sums run on
    the levels, whole numbers that float32 adds exactly (below 2^24): a
    float32 sum of the scaled products misses the int32 accumulator by a few
    ulps, and by a step or more where the accumulator is large (trained
    weights, wide layers), enough to round the other way at the next
    fake-quant now and then; on the levels, the QAT model and the int8 file
    agree. The gradients are those of the float op.

    The input's [scale, zero point] come with the call (``input_params``)
    or, inside a quantization-aware layer, from ``input_params_source``,
    which that layer sets."""

    input_params_source = None

    def accumulate(self, op, inputs, kernel, bound, input_params, bias=None, with_kernel_scales: bool = False,
                   training=None):
        """``op(inputs, kernel)`` plus ``bias`` (the layer's own by
        default), as the int8 kernel computes it where that arithmetic
        applies (see :func:`kernel_arithmetic_applies`: not in a training
        step, calibration or the converter's trace). ``kernel``: on its
        per-channel int8 grid, output channels on its last axis, which
        span [-bound, bound]. ``with_kernel_scales``: also return the
        channels' scales, for the quantizer of the output (see
        :func:`accumulator_requantized`)."""
        exact = kernel_arithmetic_applies(training)
        if input_params is None and self.input_params_source is not None and exact:
            input_params = self.input_params_source()
        if bias is None and self.use_bias:
            bias = self.bias
        kernel_scales = weight_scales(bound)
        if input_params is None or not exact:
            outputs = op(inputs, kernel)
            outputs = outputs if bias is None else ops.add(outputs, bias)
        else:
            input_scale = part(input_params, 0)
            step = input_scale * kernel_scales
            outputs = op(on_levels(inputs, input_scale), on_levels(kernel, kernel_scales)) * step
            if bias is not None:
                outputs = outputs + bias_levels(bias, input_params, bound) * step
        return (outputs, kernel_scales) if with_kernel_scales else outputs


def with_channel_scales(spec, with_kernel_scales: bool):
    """The output spec of a layer with an int8 kernel, and of its channel scales if asked."""
    return (spec, keras.KerasTensor((spec.shape[-1],), "float32")) if with_kernel_scales else spec


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantConv2D(IntegerAccumulation, keras.layers.Conv2D):
    """Conv2D with a per-output-channel fake-quantized kernel (BatchNorm
    already folded into kernel and bias)."""

    def call(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        return self.accumulate(self.convolution_op, inputs, fake_quant_kernel(self.kernel, -1),
                               kernel_bound(self.kernel, -1), input_params, with_kernel_scales=with_kernel_scales,
                               training=training)

    def compute_output_spec(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        return with_channel_scales(super().compute_output_spec(inputs), with_kernel_scales)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantDepthwiseConv2D(IntegerAccumulation, keras.layers.DepthwiseConv2D):
    """DepthwiseConv2D with a per-channel fake-quantized kernel. TFLite keeps
    a depthwise kernel as [1, kh, kw, C * multiplier], quantized along the
    last axis: here the kernel's last two axes, flattened."""

    def call(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        shape = self.kernel.shape
        flat = ops.reshape(self.kernel, (shape[0], shape[1], 1, shape[2] * shape[3]))

        def depthwise(x, flat_kernel):
            return ops.depthwise_conv(x, ops.reshape(flat_kernel, shape), strides=self.strides, padding=self.padding,
                                      dilation_rate=self.dilation_rate, data_format=self.data_format)

        return self.accumulate(depthwise, inputs, fake_quant_kernel(flat, -1), kernel_bound(flat, -1), input_params,
                               with_kernel_scales=with_kernel_scales, training=training)

    def compute_output_spec(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        return with_channel_scales(super().compute_output_spec(inputs), with_kernel_scales)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantDense(IntegerAccumulation, keras.layers.Dense):
    """Dense with its kernel on the per-output-channel int8 grid."""

    def call(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        kernel = round_kernel_to_grid(self.kernel)
        return self.accumulate(ops.matmul, inputs, kernel, kernel_bound(kernel, -1), input_params,
                               with_kernel_scales=with_kernel_scales, training=training)

    def compute_output_spec(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        return with_channel_scales(super().compute_output_spec(inputs), with_kernel_scales)

    def channels(self, inputs, start: int, stop: int, training=None):
        """Output channels [start, stop) alone, as a FULLY_CONNECTED of
        their own computes them (per-channel grids are the same; the slice
        of the constant grid, see :func:`round_kernel_to_grid`)."""
        kernel = round_kernel_to_grid(self.kernel)[:, start:stop]
        return self.accumulate(ops.matmul, inputs, kernel, kernel_bound(kernel, -1), None,
                               self.bias[start:stop] if self.use_bias else None, training=training)


def fold_batchnorm(kernel: np.ndarray, bias: np.ndarray | None, bn) -> tuple[np.ndarray, np.ndarray]:
    """Kernel and bias of a layer followed by inference-mode BatchNorm
    ``bn``, with the BatchNorm folded in (output channels on the last axis)."""
    channels = bn.moving_mean.shape[0]
    gamma = np.asarray(bn.gamma, np.float64) if bn.scale else np.ones(channels)
    beta = np.asarray(bn.beta, np.float64) if bn.center else np.zeros(channels)
    factor = gamma / np.sqrt(np.asarray(bn.moving_variance, np.float64) + bn.epsilon)
    shift = beta - np.asarray(bn.moving_mean, np.float64) * factor
    folded_bias = shift + (np.asarray(bias, np.float64) * factor if bias is not None else 0.0)
    return (np.asarray(kernel, np.float64) * factor).astype(np.float32), folded_bias.astype(np.float32)
