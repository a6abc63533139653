"""LiteRT's int8 kernel arithmetic, computed with float ops.

A fake-quant op rounds the float result of an op to its output's grid; the
int8 kernel computes that result from integer levels and rounds it by its
own fixed-point rules, which differ near rounding midpoints. Each function
here returns what the kernel writes, so that the QAT model and the int8 file
agree value for value:

- XNNPACK's fp32 requantization of the int32 accumulator of a convolution,
  a FULLY_CONNECTED and (x86) a BATCH_MATMUL with a symmetric second operand
  (:func:`accumulator_requantized`), and of a MUL
  (:func:`product_requantized`);
- that BATCH_MATMUL's "rndnu" requantization on aarch64
  (:func:`rndnu_accumulator_requantized`), and the builtin BATCH_MATMUL's
  fixed-point rescale, two-step on x86, one-step on aarch64
  (:func:`batch_matmul_requantized`);
- XNNPACK's and the builtin kernel's ADD (:func:`sum_requantized`) and
  XNNPACK's MEAN (:func:`mean_requantized`);
- the int32 bias the converter writes (:func:`bias_levels`), and the model
  input as an app quantizes it (:func:`input_quantized`);
- the int8 SOFTMAX of LiteRT's x86 builds (:func:`x86_softmax_requantized`)
  and of its aarch64 builds (:func:`arm64_softmax_requantized`).

Two ops have kernels that round differently on x86 and on aarch64 (phones,
Apple Silicon), each about one output in 10^4 a step apart: LiteRT's int8
SOFTMAX runs on a float exp table and a float 1/sum in x86 builds, on a
16-bit integer exp table and a fixed-point 1/sum in every aarch64 build;
its int8 BATCH_MATMUL requantizes the accumulator by a float32 product
(XNNPACK) or in two fixed-point roundings (builtin) on x86, by the exact
product rounded once, half up, on aarch64 (XNNPACK's rndnu GEMM, ruy). The
QAT model follows one kernel set, :func:`target_kernels`: the machine's own
unless :func:`targeting_kernels` says which. (Compared op by op on
MobileViT files, every other op computed the same bits on both.)
"""
from __future__ import annotations

import contextlib
import contextvars
import platform

import numpy as np
from keras import ops

from edgevit.errors import EdgevitError
from edgevit.quantize.int8_ranges import part, weight_scales

# the kernel sets whose int8 SOFTMAX and BATCH_MATMUL the QAT model can follow
TARGET_KERNELS = ("x86", "arm64")
_TARGET = contextvars.ContextVar("edgevit_int8_kernels", default=None)


def machine_kernels() -> str:
    """The kernel set LiteRT runs on this machine: "arm64" on an aarch64
    CPU (its builds define TFLITE_SOFTMAX_USE_UINT16_LUT), else "x86"."""
    return "arm64" if platform.machine().lower() in ("aarch64", "arm64") else "x86"


def target_kernels() -> str:
    """The kernel set whose int8 SOFTMAX and BATCH_MATMUL the QAT model
    computes now (see the module docstring): read when a model is called or
    traced."""
    return _TARGET.get() or machine_kernels()


@contextlib.contextmanager
def targeting_kernels(kernels: str | None):
    """While inside, QAT models compute the int8 SOFTMAX and BATCH_MATMUL
    of ``kernels`` ("x86" or "arm64"; None: the machine's). A model traced
    inside (a ``tf.function``, ``model.predict``) keeps it in its graph."""
    if kernels is not None and kernels not in TARGET_KERNELS:
        raise EdgevitError(f"Unknown int8 kernels {kernels!r}: one of {', '.join(TARGET_KERNELS)}.")
    token = _TARGET.set(kernels)
    try:
        yield
    finally:
        _TARGET.reset(token)


def int8_value(levels, scale, zero_point):
    """The value an int8 tensor with ``scale`` and ``zero_point`` holds for
    ``levels`` steps from its zero point: saturated to [-128, 127], in the
    arguments' dtype."""
    return (ops.clip(levels + zero_point, -128.0, 127.0) - zero_point) * scale


