"""Quantization-aware layers: fake quantization where TFLite quantizes.

Every tensor that becomes an int8 tensor of the TFLite graph passes through
a TF fake-quant op (``keras.quantizers.fake_quant_with_min_max_vars``, or
the op it calls where the range is already known, see ``_fake_quant``),
whose ranges the converter takes as the tensor's scale and zero point. So the Keras model
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

import contextlib
import contextvars
import functools
import inspect

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

PACKAGE = "edgevit.qat"
# TFLite fixes the int8 output of LOGISTIC and SOFTMAX to scale 1/256,
# zero point -128: the range [0, 255/256].
UNIT_RANGE = (0.0, 255.0 / 256.0)
# TANH: scale 1/128, zero point 0.
FIXED_OUTPUT_RANGES = {"sigmoid": UNIT_RANGE, "softmax": UNIT_RANGE, "tanh": (-1.0, 127.0 / 128.0)}
DEFAULT_MOMENTUM = 0.99
# A range narrower than this is widened (a constant-zero tensor still gets
# a valid scale).
MIN_RANGE_WIDTH = 1e-6


_EXPORTING = contextvars.ContextVar("edgevit_qat_exporting", default=None)


class _Export:
    """What one trace for the converter shares: the op kinds left in float,
    and each quantizer's [lo, hi] and [scale, zero point], read from its
    variables once and written into the graph as constants (the converter
    would fold the ops computing them anyway; tracing them costs more than
    the rest of the model)."""

    def __init__(self, float_ops, fake_quant: bool):
        self.float_ops = frozenset(float_ops)
        self.fake_quant = fake_quant
        self.constants: dict[tuple[int, str], object] = {}

    def constant(self, owner, what: str, compute):
        key = (id(owner), what)
        if key not in self.constants:
            import tensorflow as tf

            with tf.init_scope():
                self.constants[key] = tf.nest.map_structure(lambda v: np.asarray(v, np.float32), compute())
        return self.constants[key]


@contextlib.contextmanager
def exporting(float_ops: tuple[str, ...] = (), fake_quant: bool = True):
    """While a QAT model is traced for the TFLite converter: quantizers emit
    only the fake-quant ops the converter reads ranges from, with constant
    ranges and without the emulation of LiteRT's kernel arithmetic (which
    would convert to ops). The outputs of ``float_ops`` ("BATCH_MATMUL",
    "SOFTMAX") get no range: the converter leaves those ops in float
    (``--int8-mixed``). Without ``fake_quant`` the model computes in float
    with its trained weights as they are (a float file of a QAT model)."""
    token = _EXPORTING.set(_Export(float_ops, fake_quant))
    try:
        yield
    finally:
        _EXPORTING.reset(token)


def _exporting() -> bool:
    return _EXPORTING.get() is not None


def _float_while_exporting(op: str) -> bool:
    return _exporting() and op in _EXPORTING.get().float_ops


def _without_fake_quant() -> bool:
    return _exporting() and not _EXPORTING.get().fake_quant


def _traced_constant(owner, what: str, compute):
    """``compute()``, as a constant while exporting (see :class:`_Export`)."""
    export = _EXPORTING.get()
    return compute() if export is None else export.constant(owner, what, compute)


def _fake_quant(x, lo, hi, **kwargs):
    if _without_fake_quant():
        return x
    if not kwargs and np.ndim(lo) == 0 and _array_module(lo, hi) is np:  # a range known now
        import tensorflow as tf

        if _exporting():  # the converter reads the range from the op's attributes: one graph node
            return tf.quantization.fake_quant_with_min_max_args(x, min=float(lo), max=float(hi), num_bits=8)
        # The op keras calls, without its reshapes and casts. (The attribute
        # op rounds about 3 values in 10^6 the other way: training in a
        # graph, which reads the range from variables, would then differ.)
        return tf.quantization.fake_quant_with_min_max_vars(x, np.float32(lo), np.float32(hi), num_bits=8)
    return keras.quantizers.fake_quant_with_min_max_vars(x, lo, hi, num_bits=8, **kwargs)


def _of_weight(value, what: str, compute):
    """``compute()``, as a constant while exporting when ``value`` is a
    weight variable (not a tensor computed in the traced graph)."""
    return _traced_constant(value, what, compute) if isinstance(value, keras.Variable) else compute()


def scale_and_zero_point(lo, hi):
    """The int8 scale and zero point of the range [lo, hi], nudged as the
    fake-quant op and the converter do (zero exactly representable). The
    converter computes in float64 and stores float32; a float32 difference
    of the bounds differs from that in the last bit for about a quarter of
    the ranges, and XNNPACK's requantization multiplies by these bits."""
    scale, zero_point, _ = quantization_params(lo, hi)
    return scale, zero_point


# [scale, zero point, scale residual] of an int8 tensor (see quantization_params)
PARAMS_SIZE = 3


def quantization_params(lo, hi):
    """The int8 scale and zero point of [lo, hi] (float32, as the file
    keeps them; see :func:`scale_and_zero_point`) and the scale's residual:
    the converter's float64 scale less the float32 one, which it quantizes
    int32 biases with before it stores the scales (see :func:`bias_levels`)."""
    xp = _array_module(lo, hi)
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


def _array_module(*values):
    """numpy where every value is known now (eager weights, constants),
    else keras ops: eagerly, each keras op costs more than numpy's whole
    computation of a range, and a QAT forward pass computes a thousand."""
    return np if not any(ops.is_tensor(v) or isinstance(v, keras.Variable) for v in values) else ops


def _value_now(value):
    """A variable's or tensor's value as numpy where it can be read
    (eagerly), else the variable or tensor itself."""
    import tensorflow as tf

    known = tf.executing_eagerly() and (ops.is_tensor(value) or isinstance(value, keras.Variable))
    return np.asarray(value) if known else value


