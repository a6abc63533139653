"""int8 ranges, and the scale and zero point the TFLite converter gives them.

A fake-quant op's range [lo, hi] becomes an int8 tensor's scale and zero
point as the converter computes them: in float64, the zero point nudged so
that zero is exactly representable, then stored as float32. LiteRT fixes the
output ranges of some ops (LOGISTIC, SOFTMAX, TANH); a constant operand gets
the range of its own values; a kernel gets per-output-channel scales on the
narrow grid [-127, 127].
"""
from __future__ import annotations

import keras
import numpy as np
from keras import ops

from edgevit.quantize.export_trace import traced_weight_constant

# TFLite fixes the int8 output of LOGISTIC and SOFTMAX to scale 1/256,
# zero point -128: the range [0, 255/256].
UNIT_RANGE = (0.0, 255.0 / 256.0)
# TANH: scale 1/128, zero point 0.
FIXED_OUTPUT_RANGES = {"sigmoid": UNIT_RANGE, "softmax": UNIT_RANGE, "tanh": (-1.0, 127.0 / 128.0)}

# A range narrower than this is widened (a constant-zero tensor still gets
# a valid scale).
MIN_RANGE_WIDTH = 1e-6


# [scale, zero point, scale residual] of an int8 tensor (see quantization_params)
PARAMS_SIZE = 3


def scale_and_zero_point(lo, hi):
    """The int8 scale and zero point of the range [lo, hi], nudged as the
    fake-quant op and the converter do (zero exactly representable). The
    converter computes in float64 and stores float32; a float32 difference
    of the bounds differs from that in the last bit for about a quarter of
    the ranges, and XNNPACK's requantization multiplies by these bits."""
    scale, zero_point, _ = quantization_params(lo, hi)
    return scale, zero_point


def quantization_params(lo, hi):
    """The int8 scale and zero point of [lo, hi] (float32, as the file
    keeps them; see :func:`scale_and_zero_point`) and the scale's residual:
    the converter's float64 scale less the float32 one, which it quantizes
    int32 biases with before it stores the scales (see
    :func:`edgevit.quantize.kernel_arithmetic.bias_levels`)."""
    xp = array_module(lo, hi)
    if xp is np:  # the bounds as float32 first: the fake-quant op's
        lo, hi = np.float64(np.float32(lo)), np.float64(np.float32(hi))
    else:
        lo, hi = ops.cast(lo, "float64"), ops.cast(hi, "float64")
    scale = (hi - lo) / 255.0
    zero_point = xp.clip(xp.round(-128.0 - lo / scale), -128.0, 127.0)
    if xp is np:
        return np.float32(scale), np.float32(zero_point), np.float32(scale - np.float64(np.float32(scale)))
    stored = ops.cast(scale, "float32")
    return stored, ops.cast(zero_point, "float32"), ops.cast(scale - ops.cast(stored, "float64"), "float32")


def part(params, index: int):
    """Element ``index`` of [scale, zero point, scale residual] ``params``
    (one split of a traced tensor per graph, see
    :func:`edgevit.quantize.export_trace.traced_constant`)."""
    if not ops.is_tensor(params):
        return params[index]
    return traced_weight_constant(params, "parts", lambda: ops.unstack(params, PARAMS_SIZE))[index]


def weight_scales(bound):
    """The per-channel scales the converter gives a kernel whose channels
    span [-bound, bound] on the narrow int8 grid (float64, stored float32)."""
    return ops.cast(ops.cast(bound, "float64") * 2.0 / 254.0, "float32")


def value_range(minima, maxima, symmetric: bool = False):
    """The int8 range [lo, hi] of values whose minima and maxima are given:
    zero included, at least MIN_RANGE_WIDTH wide; ``symmetric``: around
    zero point 0 ([-128, 127] steps). In float32, as the fake-quant op
    reads it; numpy where the values are known now."""
    minima, maxima = value_now(minima), value_now(maxima)
    xp, f32 = array_module(minima, maxima), np.float32
    lo = xp.minimum(xp.min(minima), f32(0.0))
    hi = xp.maximum(xp.maximum(xp.max(maxima), f32(0.0)), lo + f32(MIN_RANGE_WIDTH))
    if symmetric:
        hi = xp.maximum(hi, -lo * f32(127.0 / 128.0))
        lo = -hi * f32(128.0 / 127.0)
    return lo, hi


def constant_range(value):
    return value_range(ops.stop_gradient(value), ops.stop_gradient(value))


def constant_params(value):
    """[scale, zero point] of a constant operand (see :func:`fake_quant_constant`)."""
    return ops.stack(quantization_params(*constant_range(value)))


def array_module(*values):
    """numpy where every value is known now (eager weights, constants),
    else keras ops: eagerly, each keras op costs more than numpy's whole
    computation of a range, and a QAT forward pass computes a thousand."""
    return np if not any(ops.is_tensor(v) or isinstance(v, keras.Variable) for v in values) else ops


def value_now(value):
    """A variable's or tensor's value as numpy where it can be read
    (eagerly), else the variable or tensor itself."""
    import tensorflow as tf

    known = tf.executing_eagerly() and (ops.is_tensor(value) or isinstance(value, keras.Variable))
    return np.asarray(value) if known else value