def accumulator_requantized(x, input_params, kernel_scales, grid):
    """What XNNPACK writes for ``x``, the output of an int8 convolution or
    dense layer whose input has [scale, zero point] ``input_params`` and
    whose output channels have ``kernel_scales``, into a tensor with range
    [lo, hi]: the int32 accumulator (bias included) times the float32
    requantization scale ``input_scale * kernel_scale / output_scale``,
    rounded half to even (XNNPACK's fp32 requantization, measured to match
    every element of a trained MobileViT's convolutions). ``grid``: the
    output's (scale, zero point). A float32 fake
    quant of the float output lands a few ulps off that product and rounds
    the other way near midpoints, about one output in 10^4, and each such
    step spreads through the layers after it."""
    scale, zero_point = grid
    step = part(input_params, 0) * kernel_scales
    accumulator = ops.round(x / step)
    levels = ops.round(accumulator * (step / scale))
    return int8_value(levels, scale, zero_point)


def product_requantized(x, factor_params, grid, square: bool = False):
    """What XNNPACK writes for ``x``, the int8 MUL of two operands on the
    grids ``factor_params`` ([scale, zero point] each), into a tensor with
    range [lo, hi]: the integer product times the float32 multiplier
    ``scale_a * scale_b / output_scale``, the product in float32, rounded
    half to even, as a convolution's accumulator. A tensor times itself
    (``square``) runs another kernel, which rounds the exact product once
    (measured on every element of the MULs of MobileViT v1/v2/v3 files,
    near-ties included: each rule turns about one near-tie in a thousand the
    other way in the other case)."""
    scale, zero_point = grid
    step = part(factor_params[0], 0) * part(factor_params[1], 0)
    multiplier = step / scale
    product = ops.round(ops.cast(x, "float64") / ops.cast(step, "float64"))
    if square:
        levels = ops.cast(ops.round(product * ops.cast(multiplier, "float64")), x.dtype)
    else:
        levels = ops.round(ops.cast(product, x.dtype) * multiplier)
    return int8_value(levels, scale, zero_point)


def floor_log2(value):
    """``floor(log2(value))`` exactly for float64 ``value`` > 0 (log2 of a
    value an ulp below a power of two rounds up to that power's exponent):
    the exponent of a fixed-point multiplier."""
    exponent = ops.floor(ops.log2(value))
    return exponent + ops.cast(ops.power(2.0, exponent + 1.0) <= value, "float64") \
        - ops.cast(ops.power(2.0, exponent) > value, "float64")


def batch_matmul_requantized(x, lhs, rhs, grid):
    """What LiteRT writes for ``x``, the float product of int8 operands with
    quantization ``lhs`` and ``rhs`` ([scale, zero point] each), into a
    tensor with range [lo, hi].

    With XNNPACK (LiteRT's default CPU kernels), an int8 BATCH_MATMUL whose
    second operand has zero point 0 runs in XNNPACK, which requantizes the
    int32 accumulator as it does a dense layer's (see
    :func:`accumulator_requantized`; a fake-quant of the float product
    rounds near-ties its own way). Any other runs in LiteRT's builtin kernel, which
    rescales the int32 accumulator by M = lhs * rhs / out in two rounding
    steps: a fixed-point multiply that rounds to 2^-shift of an output step
    (M = m * 2^-shift, m in [0.5, 1)), then a shift that rounds half away
    from zero. A value up to 2^-(shift+1) steps below a rounding midpoint
    thus rounds up where a fake-quant rounds down (about 0.4% of an
    attention layer's scores). The arithmetic runs in float64: accumulator
    times 2^shift exceeds float32's integers. Those are the x86 kernels;
    the aarch64 ones round the exact product once, half up, in both cases
    (:func:`rndnu_accumulator_requantized`, :func:`_ruy_batch_matmul`),
    computed when the QAT model targets "arm64" kernels."""
    return ops.cond(ops.equal(part(rhs, 1), 0.0), lambda: _xnnpack_batch_matmul(x, lhs, part(rhs, 0), grid),
                    lambda: _builtin_batch_matmul(x, lhs, rhs, grid))