def weight_scales(bound):
    """The per-channel scales the converter gives a kernel whose channels
    span [-bound, bound] on the narrow int8 grid (float64, stored float32)."""
    return ops.cast(ops.cast(bound, "float64") * 2.0 / 254.0, "float32")


def accumulator_requantized(x, input_params, kernel_scales, lo, hi):
    """What XNNPACK writes for ``x``, the output of an int8 convolution or
    dense layer whose input has [scale, zero point] ``input_params`` and
    whose output channels have ``kernel_scales``, into a tensor with range
    [lo, hi]: the int32 accumulator (bias included) times the float32
    requantization scale ``input_scale * kernel_scale / output_scale``,
    rounded half to even (XNNPACK's fp32 requantization, measured to match
    every element of a trained MobileViT's convolutions). A float32 fake
    quant of the float output lands a few ulps off that product and rounds
    the other way near midpoints, about one output in 10^4, and each such
    step spreads through the layers after it."""
    scale, zero_point = scale_and_zero_point(lo, hi)
    step = input_params[0] * kernel_scales
    accumulator = ops.round(x / step)
    levels = ops.round(accumulator * (step / scale))
    return (ops.clip(levels + zero_point, -128.0, 127.0) - zero_point) * scale


def product_requantized(x, factor_params, lo, hi, square: bool = False):
    """What XNNPACK writes for ``x``, the int8 MUL of two operands on the
    grids ``factor_params`` ([scale, zero point] each), into a tensor with
    range [lo, hi]: the integer product times the float32 multiplier
    ``scale_a * scale_b / output_scale``, the product in float32, rounded
    half to even, as a convolution's accumulator. A tensor times itself
    (``square``) runs another kernel, which rounds the exact product once
    (measured on every element of the MULs of MobileViT v1/v2/v3 files,
    near-ties included: each rule turns about one near-tie in a thousand the
    other way in the other case)."""
    scale, zero_point = scale_and_zero_point(lo, hi)
    step = factor_params[0][0] * factor_params[1][0]
    multiplier = step / scale
    product = ops.round(ops.cast(x, "float64") / ops.cast(step, "float64"))
    if square:
        levels = ops.cast(ops.round(product * ops.cast(multiplier, "float64")), x.dtype)
    else:
        levels = ops.round(ops.cast(product, x.dtype) * multiplier)
    return (ops.clip(levels + zero_point, -128.0, 127.0) - zero_point) * scale


def floor_log2(value):
    """``floor(log2(value))`` exactly for float64 ``value`` > 0 (log2 of a
    value an ulp below a power of two rounds up to that power's exponent):
    the exponent of a fixed-point multiplier."""
    exponent = ops.floor(ops.log2(value))
    return exponent + ops.cast(ops.power(2.0, exponent + 1.0) <= value, "float64") \
        - ops.cast(ops.power(2.0, exponent) > value, "float64")


def batch_matmul_requantized(x, lhs, rhs, lo, hi):
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
    times 2^shift exceeds float32's integers."""
    return ops.cond(ops.equal(rhs[1], 0.0), lambda: accumulator_requantized(x, lhs, rhs[0], lo, hi),
                    lambda: _builtin_batch_matmul(x, lhs[0] * rhs[0], lo, hi))


def _builtin_batch_matmul(x, product_scale, lo, hi):
    """LiteRT's builtin int8 BATCH_MATMUL requantization of the float
    product ``x`` of operands whose scales multiply to ``product_scale``
    (see :func:`batch_matmul_requantized`)."""
    scale, zero_point = scale_and_zero_point(lo, hi)
    multiplier = ops.cast(product_scale / scale, "float64")
    steps = ops.power(2.0, -floor_log2(multiplier) - 1.0)  # 2^shift
    accumulator = ops.round(ops.cast(x, "float64") / ops.cast(product_scale, "float64"))
    fine = ops.floor(accumulator * multiplier * steps + 0.5)
    rounded = ops.sign(fine) * ops.floor(ops.abs(fine) / steps + 0.5)
    zero_point = ops.cast(zero_point, "float64")
    return ops.cast((ops.clip(rounded + zero_point, -128.0, 127.0) - zero_point) * ops.cast(scale, "float64"),
                    x.dtype)


def input_quantized(x, lo, hi):
    """The model's float input as an app quantizes it for an int8 input
    tensor: ``x / scale`` in float32, rounded half to even, plus the zero
    point (edgevit's runners and the Android demo; a fake-quant rounds half
    up, and every pixel of a model normalised with mean 0.5 and std 0.5 lies
    within float32 error of a midpoint)."""
    scale, zero_point = scale_and_zero_point(lo, hi)
    levels = ops.round(x / scale)
    return (ops.clip(levels + zero_point, -128.0, 127.0) - zero_point) * scale


def mean_requantized(summands, summand_params, axes, lo, hi):
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
    scale, zero_point = scale_and_zero_point(lo, hi)
    count = np.float32(np.prod([summands.shape[a] for a in axes]))
    input_scale, input_zero_point = (ops.cast(p, "float32") for p in (summand_params[0], summand_params[1]))
    multiplier = (input_scale / ops.cast(scale, "float32")) * (np.float32(1.0) / count)
    levels = ops.round(summands / input_scale) + input_zero_point  # whole numbers: their float32 sum is exact
    values = ops.sum(levels, axis=axes, keepdims=True)
    quantized = ops.round(values * multiplier + (zero_point - (count * input_zero_point) * multiplier))
    return (ops.clip(quantized, -128.0, 127.0) - zero_point) * scale


