"""The fake-quant ops the TFLite converter reads int8 ranges from.

Every tensor that becomes an int8 tensor of the file passes through a TF
fake-quant op (``keras.quantizers.fake_quant_with_min_max_vars``, or the op
it calls where the range is already known, see :func:`fake_quant`), whose
range the converter takes as the tensor's scale and zero point. So the Keras
model computes in training what the int8 file computes on the phone.

At inference the quantizers also round as LiteRT's int8 kernels do (see
:mod:`edgevit.quantize.kernel_arithmetic`): the QAT model and the int8 file
agree value for value. A training step leaves that out, as calibration does
(:func:`~edgevit.quantize.export_trace.kernel_arithmetic_applies`): it has no
gradient, and it was most of the graph a training step traced (the step of
mobilevit_v3_xxs at 128 px: 83 k graph nodes and 108 s of tracing with it,
40 s without).

- Activations: :class:`ActivationQuantizer`, one per-tensor range tracked by
  a moving average of batch min/max (a running mean over the first batches;
  a batch with a non-finite value is left out), or a fixed range where TFLite fixes it
  (LOGISTIC and SOFTMAX outputs: scale 1/256, zero point -128).
- Conv and depthwise-conv kernels: per-output-channel symmetric ranges
  (narrow range, [-127, 127]) through the per-channel fake-quant op
  (:func:`fake_quant_kernel`).
- Dense kernels: the same per-output-channel symmetric grid, but rounded with
  plain ops (straight-through gradient, :func:`round_kernel_to_grid`). A
  per-channel fake-quant op on a Dense kernel does not convert (the
  FULLY_CONNECTED weight is the transposed kernel: "'tfl.transpose' op has
  mismatched quantized axes"); the converter quantizes a kernel that already
  lies on that grid to exactly that grid.
- Constant operands: per-tensor int8 over their own range
  (:func:`fake_quant_constant`, :class:`ConstantQuantizer`), as the
  converter quantizes a constant it folds.
"""
from __future__ import annotations

import keras
import numpy as np
from keras import ops

from edgevit.quantize.export_trace import (is_exporting, kernel_arithmetic_applies, traced_constant,
                                           traced_weight_constant, without_fake_quant)
from edgevit.quantize.int8_ranges import (PARAMS_SIZE, array_module, constant_range, quantization_params,
                                          value_now, value_range)
from edgevit.quantize.kernel_arithmetic import (accumulator_requantized, arm64_softmax_requantized,
                                                batch_matmul_requantized, input_quantized, mean_requantized,
                                                product_requantized, sum_requantized, target_kernels)

# Saved .keras files name every QAT layer class "edgevit.qat>ClassName", and
# loading finds the class by that name alone: keep it.
PACKAGE = "edgevit.qat"
DEFAULT_MOMENTUM = 0.99


def fake_quant(x, lo, hi, **kwargs):
    """int8 fake quantization of ``x`` over [lo, hi] (``kwargs``: per channel,
    narrow range), the op the converter reads the range from; ``x`` itself
    while a float file of a QAT model is traced."""
    if without_fake_quant():
        return x
    if not kwargs and len(np.shape(lo)) == 0 and keras.backend.standardize_dtype(x.dtype) == "float32":  # per tensor
        import tensorflow as tf

        if array_module(lo, hi) is np:  # a range known now
            if is_exporting():  # the converter reads the range from the op's attributes: one graph node
                return tf.quantization.fake_quant_with_min_max_args(x, min=float(lo), max=float(hi), num_bits=8)
            # (The attribute op rounds about 3 values in 10^6 the other way:
            # training in a graph, which reads the range from variables,
            # would then differ.)
            lo, hi = np.float32(lo), np.float32(hi)
        # the op keras calls, without its reshapes and casts
        return tf.quantization.fake_quant_with_min_max_vars(x, lo, hi, num_bits=8)
    return keras.quantizers.fake_quant_with_min_max_vars(x, lo, hi, num_bits=8, **kwargs)