def _xnnpack_batch_matmul(x, lhs, rhs_scale, grid):
    """XNNPACK's int8 BATCH_MATMUL of the :func:`target_kernels`: its
    operands have one scale each (no per-channel weights), so XNNPACK runs
    its per-tensor GEMM, which requantizes with float32 arithmetic on x86
    (as a dense layer, :func:`accumulator_requantized`) and with the
    "rndnu" fixed-point rule on aarch64 (:func:`rndnu_accumulator_requantized`)."""
    if target_kernels() == "arm64":
        return rndnu_accumulator_requantized(x, lhs, rhs_scale, grid)
    return accumulator_requantized(x, lhs, rhs_scale, grid)


def rndnu_accumulator_requantized(x, input_params, kernel_scale, grid):
    """What XNNPACK's aarch64 per-tensor int8 GEMM ("rndnu" requantization:
    ``xnn_qs8_gemm_minmax_rndnu_*``) writes for ``x``, the float product of
    operands on the grids ``input_params`` and ``kernel_scale``, into a
    tensor with the output ``grid``. The float32 scale
    ``input_scale * kernel_scale / output_scale`` is a 24-bit integer
    multiplier and a shift; SQDMULH keeps the exact product's bits down to
    2^-shift of an output step (truncating) and SRSHL rounds the rest half
    up: the exact ``accumulator * scale`` rounded half up. x86's float32
    product rounds to float32 first and then half to even, so a product
    within float32's rounding of a midpoint (about one output in 10^4 of
    an attention matmul) lands a step apart. Computed in float64, exact
    for accumulators below 2^29."""
    scale, zero_point = grid
    step = part(input_params, 0) * kernel_scale
    accumulator = ops.round(ops.cast(x, "float64") / ops.cast(step, "float64"))
    levels = ops.floor(accumulator * ops.cast(step / scale, "float64") + 0.5)
    return ops.cast(int8_value(levels, ops.cast(scale, "float64"), ops.cast(zero_point, "float64")), x.dtype)


def _builtin_batch_matmul(x, lhs, rhs, grid):
    """LiteRT's builtin int8 BATCH_MATMUL of the :func:`target_kernels`
    (operands with quantization ``lhs`` and ``rhs``; see
    :func:`batch_matmul_requantized`)."""
    if target_kernels() == "arm64":
        return _ruy_batch_matmul(x, lhs, rhs, grid)
    product_scale = part(lhs, 0) * part(rhs, 0)
    scale, zero_point = grid
    multiplier = ops.cast(product_scale / scale, "float64")
    steps = ops.power(2.0, -floor_log2(multiplier) - 1.0)  # 2^shift
    accumulator = ops.round(ops.cast(x, "float64") / ops.cast(product_scale, "float64"))
    fine = ops.floor(accumulator * multiplier * steps + 0.5)
    rounded = ops.sign(fine) * ops.floor(ops.abs(fine) / steps + 0.5)
    return ops.cast(int8_value(rounded, ops.cast(scale, "float64"), ops.cast(zero_point, "float64")), x.dtype)


def _ruy_batch_matmul(x, lhs, rhs, grid):
    """The builtin int8 BATCH_MATMUL of LiteRT's aarch64 builds, whose
    matmuls run in ruy: the int32 accumulator times TFLite's fixed-point
    multiplier of ``lhs_scale * rhs_scale / output_scale`` (31 bits and a
    shift, from the float64 ratio), rounded once, half up (ruy's NEON
    kernels: SQDMULH truncates, SRSHL rounds). x86's builtin kernel rounds
    twice (see :func:`batch_matmul_requantized`). In int64: the accumulator
    times the multiplier exceeds float64's integers."""
    def f64(value):
        return ops.cast(value, "float64")

    scale, zero_point = grid
    product_scale = part(lhs, 0) * part(rhs, 0)
    multiplier = f64(part(lhs, 0)) * f64(part(rhs, 0)) / f64(scale)
    exponent = floor_log2(multiplier) + 1.0
    fixed = ops.floor(multiplier / ops.power(2.0, exponent) * 2.0 ** 31 + 0.5)   # in [2^30, 2^31]
    exponent = ops.where(fixed >= 2.0 ** 31, exponent + 1.0, exponent)
    fixed = ops.where(fixed >= 2.0 ** 31, fixed / 2.0, fixed)
    accumulator = ops.round(f64(x) / f64(product_scale))
    shift = ops.cast(31.0 - exponent, "int64")
    product = ops.cast(accumulator, "int64") * ops.cast(fixed, "int64")
    levels = f64(ops.right_shift(product + ops.left_shift(ops.ones_like(shift), shift - 1), shift))
    return ops.cast(int8_value(levels, f64(scale), f64(zero_point)), x.dtype)