def sum_requantized(addends, addend_params, lo, hi):
    """What LiteRT writes for the int8 ADD of ``addends`` (two tensors on
    the grids ``addend_params``) into a tensor with range [lo, hi].

    XNNPACK (:func:`_xnnpack_sum`) takes the ADD when each operand's scale
    over the output scale lies in [2^-10, 2^8); otherwise (a LayerNorm's
    beta, tiny beside the output, say) it runs on TFLite's builtin kernel
    (:func:`_builtin_sum`): each measured to match every element of the
    ADDs and SUBs of MobileViT files that ran on it, where rounding the real
    sum misses about 27 in 10^6."""
    scale, zero_point = scale_and_zero_point(lo, hi)
    levels = [ops.round(ops.cast(addend, "float64") / ops.cast(params[0], "float64"))
              for addend, params in zip(addends, addend_params)]
    ratios = [params[0] / scale for params in addend_params]
    in_range = [ops.logical_and(ops.abs(r) >= 2.0 ** -10, ops.abs(r) < 256.0) for r in ratios]
    quantized = ops.cond(ops.logical_and(*in_range), lambda: _xnnpack_sum(levels, ratios),
                         lambda: _builtin_sum(levels, [p[0] for p in addend_params], scale))
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


@keras.saving.register_keras_serializable(package=PACKAGE)
class ActivationQuantizer(keras.layers.Layer):
    """Per-tensor int8 fake quantization of an activation.

    The range follows the batch min/max: a running mean over the first
    ``1 / (1 - momentum)`` batches, then an exponential moving average. It is
    updated while training and while ``observing`` (calibration, where the
    input passes through unquantized); at inference the stored range is used.
    ``fixed_range`` pins the range (TFLite's fixed output ranges).
    ``model_input``: the quantizer of the model's input, rounded as an app
    quantizes it (see :func:`input_quantized`).

    One quantizer can serve several tensors that LiteRT keeps at one scale
    (the inputs of a CONCATENATION): each is a call with its own ``slot``,
    tracked separately, and all are quantized to the union of the slots'
    ranges.
    """

    observing = False  # set on instances by edgevit.quantize.qat.calibrate

    def __init__(self, momentum: float = DEFAULT_MOMENTUM, fixed_range=None, slots: int = 1,
                 symmetric: bool = False, model_input: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.model_input = bool(model_input)
        self.momentum = float(momentum)
        self.fixed_range = None if fixed_range is None else (float(fixed_range[0]), float(fixed_range[1]))
        self.slots = int(slots)
        self.symmetric = bool(symmetric)
        if self.fixed_range is None:
            self.range_min = self.add_weight(name="range_min", shape=(self.slots,), initializer="zeros",
                                             trainable=False, aggregation="mean")
            self.range_max = self.add_weight(name="range_max", shape=(self.slots,), initializer="zeros",
                                             trainable=False, aggregation="mean")
            self.batches_seen = self.add_weight(name="batches_seen", shape=(self.slots,), initializer="zeros",
                                                trainable=False, aggregation="only_first_replica")
        self.built = True

    def build(self, input_shape):
        self.built = True

    def call(self, x, training=None, slot: int = 0, lhs=None, rhs=None, with_params: bool = False,
             input_params=None, kernel_scales=None, factor_params=None, square_params=None, addends=None,
             addend_params=None, summands=None, summand_params=None, axes=None):
        """``lhs``, ``rhs``: the operands' [scale, zero point] when ``x`` is
        the output of a BATCH_MATMUL, whose kernel may round differently (see
        :func:`batch_matmul_requantized`). ``input_params``,
        ``kernel_scales``: the input's [scale, zero point] and the channel
        scales when ``x`` is a convolution's or dense layer's accumulator
        (see :func:`accumulator_requantized`). ``factor_params``: the
        [scale, zero point] of the two operands of the int8 MUL that writes
        ``x`` (see :func:`product_requantized`), ``square_params`` the
        operand's of a tensor times itself. ``addends``,
        ``addend_params``: the operands of the int8 ADD that writes ``x`` and
        their [scale, zero point] (see :func:`sum_requantized`).
        ``summands``, ``summand_params``, ``axes``: the operand of the int8
        MEAN over ``axes`` that writes ``x`` and its [scale, zero point] (see
        :func:`mean_requantized`). ``with_params``: also return
        [scale, zero point], for the layers that read ``x`` (their int32
        bias, their BATCH_MATMUL)."""
        if self.fixed_range is None and (training or self.observing):
            self._track(x, slot)
        if self.observing:
            quantized = x
        else:
            lo, hi = self.quantization_range()
            quantized = _fake_quant(x, lo, hi)
            exact = None
            if lhs is not None and not _exporting():
                exact = batch_matmul_requantized(x, lhs, rhs, lo, hi)
            elif input_params is not None and not _exporting():
                exact = accumulator_requantized(x, input_params, kernel_scales, lo, hi)
            elif factor_params is not None and not _exporting():
                exact = product_requantized(x, factor_params, lo, hi)
            elif square_params is not None and not _exporting():
                exact = product_requantized(x, [square_params, square_params], lo, hi, square=True)
            elif addends is not None and not _exporting():
                exact = sum_requantized(addends, addend_params, lo, hi)
            elif summands is not None and not _exporting():
                exact = mean_requantized(summands, summand_params, axes, lo, hi)
            elif self.model_input and not _exporting():
                exact = input_quantized(x, lo, hi)
            if exact is not None:
                quantized = quantized + ops.stop_gradient(exact - quantized)
        return (quantized, self.params()) if with_params else quantized

    def quantization_range(self):
        if self.fixed_range is not None:
            return self.fixed_range
        return _traced_constant(self, "range", self._tracked_range)

    def _tracked_range(self):
        return value_range(_value_now(self.range_min), _value_now(self.range_max), self.symmetric)

    def params(self):
        """[scale, zero point, scale residual] of the int8 tensor (see :func:`quantization_params`)."""
        return _traced_constant(self, "params", lambda: ops.stack(quantization_params(*self.quantization_range())))

    def _track(self, x, slot: int):
        # eagerly in numpy: the same float32 arithmetic at a fraction of the eager ops' cost
        x = _value_now(ops.stop_gradient(ops.cast(x, "float32")))
        xp, f32 = _array_module(x), np.float32
        finite = xp.isfinite(x)
        values = xp.where(finite, x, xp.zeros_like(x))
        batch_min, batch_max = xp.min(values), xp.max(values)
        this_slot = xp.logical_and(xp.arange(self.slots) == slot, xp.any(finite))
        seen, range_min, range_max = (_value_now(v) for v in (self.batches_seen, self.range_min, self.range_max))
        rate = xp.minimum(f32(self.momentum), seen / (seen + f32(1.0)))
        self.range_min.assign(xp.where(this_slot, rate * range_min + (f32(1.0) - rate) * batch_min, range_min))
        self.range_max.assign(xp.where(this_slot, rate * range_max + (f32(1.0) - rate) * batch_max, range_max))
        self.batches_seen.assign(seen + xp.where(this_slot, f32(1.0), f32(0.0)))

    def compute_output_spec(self, x, with_params: bool = False, **kwargs):
        spec = keras.KerasTensor(x.shape, x.dtype)
        return (spec, keras.KerasTensor((PARAMS_SIZE,), "float32")) if with_params else spec

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "slots": self.slots,
                "fixed_range": None if self.fixed_range is None else list(self.fixed_range),
                "symmetric": self.symmetric, "model_input": self.model_input}


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

    def accumulate(self, op, inputs, kernel, bound, input_params, bias=None, with_kernel_scales: bool = False):
        """``op(inputs, kernel)`` plus ``bias`` (the layer's own by
        default), as the int8 kernel computes it. ``kernel``: on its
        per-channel int8 grid, output channels on its last axis, which
        span [-bound, bound]. ``with_kernel_scales``: also return the
        channels' scales, for the quantizer of the output (see
        :func:`accumulator_requantized`)."""
        if input_params is None and self.input_params_source is not None:
            input_params = self.input_params_source()
        if bias is None and self.use_bias:
            bias = self.bias
        kernel_scales = weight_scales(bound)
        if input_params is None or _exporting():
            outputs = op(inputs, kernel)
            outputs = outputs if bias is None else ops.add(outputs, bias)
        else:
            step = input_params[0] * kernel_scales
            outputs = op(on_levels(inputs, input_params[0]), on_levels(kernel, kernel_scales)) * step
            if bias is not None:
                outputs = outputs + bias_levels(bias, input_params, bound) * step
        return (outputs, kernel_scales) if with_kernel_scales else outputs


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

    scaled = bias / (input_params[0] * weight_scales(bound))
    quotient = f64(bias) / ((f64(input_params[0]) + f64(input_params[2])) * (f64(bound) * 2.0 / 254.0))
    levels = ops.sign(quotient) * ops.floor(ops.abs(quotient) + 0.5)
    return scaled + ops.stop_gradient(ops.cast(levels, scaled.dtype) - scaled)