def fake_quant_constant(value):
    """Per-tensor int8 over the value's own range (with zero), as the
    converter quantizes a constant operand; straight-through gradient."""
    return fake_quant(value, *constant_range(value))


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

    _observing = False
    _observed = None  # (batches seen, range min, range max) while observing eagerly
    _assignments = 0  # range updates traced so far (see traced_constant)

    def __init__(self, momentum: float = DEFAULT_MOMENTUM, fixed_range=None, slots: int = 1,
                 symmetric: bool = False, model_input: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.model_input = bool(model_input)
        self.momentum = float(momentum)
        self.fixed_range = None if fixed_range is None else (float(fixed_range[0]), float(fixed_range[1]))
        self.slots = int(slots)
        self.symmetric = bool(symmetric)
        if self.fixed_range is None:
            # every replica computes the same range from the global batch (_global_range): the first one's is kept
            self.range_min = self.add_weight(name="range_min", shape=(self.slots,), initializer="zeros",
                                             trainable=False, aggregation="only_first_replica")
            self.range_max = self.add_weight(name="range_max", shape=(self.slots,), initializer="zeros",
                                             trainable=False, aggregation="only_first_replica")
            self.batches_seen = self.add_weight(name="batches_seen", shape=(self.slots,), initializer="zeros",
                                                trainable=False, aggregation="only_first_replica")
        self.built = True

    def build(self, input_shape):
        self.built = True

    def call(self, x, training=None, slot: int = 0, lhs=None, rhs=None, with_params: bool = False,
             input_params=None, kernel_scales=None, factor_params=None, square_params=None, addends=None,
             addend_params=None, summands=None, summand_params=None, axes=None, logits=None, logit_params=None):
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
        :func:`mean_requantized`). ``logits``, ``logit_params``: the
        input of the int8 SOFTMAX that writes ``x`` and its [scale, zero
        point]: targeting Arm64 kernels, ``x`` is rounded as their SOFTMAX
        does (see :func:`arm64_softmax_requantized`); x86's rounds the float
        softmax as the fake-quant does. ``with_params``: also return
        [scale, zero point], for the layers that read ``x`` (their int32
        bias, their BATCH_MATMUL)."""
        if self.fixed_range is None and (training or self.observing):
            self._track(x, slot)
        exact_arithmetic = kernel_arithmetic_applies(training)
        if self.observing:
            quantized = x
        else:
            lo, hi = self.quantization_range()
            quantized = fake_quant(x, lo, hi)
            exact = self._as_kernel_writes(
                x, lhs=lhs, rhs=rhs, input_params=input_params, kernel_scales=kernel_scales,
                factor_params=factor_params, square_params=square_params, addends=addends,
                addend_params=addend_params, summands=summands, summand_params=summand_params,
                axes=axes, logits=logits, logit_params=logit_params) if exact_arithmetic else None
            if exact is not None:
                quantized = quantized + ops.stop_gradient(exact - quantized)
        if not with_params:
            return quantized
        # only the kernel arithmetic reads them: elsewhere a placeholder saves ~20 graph nodes a tensor
        return quantized, self.params() if exact_arithmetic else ops.zeros((PARAMS_SIZE,))

    def _as_kernel_writes(self, x, lhs, rhs, input_params, kernel_scales, factor_params, square_params, addends,
                          addend_params, summands, summand_params, axes, logits, logit_params):
        """What LiteRT's kernel that writes ``x`` writes (see :meth:`call`), or None without one."""
        grid = self.grid()
        if lhs is not None:
            return batch_matmul_requantized(x, lhs, rhs, grid)
        if input_params is not None:
            return accumulator_requantized(x, input_params, kernel_scales, grid)
        if factor_params is not None:
            return product_requantized(x, factor_params, grid)
        if square_params is not None:
            return product_requantized(x, [square_params, square_params], grid, square=True)
        if addends is not None:
            return sum_requantized(addends, addend_params, grid)
        if summands is not None:
            return mean_requantized(summands, summand_params, axes, grid)
        if logits is not None:
            return arm64_softmax_requantized(logits, logit_params, grid) if target_kernels() == "arm64" else None
        if self.model_input:
            return input_quantized(x, grid)
        return None

    def quantization_range(self):
        if self.fixed_range is not None:
            return self.fixed_range
        return traced_constant(self, f"range{self._assignments}", self._tracked_range)

    def _tracked_range(self):
        _, range_min, range_max = self._observed or self._state_variables()
        return value_range(value_now(range_min), value_now(range_max), self.symmetric)

    def params(self):
        """[scale, zero point, scale residual] of the int8 tensor (see :func:`quantization_params`)."""
        return traced_constant(self, f"params{self._assignments}", lambda: ops.stack(self._quantization_params()))

    def grid(self):
        """(scale, zero point) of the int8 tensor."""
        return self._quantization_params()[:2]

    def _quantization_params(self):
        return traced_constant(self, f"quantization{self._assignments}",
                               lambda: quantization_params(*self.quantization_range()))

    def _track(self, x, slot: int):
        self._assignments += 1  # the range read after this is another value of the graph
        # eagerly in numpy: the same float32 arithmetic at a fraction of the eager ops' cost
        x = value_now(x)
        xp = array_module(x)
        if xp is np:
            x = x.astype(np.float32, copy=False)
        else:
            float32 = keras.backend.standardize_dtype(x.dtype) == "float32"
            x = ops.stop_gradient(x if float32 else ops.cast(x, "float32"))
        batch_min, batch_max = xp.min(x), xp.max(x)
        if xp is not np:
            batch_min, batch_max = _global_range(x, batch_min, batch_max)
        # a batch with a non-finite value (NaN spreads to both) leaves the range as it was
        counted = xp.logical_and(xp.isfinite(batch_min), xp.isfinite(batch_max))
        if self.slots > 1:
            counted = xp.logical_and(counted, np.arange(self.slots) == slot)
        state = _moving_range(xp, self._observed or [_read(v) for v in self._state_variables()], batch_min,
                              batch_max, counted, self.momentum)
        if self.observing and xp is np:  # calibration keeps the state here; unsetting observing stores it
            self._observed = state
            return
        for variable, value in zip(self._state_variables(), state):
            variable.assign(value)

    def _state_variables(self):
        return self.batches_seen, self.range_min, self.range_max

    @property
    def observing(self) -> bool:
        """Set by :func:`edgevit.quantize.qat.calibrate` while it observes
        ranges; unset, the quantizer stores what it observed."""
        return self._observing

    @observing.setter
    def observing(self, value: bool):
        self._observing = bool(value)
        if not value and self._observed is not None:
            for variable, state in zip(self._state_variables(), self._observed):
                variable.assign(state)
            self._observed = None

    def compute_output_spec(self, x, with_params: bool = False, **kwargs):
        spec = keras.KerasTensor(x.shape, x.dtype)
        return (spec, keras.KerasTensor((PARAMS_SIZE,), "float32")) if with_params else spec

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum, "slots": self.slots,
                "fixed_range": None if self.fixed_range is None else list(self.fixed_range),
                "symmetric": self.symmetric, "model_input": self.model_input}