def input_quantized(x, grid):
    """The model's float input as an app quantizes it for an int8 input
    tensor: ``x / scale`` in float32, rounded half to even, plus the zero
    point (edgevit's runners and the Android demo; a fake-quant rounds half
    up, and every pixel of a model normalised with mean 0.5 and std 0.5 lies
    within float32 error of a midpoint)."""
    scale, zero_point = grid
    levels = ops.round(x / scale)
    return int8_value(levels, scale, zero_point)


def mean_requantized(summands, summand_params, axes, grid):
    """What XNNPACK writes for the int8 MEAN of ``summands`` (on the grid
    ``summand_params``) over ``axes`` into a tensor with range [lo, hi]:
    the int32 sum of the int8 values (input zero point included) times the
    float32 multiplier ``input_scale / output_scale`` x ``1 / count``, plus
    the output zero point less count x input zero point x multiplier, in
    float32, rounded half to even (measured to match every element of the
    MEANs of MobileViT v1, v2 and v3 files, whichever axes they reduce;
    rescaling the sum of the levels instead rounds near-ties the other way).
    The float mean's fake-quant lands a few ulps off now and then; in a
    GroupNorm, whose variance is one MEAN over the whole map, such a step
    moves every element of the map."""
    scale, zero_point = grid
    count = np.float32(np.prod([summands.shape[a] for a in axes]))
    input_scale, input_zero_point = (ops.cast(part(summand_params, i), "float32") for i in (0, 1))
    multiplier = (input_scale / ops.cast(scale, "float32")) * (np.float32(1.0) / count)
    levels = ops.round(summands / input_scale) + input_zero_point  # whole numbers: their float32 sum is exact
    values = ops.sum(levels, axis=axes, keepdims=True)
    quantized = ops.round(values * multiplier + (zero_point - (count * input_zero_point) * multiplier))
    return (ops.clip(quantized, -128.0, 127.0) - zero_point) * scale


def sum_requantized(addends, addend_params, grid):
    """What LiteRT writes for the int8 ADD of ``addends`` (two tensors on
    the grids ``addend_params``) into a tensor with range [lo, hi].

    XNNPACK (:func:`_xnnpack_sum`) takes the ADD when each operand's scale
    over the output scale lies in [2^-10, 2^8); otherwise (a LayerNorm's
    beta, tiny beside the output, say) it runs on TFLite's builtin kernel
    (:func:`_builtin_sum`): each measured to match every element of the
    ADDs and SUBs of MobileViT files that ran on it, where rounding the real
    sum misses about 27 in 10^6."""
    scale, zero_point = grid
    scales = [part(params, 0) for params in addend_params]
    levels = [ops.round(ops.cast(addend, "float64") / ops.cast(s, "float64")) for addend, s in zip(addends, scales)]
    ratios = [s / scale for s in scales]
    in_range = [ops.logical_and(ops.abs(r) >= 2.0 ** -10, ops.abs(r) < 256.0) for r in ratios]
    quantized = ops.cond(ops.logical_and(*in_range), lambda: _xnnpack_sum(levels, ratios),
                         lambda: _builtin_sum(levels, scales, scale))
    zero_point = ops.cast(zero_point, "float64")
    quantized = ops.clip(quantized + zero_point, -128.0, 127.0)
    return ops.cast((quantized - zero_point) * ops.cast(scale, "float64"), addends[0].dtype)