def on_levels(x, scale):
    """``x / scale`` rounded to whole numbers (``x`` lies on the grid of
    ``scale``, up to float32 error), with the gradient of the division."""
    scaled = x / scale
    return scaled + ops.stop_gradient(ops.round(scaled) - scaled)


def with_channel_scales(spec, with_kernel_scales: bool):
    """The output spec of a layer with an int8 kernel, and of its channel scales if asked."""
    return (spec, keras.KerasTensor((spec.shape[-1],), "float32")) if with_kernel_scales else spec


def kernel_bound(kernel, channel_axis: int):
    """The per-output-channel max |kernel|: the narrow int8 range of each channel is [-bound, bound]."""
    axes = [a for a in range(len(kernel.shape)) if a != channel_axis % len(kernel.shape)]
    return _of_weight(kernel, f"bound{channel_axis}",
                      lambda: ops.stop_gradient(ops.maximum(ops.max(ops.abs(kernel), axis=axes), 1e-8)))


def fake_quant_kernel(kernel, channel_axis: int):
    """Per-output-channel symmetric int8 (narrow range) fake quantization."""
    bound = kernel_bound(kernel, channel_axis)
    return _fake_quant(kernel, -bound, bound, narrow_range=True, axis=channel_axis)


def round_kernel_to_grid(kernel, reduced_axes=None):
    """The per-output-channel symmetric int8 grid (channels: every axis but
    ``reduced_axes``, by default the last axis of a Dense kernel), with a
    straight-through gradient (see the module docstring). While exporting,
    a constant: the converter derives the FULLY_CONNECTED weight scales of a
    constant as :func:`weight_scales` of its :func:`kernel_bound`, but of a
    slice computed in the graph an ulp or two lower now and then."""
    if _without_fake_quant():
        return kernel
    axes = list(range(len(kernel.shape) - 1)) if reduced_axes is None else list(reduced_axes)

    def on_grid():
        scale = ops.stop_gradient(ops.maximum(ops.max(ops.abs(kernel), axis=axes, keepdims=True), 1e-8)) / 127.0
        rounded = ops.clip(ops.round(kernel / scale), -127.0, 127.0) * scale
        return kernel + ops.stop_gradient(rounded - kernel)

    return _of_weight(kernel, f"grid{axes}", on_grid)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantConv2D(IntegerAccumulation, keras.layers.Conv2D):
    """Conv2D with a per-output-channel fake-quantized kernel (BatchNorm
    already folded into kernel and bias)."""

    def call(self, inputs, input_params=None, with_kernel_scales: bool = False):
        return self.accumulate(self.convolution_op, inputs, fake_quant_kernel(self.kernel, -1),
                               kernel_bound(self.kernel, -1), input_params, with_kernel_scales=with_kernel_scales)

    def compute_output_spec(self, inputs, input_params=None, with_kernel_scales: bool = False):
        return with_channel_scales(super().compute_output_spec(inputs), with_kernel_scales)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantDepthwiseConv2D(IntegerAccumulation, keras.layers.DepthwiseConv2D):
    """DepthwiseConv2D with a per-channel fake-quantized kernel. TFLite keeps
    a depthwise kernel as [1, kh, kw, C * multiplier], quantized along the
    last axis: here the kernel's last two axes, flattened."""

    def call(self, inputs, input_params=None, with_kernel_scales: bool = False):
        shape = self.kernel.shape
        flat = ops.reshape(self.kernel, (shape[0], shape[1], 1, shape[2] * shape[3]))

        def depthwise(x, flat_kernel):
            return ops.depthwise_conv(x, ops.reshape(flat_kernel, shape), strides=self.strides, padding=self.padding,
                                      dilation_rate=self.dilation_rate, data_format=self.data_format)

        return self.accumulate(depthwise, inputs, fake_quant_kernel(flat, -1), kernel_bound(flat, -1), input_params,
                               with_kernel_scales=with_kernel_scales)

    def compute_output_spec(self, inputs, input_params=None, with_kernel_scales: bool = False):
        return with_channel_scales(super().compute_output_spec(inputs), with_kernel_scales)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantDense(IntegerAccumulation, keras.layers.Dense):
    """Dense with its kernel on the per-output-channel int8 grid."""

    def call(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        kernel = round_kernel_to_grid(self.kernel)
        return self.accumulate(ops.matmul, inputs, kernel, kernel_bound(kernel, -1), input_params,
                               with_kernel_scales=with_kernel_scales)

    def compute_output_spec(self, inputs, training=None, input_params=None, with_kernel_scales: bool = False):
        return with_channel_scales(super().compute_output_spec(inputs), with_kernel_scales)

    def channels(self, inputs, start: int, stop: int):
        """Output channels [start, stop) alone, as a FULLY_CONNECTED of
        their own computes them (per-channel grids are the same; the slice
        of the constant grid, see :func:`round_kernel_to_grid`)."""
        kernel = round_kernel_to_grid(self.kernel)[:, start:stop]
        return self.accumulate(ops.matmul, inputs, kernel, kernel_bound(kernel, -1), None,
                               self.bias[start:stop] if self.use_bias else None)


class QuantizedPoints:
    """Mixin for the quantization-aware form of a layer with
    ``quantize_point`` hooks (see ``edgevit.layers.quantize_points``).

    Every tag is one of:

    - an op output (``TAGS``): a tracked range, or the fixed range LiteRT
      gives that op (``FIXED``: LOGISTIC, SOFTMAX);
    - a constant operand (``CONSTANTS``: a LayerNorm's gamma, a position
      embedding): per-tensor int8 with the range of its own values and zero,
      which is how the converter quantizes a constant operand of MUL or ADD;
    - a constant matrix that the converter turns into FULLY_CONNECTED
      weights (``KERNELS``, with the axes its output channels do not run
      along): the per-output-channel grid of a Dense kernel.

    ``MATMULS`` names, for each op output that is a BATCH_MATMUL of two
    activations, where its operands' scales come from (a tag, or the index
    of a layer input), so that its quantizer rounds as that kernel does;
    ``OUTPUT_MATMUL`` the same for a layer output. The layer's own outputs
    are not among the tags: the QAT rewrite gives every layer output its
    range.

    A layer called at several places of a model (one LayerNorm over a class
    token group and a patch group) produces separate int8 tensors at each
    call, so each call site ``site`` has its own ranges; weights are shared.
    """

    TAGS: tuple[str, ...] = ()
    FIXED: dict[str, tuple[float, float]] = {}
    CONSTANTS: tuple[str, ...] = ()
    KERNELS: dict[str, tuple[int, ...]] = {}
    MATMULS: dict[str, tuple[str | int, str | int]] = {}
    # tag -> the op that writes it, where both that op and the op reading the
    # tag can stay in float (``--int8-mixed``: BATCH_MATMUL, SOFTMAX): then
    # the tag has no range, and the converter leaves both ops in float.
    FLOAT_WHEN_MIXED: dict[str, str] = {}
    # The layer's last ops, in order, as (op output tag they read, constant
    # weight operand, the value that makes the op an identity: 1 for MUL, 0
    # for ADD). Where every op after a tag is an identity (untrained weights
    # quantize to exactly 1 or 0), the converter folds them away, and the
    # tag's own range would meet the layer's output range: the tag has none.
    IDENTITY_TAIL: tuple[tuple[str, str, float], ...] = ()
    OUTPUT_MATMUL: tuple[str | int, str | int] | None = None
    # internal Dense -> what it reads: the layer's input i, or the tag of an internal op output
    DENSE_INPUTS: dict[str, int | str] = {}
    # op output tag -> the internal Dense that writes it, and the internal
    # Dense that writes the layer's output: their quantizers round the int32
    # accumulator as XNNPACK does (see accumulator_requantized)
    DENSE_OUTPUTS: dict[str, str] = {}
    OUTPUT_DENSE: str | None = None
    # op output tag -> the operands (a tag or an input index) of the MUL
    # that writes it; XNNPACK requantizes their integer product as it does an
    # accumulator. OUTPUT_PRODUCT: the same for the layer's output.
    PRODUCTS: dict[str, tuple[str | int, str | int]] = {}
    OUTPUT_PRODUCT: tuple[str | int, str | int] | None = None
    # op output tag -> the operands (a tag or an input index) of the ADD
    # (sign 1) or SUB (sign -1) that writes it, and the sign: XNNPACK sums
    # their levels with fixed-point multipliers (see sum_requantized)
    SUMS: dict[str, tuple[str | int, str | int, float]] = {}
    # op output tag -> the operand (a tag or an input index) of the MEAN
    # that writes it and the axes it reduces: XNNPACK rescales the integer
    # sum of the levels (see mean_requantized)
    MEANS: dict[str, tuple[str | int, tuple[int, ...]]] = {}
    # the same for the ADD or SUB that writes the layer's output
    OUTPUT_SUM: tuple[str | int, str | int, float] | None = None

    def __init__(self, *args, momentum: float = DEFAULT_MOMENTUM, sites: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.momentum, self.sites = momentum, int(sites)
        self.site, self.input_params, self.constant = 0, None, False
        # this call's inputs and quantized op outputs by tag (the operands of
        # SUMS and MEANS), and its constants' [scale, zero point]
        self.operands: dict[str | int, object] = {}
        self.constant_params: dict[str, object] = {}
        # XNNPACK runs an int8 BATCH_MATMUL only when its second operand has zero point 0
        symmetric = {rhs for _, rhs in (*self.MATMULS.values(), *filter(None, [self.OUTPUT_MATMUL]))}
        for site in range(self.sites):
            for tag in self.point_tags():
                name = self.quantizer_name(tag, site)
                setattr(self, name, ActivationQuantizer(momentum, fixed_range=self.fixed_range(tag),
                                                        symmetric=tag in symmetric, name=name))
        for dense, source in self.DENSE_INPUTS.items():
            if hasattr(self, dense):
                getattr(self, dense).input_params_source = functools.partial(self.params_of, source)

    def params_of(self, source):
        """[scale, zero point] of the layer's input ``source`` (an index) or
        of its internal op output ``source`` (a tag); None if unknown."""
        if isinstance(source, str):
            return self.constant_params[source] if source in self.CONSTANTS else self.quantizer(source).params()
        return self.input_params[source] if self.input_params else None

    def point_tags(self) -> tuple[str, ...]:
        """The op-output tags this configuration of the layer reaches."""
        return self.TAGS

    def fixed_range(self, tag: str):
        return self.FIXED.get(tag)

    def output_range(self):
        """The range LiteRT fixes for the layer's output (None: tracked)."""
        return None

    @staticmethod
    def quantizer_name(tag: str, site: int) -> str:
        return f"q_{tag}" if site == 0 else f"q{site}_{tag}"

    @classmethod
    def from_float(cls, layer, momentum: float, sites: int):
        """The quantization-aware twin of float ``layer`` with its weights."""
        new = cls.from_config({**layer.get_config(), "momentum": momentum, "sites": sites})
        new.build_like(layer)
        copy_weights(layer.weights, own_weights(new), layer.name)
        return new

    def build_like(self, layer):
        self.build(layer._build_shapes_dict and next(iter(layer._build_shapes_dict.values())))

    def call(self, inputs, training=None, site: int = 0, input_params=None, with_accumulator: bool = False):
        """``input_params``: [scale, zero point] of each (flattened) input,
        for the int32 biases of the Dense layers that read them
        (``DENSE_INPUTS``) and the BATCH_MATMULs (``MATMULS``); None for an
        input that is a constant of the graph (see :meth:`constant_outputs`).
        A call on constants only computes in float: the converter folds it.
        ``with_accumulator``: also return the arguments for the quantizer of
        the layer's output, which an internal Dense or MUL writes
        (:meth:`output_accumulator`)."""
        self.site, self.input_params = site, input_params
        self.operands = dict(enumerate(keras.tree.flatten(inputs)))
        self.constant = bool(input_params) and all(p is None for p in input_params)
        outputs = self.float_call(inputs, training)
        return (outputs, self.output_accumulator()) if with_accumulator else outputs

    def output_product(self):
        return self.OUTPUT_PRODUCT

    def accumulates_output(self, input_params) -> bool:
        """Whether the layer's output, given its inputs' [scale, zero point]
        ``input_params``, is written by an internal Dense or MUL whose
        rounding the output's quantizer follows (the QAT rewrite then asks
        for :meth:`call`'s ``with_accumulator``)."""
        if self.OUTPUT_DENSE is not None:
            return True
        operands = self.output_product() or (self.OUTPUT_SUM[:2] if self.OUTPUT_SUM else None)
        return operands is not None and all(not isinstance(source, int) or
                                            (source < len(input_params) and input_params[source] is not None)
                                            for source in operands)

    def output_accumulator(self) -> dict:
        if self.OUTPUT_DENSE is not None:
            return self.accumulator_of(self.OUTPUT_DENSE)
        if self.OUTPUT_SUM is not None:
            return self.sum_of(*self.OUTPUT_SUM)
        return self.product_of(*self.output_product())

    def compute_output_spec(self, *args, with_accumulator: bool = False, **kwargs):
        spec = super().compute_output_spec(*args, **kwargs)
        if not with_accumulator:
            return spec

        def params():  # one symbolic tensor each: the functional graph maps values by tensor
            return keras.KerasTensor((PARAMS_SIZE,), "float32")

        if self.OUTPUT_DENSE is not None:
            channels = getattr(self, self.OUTPUT_DENSE).units
            return spec, {"input_params": params(), "kernel_scales": keras.KerasTensor((channels,), "float32")}
        if self.OUTPUT_SUM is not None:
            return spec, {"addends": [keras.KerasTensor(spec.shape, spec.dtype),
                                      keras.KerasTensor(self.output_sum_shape(), spec.dtype)],
                          "addend_params": [params(), params()]}
        return spec, {"factor_params": [params(), params()]}

    def output_sum_shape(self) -> tuple[int, ...]:
        """The shape of the second operand of ``OUTPUT_SUM``."""
        raise NotImplementedError(f"{type(self).__name__} has no output sum")

    def product_of(self, first, second) -> dict | None:
        """The quantizer arguments for a MUL of two int8 operands (a tag or
        an input index each); None where one is not an int8 tensor."""
        params = [self.params_of(first), self.params_of(second)]
        if any(p is None for p in params):
            return None
        return {"square_params": params[0]} if first == second else {"factor_params": params}

    def sum_of(self, first, second, sign: float) -> dict | None:
        """The quantizer arguments for an ADD (``sign`` 1) or SUB (-1) of
        two int8 operands (a tag or an input index each); None where one is
        not an int8 tensor. A SUB is XNNPACK's ADD with the second
        operand's multiplier negated: its levels negated here."""
        params = [self.params_of(first), self.params_of(second)]
        if any(p is None for p in params):
            return None
        second_operand = self.operands[second] if sign == 1.0 else ops.multiply(self.operands[second], sign)
        return {"addends": [self.operands[first], second_operand], "addend_params": params}

    def mean_of(self, source, axes: tuple[int, ...]) -> dict | None:
        """The quantizer arguments for a MEAN over ``axes`` of an int8
        operand (a tag or an input index); None where it is not one."""
        params = self.params_of(source)
        if params is None:
            return None
        return {"summands": self.operands[source], "summand_params": params, "axes": tuple(axes)}

    def accumulator_of(self, dense: str, start: int = 0, stop: int | None = None) -> dict:
        """The quantizer arguments for the output channels [start, stop) of
        the internal Dense ``dense`` (see accumulator_requantized)."""
        kernel = getattr(self, dense).kernel
        return {"input_params": self.params_of(self.DENSE_INPUTS[dense]),
                "kernel_scales": weight_scales(kernel_bound(round_kernel_to_grid(kernel), -1))[start:stop]}

    def dense_output(self, tag: str) -> dict:
        """The quantizer arguments for op output ``tag`` written by an internal Dense."""
        return self.accumulator_of(self.DENSE_OUTPUTS[tag])

    @classmethod
    def constant_outputs(cls, constant_inputs: list[bool], outputs: int) -> list[bool]:
        """Which outputs are constants of the graph, given which inputs are."""
        return [bool(constant_inputs) and all(constant_inputs)] * outputs

    def float_call(self, inputs, training):
        float_call = super().call
        if "training" in inspect.signature(float_call).parameters:
            return float_call(inputs, training=training)
        return float_call(inputs)

    def quantize_point(self, tag: str, x):
        if tag in self.CONSTANTS:
            self.constant_params[tag] = constant_params(x)
        quantized = self.quantized_point(tag, x)
        self.operands[tag] = quantized
        return quantized

    def quantized_point(self, tag: str, x):
        if self.constant or (tag in self.FLOAT_WHEN_MIXED and _float_while_exporting(self.FLOAT_WHEN_MIXED[tag])):
            return x
        if tag in self.CONSTANTS:
            return fake_quant_constant(x)
        if tag in self.KERNELS:
            return round_kernel_to_grid(x, self.KERNELS[tag])
        operands = self.MATMULS.get(tag)
        if operands is not None:
            return self.quantizer(tag)(x, lhs=self.params_of(operands[0]), rhs=self.params_of(operands[1]))
        tail_tags = [t for t, _, _ in self.IDENTITY_TAIL]
        if tag in tail_tags:
            return self.unless_identity_follows(self.IDENTITY_TAIL[tail_tags.index(tag):], x)
        return self.quantizer(tag)(x, **(self.kernel_arithmetic(tag) or {}))

    def matmul(self, tag, a, b):
        """On the int8 levels, as :class:`IntegerAccumulation` computes
        convolutions: the BATCH_MATMUL's int32 accumulator exactly (a
        float32 product of the dequantized operands of an attention layer
        misses it by a step now and then)."""
        operands = self.OUTPUT_MATMUL if tag is None else self.MATMULS.get(tag)
        params = None if operands is None or self.constant or _exporting() else [self.params_of(s) for s in operands]
        if params is None or any(p is None for p in params):
            return super().matmul(tag, a, b)
        lhs_scale, rhs_scale = params[0][0], params[1][0]
        return super().matmul(tag, on_levels(a, lhs_scale), on_levels(b, rhs_scale)) * (lhs_scale * rhs_scale)

    def kernel_arithmetic(self, tag: str) -> dict | None:
        """The quantizer arguments with which op output ``tag`` is rounded
        as LiteRT's kernel computes it; None where the op has no such rule
        or an operand is not an int8 tensor."""
        if tag in self.SUMS:
            return self.sum_of(*self.SUMS[tag])
        if tag in self.MEANS:
            return self.mean_of(*self.MEANS[tag])
        if tag in self.PRODUCTS:
            return self.product_of(*self.PRODUCTS[tag])
        arguments = self.dense_output(tag) if tag in self.DENSE_OUTPUTS else None
        return arguments if arguments is not None and arguments["input_params"] is not None else None

    def unless_identity_follows(self, tail, x):
        """``x`` quantized at the first tag of ``tail``, or as it is where
        every op of ``tail`` is an identity (see ``IDENTITY_TAIL``)."""
        def identity(weight, value):
            return ops.all(ops.equal(fake_quant_constant(getattr(self, weight)), value))

        tag = tail[0][0]
        quantized = self.quantizer(tag)(x, **(self.kernel_arithmetic(tag) or {}))
        if _exporting():  # the converter sees the weights as constants: decide while tracing
            import tensorflow as tf

            with tf.init_scope():
                return x if all(bool(identity(w, v)) for _, w, v in tail) else quantized
        folded = identity(*tail[0][1:])
        for _, weight, value in tail[1:]:
            folded = ops.logical_and(folded, identity(weight, value))
        return ops.where(folded, x, quantized)

    def quantizer(self, tag: str):
        return getattr(self, self.quantizer_name(tag, self.site))

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "sites": self.sites}


def unquantized(tag: str, x):
    """The ``quantize_point`` of a float layer, for a layer's exact path."""
    return x


def with_gradient_of(exact, quantized):
    """``quantized`` forward, the gradient of ``exact`` backward: a
    straight-through estimator over a whole chain of ops, for layers whose
    rounded chain has gradients that explode (an RSQRT or EXP evaluated at
    rounded, near-zero operands)."""
    return exact + ops.stop_gradient(quantized - exact)


def fake_quant_constant(value):
    """Per-tensor int8 over the value's own range (with zero), as the
    converter quantizes a constant operand; straight-through gradient."""
    return _fake_quant(value, *constant_range(value))


def constant_range(value):
    return value_range(ops.stop_gradient(value), ops.stop_gradient(value))


def constant_params(value):
    """[scale, zero point] of a constant operand (see :func:`fake_quant_constant`)."""
    return ops.stack(quantization_params(*constant_range(value)))


def value_range(minima, maxima, symmetric: bool = False):
    """The int8 range [lo, hi] of values whose minima and maxima are given:
    zero included, at least MIN_RANGE_WIDTH wide; ``symmetric``: around
    zero point 0 ([-128, 127] steps). In float32, as the fake-quant op
    reads it; numpy where the values are known now."""
    minima, maxima = _value_now(minima), _value_now(maxima)
    xp, f32 = _array_module(minima, maxima), np.float32
    lo = xp.minimum(xp.min(minima), f32(0.0))
    hi = xp.maximum(xp.maximum(xp.max(maxima), f32(0.0)), lo + f32(MIN_RANGE_WIDTH))
    if symmetric:
        hi = xp.maximum(hi, -lo * f32(127.0 / 128.0))
        lo = -hi * f32(128.0 / 127.0)
    return lo, hi


@keras.saving.register_keras_serializable(package=PACKAGE)
class ConstantQuantizer(keras.layers.Layer):
    """A constant of the graph (computed from weights only) where it meets
    the image's tensors: per-tensor int8 over its own range, as the converter
    quantizes the constant it folds it into."""

    def call(self, x):
        return fake_quant_constant(x)

    def compute_output_shape(self, input_shape):
        return input_shape


def own_weights(layer) -> list:
    """``layer``'s weights without those of its quantizers."""
    quantizer_weights = {id(w) for sub in layer._flatten_layers() if isinstance(sub, ActivationQuantizer)
                         for w in sub.weights}
    return [w for w in layer.weights if id(w) not in quantizer_weights]


def copy_weights(source: list, target: list, name: str) -> None:
    if [tuple(w.shape) for w in source] != [tuple(w.shape) for w in target]:
        raise EdgevitError(f"The quantization-aware form of layer {name!r} does not hold its weights.")
    for src, dst in zip(source, target):
        dst.assign(src)


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
    def from_float(cls, layer, momentum: float, sites: int):
        return cls(activation_name(layer.get_config()["activation"]), momentum=momentum, sites=sites,
                   name=layer.name)

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

    @property
    def MEANS(self):  # noqa: N802  (the class attribute of the other quantized layers)
        return {"mean": (0, self.axes), "variance": ("square", self.axes)}
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
    DENSE_INPUTS = {"qkv": 0, "proj": "gated"}
    DENSE_OUTPUTS = {"qkv": "qkv", "values": "qkv"}
    PRODUCTS = {"weighted_keys": ("qkv", "softmax"), "gated": ("values", "context")}
    MEANS = {"context_mean": ("weighted_keys", (1,))}
    OUTPUT_DENSE = "proj"

    def project(self, x, start, stop):
        return self.qkv.channels(x, start, stop)

    def dense_output(self, tag):
        # query | keys, then the values: two FULLY_CONNECTED ops from one kernel
        channels = (0, 1 + self.dim) if tag == "qkv" else (1 + self.dim, 1 + 2 * self.dim)
        return self.accumulator_of("qkv", *channels)


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantHeadAttention(QuantizedPoints, HeadAttention):
    TAGS = ("query_scaled", "scores", "softmax")
    FIXED = {"softmax": UNIT_RANGE}
    MATMULS = {"scores": ("query_scaled", 1)}
    OUTPUT_MATMUL = ("softmax", 2)
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL", "softmax": "SOFTMAX"}


@keras.saving.register_keras_serializable(package=PACKAGE)
class QuantGatedPositionalSelfAttention(QuantizedPoints, GatedPositionalSelfAttention):
    dense_class = QuantDense
    TAGS = ("qk", "query_scaled", "scores", "softmax", "v", "content_context", "position_context",
            "content_gated", "position_gated", "mixed")
    FIXED = {"softmax": UNIT_RANGE}
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
    DENSE_INPUTS = {"qkv": 0, "proj": "context", "reatten_matrix": "softmax"}
    DENSE_OUTPUTS = {"qkv": "qkv"}
    OUTPUT_DENSE = "proj"
    FLOAT_WHEN_MIXED = {"scores": "BATCH_MATMUL"}  # the softmax feeds the head-mixing FULLY_CONNECTED

    @property
    def MATMULS(self):  # noqa: N802  (the class attribute of the other quantized layers)
        return {"scores": ("query_scaled", "qkv"),
                "context": ("mixed_scaled" if self.apply_transform else "softmax", "qkv")}

    @classmethod
    def from_float(cls, layer, momentum: float, sites: int):
        new = cls.from_config({**layer.get_config(), "momentum": momentum, "sites": sites})
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
        return _traced_constant(self, "position_bias", super().position_bias)

    def quantize_point(self, tag: str, x):
        if tag not in self.ON_BIASED_GRID or self.constant or _float_while_exporting("SOFTMAX"):
            return super().quantize_point(tag, x)
        biased = self.quantizer("biased")
        if biased.observing:
            return x
        lo, hi = biased.quantization_range()
        if tag == "masked":
            lo, hi = masked_scores_range(lo, hi, self.tokens)
        return _fake_quant(x, lo, hi)


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
        return _traced_constant(self, "query_scale", super().query_scale)

    def project(self, x):
        kernel = round_kernel_to_grid(self.qkv.kernel)
        return self.qkv.accumulate(ops.matmul, x, kernel, kernel_bound(kernel, -1), None,
                                   self.projection_bias() if self.qkv_bias else None)


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