def _global_range(x, batch_min, batch_max):
    """The min and max of the global batch where a step runs on several
    replicas (each sees its share of the batch), so that the ranges do not
    depend on the number of replicas; NaN where a replica saw a non-finite
    value, or no replica saw any."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return batch_min, batch_max
    seen = tf.size(x) > 0  # a replica whose every image was unreadable has none
    local = tf.stack([tf.where(seen, batch_min, 0.0), tf.where(seen, batch_max, 0.0), tf.cast(seen, tf.float32)])
    gathered = context.all_gather(local[None], axis=0)
    minima, maxima, present = gathered[:, 0], gathered[:, 1], gathered[:, 2] > 0
    finite = tf.logical_or(tf.logical_not(present), tf.math.is_finite(minima) & tf.math.is_finite(maxima))
    usable = tf.reduce_all(finite) & tf.reduce_any(present)
    nan = tf.constant(np.nan, tf.float32)
    return (tf.where(usable, tf.reduce_min(tf.where(present, minima, np.inf)), nan),
            tf.where(usable, tf.reduce_max(tf.where(present, maxima, -np.inf)), nan))


def _moving_range(xp, state, batch_min, batch_max, counted, momentum: float):
    """(batches seen, range min, range max) after a batch with ``batch_min``,
    ``batch_max``, where ``counted``: a running mean of the batches' ranges,
    then an exponential moving average at ``momentum``."""
    f32 = np.float32
    seen, range_min, range_max = state
    rate = xp.minimum(f32(momentum), seen / (seen + f32(1.0)))
    return (seen + (ops.cast(counted, "float32") if xp is ops else counted),
            xp.where(counted, rate * range_min + (f32(1.0) - rate) * batch_min, range_min),
            xp.where(counted, rate * range_max + (f32(1.0) - rate) * batch_max, range_max))


def _read(variable):
    """A variable's value, read once: numpy eagerly, else one graph read."""
    import tensorflow as tf

    value = value_now(variable)
    return value if isinstance(value, np.ndarray) else tf.convert_to_tensor(variable.value)


def kernel_bound(kernel, channel_axis: int):
    """The per-output-channel max |kernel|: the narrow int8 range of each channel is [-bound, bound]."""
    axes = [a for a in range(len(kernel.shape)) if a != channel_axis % len(kernel.shape)]
    return traced_weight_constant(kernel, f"bound{channel_axis}",
                      lambda: ops.stop_gradient(ops.maximum(ops.max(ops.abs(kernel), axis=axes), 1e-8)))


def fake_quant_kernel(kernel, channel_axis: int):
    """Per-output-channel symmetric int8 (narrow range) fake quantization."""
    bound = kernel_bound(kernel, channel_axis)
    return fake_quant(kernel, -bound, bound, narrow_range=True, axis=channel_axis)


def round_kernel_to_grid(kernel, reduced_axes=None):
    """The per-output-channel symmetric int8 grid (channels: every axis but
    ``reduced_axes``, by default the last axis of a Dense kernel), with a
    straight-through gradient (see the module docstring). While exporting,
    a constant: the converter derives the FULLY_CONNECTED weight scales of a
    constant as :func:`weight_scales` of its :func:`kernel_bound`, but of a
    slice computed in the graph an ulp or two lower now and then."""
    if without_fake_quant():
        return kernel
    axes = list(range(len(kernel.shape) - 1)) if reduced_axes is None else list(reduced_axes)

    def on_grid():
        scale = ops.stop_gradient(ops.maximum(ops.max(ops.abs(kernel), axis=axes, keepdims=True), 1e-8)) / 127.0
        rounded = ops.clip(ops.round(kernel / scale), -127.0, 127.0) * scale
        return kernel + ops.stop_gradient(rounded - kernel)

    return traced_weight_constant(kernel, f"grid{axes}", on_grid)


@keras.saving.register_keras_serializable(package=PACKAGE)
class ConstantQuantizer(keras.layers.Layer):
    """A constant of the graph (computed from weights only) where it meets
    the image's tensors: per-tensor int8 over its own range, as the converter
    quantizes the constant it folds it into."""

    def call(self, x):
        return fake_quant_constant(x)

    def compute_output_shape(self, input_shape):
        return input_shape