def _xnnpack_sum(levels, ratios):
    """XNNPACK's int8 add (output levels less the zero point, float64):
    each operand's scale over the output scale becomes a fixed-point
    multiplier of 21 to 22 bits, and the sum of the products is shifted
    down, rounding half up."""
    ratios = [ops.cast(r, "float64") for r in ratios]
    shift = ops.power(2.0, 20.0 - floor_log2(ops.maximum(ops.abs(ratios[0]), ops.abs(ratios[1]))))
    total = shift / 2.0
    for operand, ratio in zip(levels, ratios):
        total = total + ops.round(ratio * shift) * operand
    return ops.floor(total / shift)


def _builtin_sum(levels, scales, output_scale):
    """TFLite's builtin int8 ADD (output levels less the zero point): each
    operand, shifted up by 20 bits, is rescaled by a fixed-point multiplier
    of its scale over twice the larger input scale, the sum by one of that
    over the output scale, each with gemmlowp's rounding doubling high
    multiply and rounding right shift (integer arithmetic in int64)."""
    scales = [ops.cast(s, "float64") for s in scales]
    twice_largest = 2.0 * ops.maximum(scales[0], scales[1])
    total = 0
    for operand, scale in zip(levels, scales):
        total = total + _rescaled(ops.cast(operand, "int64") * (1 << 20), scale / twice_largest)
    output = twice_largest / (2.0 ** 20 * ops.cast(output_scale, "float64"))
    return ops.cast(_rescaled(total, output), "float64")


def _rescaled(x, real_multiplier):
    """gemmlowp's MultiplyByQuantizedMultiplierSmallerThanOne: ``x`` (int64)
    times ``real_multiplier`` (< 1) as a 31-bit fixed-point multiplier and a
    right shift, each rounding as TFLite's integer kernels do."""
    exponent = floor_log2(real_multiplier) + 1.0
    fraction = real_multiplier / ops.power(2.0, exponent)       # in [0.5, 1)
    fixed = ops.floor(fraction * 2.0 ** 31 + 0.5)
    exponent = ops.where(fixed >= 2.0 ** 31, exponent + 1.0, exponent)
    fixed = ops.cast(ops.where(fixed >= 2.0 ** 31, fixed / 2.0, fixed), "int64")
    product = x * fixed                                          # < 2^62
    nudge = ops.cast(ops.where(product >= 0, 1 << 30, 1 - (1 << 30)), "int64")
    high = ops.sign(product + nudge) * ops.floor_divide(ops.abs(product + nudge), 1 << 31)
    shift = ops.cast(-exponent, "int64")
    mask = ops.left_shift(ops.ones_like(shift), shift) - 1
    remainder = ops.bitwise_and(high, mask)
    threshold = ops.right_shift(mask, 1) + ops.cast(high < 0, "int64")
    return ops.right_shift(high, shift) + ops.cast(remainder > threshold, "int64")


def bias_levels(bias, input_params, bound):
    """The int32 bias the converter writes: ``bias`` over the product of
    the input's and the channel's float64 scales, as it computes them from
    the ranges before it stores them as float32 (``input_params``: the
    input's [scale, zero point, scale residual]; ``bound``: the channels'
    kernel bounds), rounded half away from zero; with the gradient of the
    division. (Divided by the float32 scales, about one bias in ten
    thousand of a trained MobileViT rounded the other way.)"""
    def f64(value):
        return ops.cast(value, "float64")

    input_scale = part(input_params, 0)
    scaled = bias / (input_scale * weight_scales(bound))
    quotient = f64(bias) / ((f64(input_scale) + f64(part(input_params, 2))) * (f64(bound) * 2.0 / 254.0))
    levels = ops.sign(quotient) * ops.floor(ops.abs(quotient) + 0.5)
    return scaled + ops.stop_gradient(ops.cast(levels, scaled.dtype) - scaled)


def on_levels(x, scale):
    """``x / scale`` rounded to whole numbers (``x`` lies on the grid of
    ``scale``, up to float32 error), with the gradient of the division."""
    scaled = x / scale
    return scaled + ops.stop_gradient(ops.round(scaled) - scaled)


def softmax_requantized(logits, logit_params, grid):
    """What LiteRT's int8 SOFTMAX (beta 1) of the :func:`target_kernels`
    writes over the last axis of ``logits``, int8 values on the grid
    ``logit_params`` ([scale, zero point]), into the tensor with ``grid``
    (scale 1/256, zero point -128)."""
    kernel = arm64_softmax_requantized if target_kernels() == "arm64" else x86_softmax_requantized
    return kernel(logits, logit_params, grid)


def _as_float32(value):
    """``value`` (float64) rounded to float32, as float64 again: after each
    op, float32 arithmetic in float64 (exact: a float64 sum, product or
    quotient of float32 values rounds to what the float32 op gives)."""
    return ops.cast(ops.cast(value, "float32"), "float64")


def _softmax_exp_table(logits, logit_params):
    """The float32 exp of scale x (level - the row's largest level), the
    float32 product: the entry of both kernels' exp tables for each logit."""
    scale = _as_float32(part(logit_params, 0))
    levels = ops.round(ops.cast(logits, "float64") / scale)
    exponents = _as_float32(scale * (levels - ops.max(levels, axis=-1, keepdims=True)))
    return _as_float32(ops.exp(exponents))


def x86_softmax_requantized(logits, logit_params, grid):
    """What the int8 SOFTMAX of LiteRT's x86 builds (``optimized_ops::
    Softmax`` on a float table) writes: a float32 exp table, its entries
    summed one after another in float32 (a running sum), the float32
    1 / (sum x output scale), each entry times that, rounded half away from
    zero. (A fake-quant of Keras' float softmax missed it on about one
    output in a million of a MobileViT file's, and on 1 of 10,240 outputs
    of rows chosen for near-ties.)"""
    out_scale, out_zero_point = (ops.cast(v, "float64") for v in grid)
    table = _softmax_exp_table(logits, logit_params)
    total = ops.cumsum(ops.cast(table, "float32"), axis=-1)[..., -1:]      # float32, in order
    inverse = _as_float32(1.0 / _as_float32(ops.cast(total, "float64") * out_scale))
    steps = _as_float32(table * inverse)
    quantized = ops.sign(steps) * ops.floor(ops.abs(steps) + 0.5)
    levels_out = ops.clip(quantized + out_zero_point, -128.0, 127.0)
    return ops.cast((levels_out - out_zero_point) * out_scale, logits.dtype)


def arm64_softmax_requantized(logits, logit_params, grid):
    """What the int8 SOFTMAX of LiteRT's aarch64 builds (``SoftmaxInt8LUT``,
    beta 1) writes over the last axis of ``logits``, int8 values on the
    grid ``logit_params`` ([scale, zero point]), into the tensor with
    ``grid`` (scale 1/256, zero point -128).

    Its table holds exp(scale x (level - 255)) for the 256 levels below the
    row's largest, times 65535 in float32, rounded to a 16-bit integer; a
    row's output is each entry times the fixed-point form (31 bits and a
    shift) of 1 / (float32 sum x output scale), rounded by a rounding
    doubling high multiply, then a rounding shift. The float32 steps run in
    float64 (see :func:`_as_float32`); the integer steps in float64 are
    exact (< 2^48)."""
    f32 = _as_float32
    out_scale, out_zero_point = (ops.cast(v, "float64") for v in grid)
    table = ops.minimum(ops.floor(f32(_softmax_exp_table(logits, logit_params) * 65535.0) + 0.5), 65535.0)
    total = f32(ops.sum(table, axis=-1, keepdims=True))                   # an int32 summed, as float32
    inverse = f32(1.0 / f32(total * out_scale))
    shift = floor_log2(inverse) + 1.0                                     # inverse = fraction x 2^shift
    fixed = inverse * ops.power(2.0, 31.0 - shift)                        # a whole number: 24 bits
    high = ops.floor((table * fixed + 2.0 ** 30) / 2.0 ** 31)
    right = ops.power(2.0, -shift)
    quantized = ops.floor((high + right / 2.0) / right)
    levels_out = ops.clip(quantized + out_zero_point, -128.0, 127.0)
    return ops.cast((levels_out - out_zero_point) * out_scale, logits.dtype)
