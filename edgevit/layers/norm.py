"""Layer normalisation written for integer kernels.

Keras' LayerNormalization converts with a NEG and a SQUARED_DIFFERENCE that
stay float (or run 13x slower) under int8; GroupNormalization(groups=1) leaves
a float SQUARE and rank-5 tensors. This version uses only MEAN, SUB, MUL, ADD
and one RSQRT per token, all of which have int8 kernels.

A mean over positions and channels together (GroupNorm) is two MEANs, over
the positions per channel, then over the channels: XNNPACK's int8 MEAN over
the last axis sums in 16-bit lanes on x86 CPUs without AVX-512 and, in
LiteRT 2.3, overflows past 4096 to 8192 elements (a MobileViT v2 GroupNorm
over a 12x12x64 map wrote 127 for a variance near 0 on AVX2 kernels, the
right value on AVX-512 and Arm64), while a MEAN that keeps the channels
sums in 32 bits on every CPU.
"""
from __future__ import annotations

import keras
from keras import ops

from edgevit.layers.quantize_points import QuantizePoints


@keras.saving.register_keras_serializable(package="edgevit")
class LayerNorm(QuantizePoints, keras.layers.Layer):
    """Normalise over ``axes`` with a per-channel scale and shift.

    ``axes=(-1,)`` is the transformer LayerNorm; ``axes=(1, 2, 3)`` is
    PyTorch's ``GroupNorm(1, C)`` (MobileViT v2's "layer_norm_2d"), which
    normalises every sample over all its positions and channels.
    """

    def __init__(self, axes=(-1,), epsilon: float = 1e-5, per_channel_means: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.axes = tuple(sorted(axes))
        self.epsilon = epsilon
        self.per_channel_means = per_channel_means

    def build(self, input_shape):
        channels = input_shape[-1]
        self.gamma = self.add_weight(name="gamma", shape=(channels,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(channels,), initializer="zeros")

    def call(self, x):
        return self.normalise(x, self.quantize_point)

    def normalise(self, x, q):
        """The LayerNorm with ``q(tag, tensor)`` applied at each op output.

        Every op here becomes one TFLite op and gamma and beta its constant
        operands; ``q`` is :meth:`quantize_point`."""
        centred = q("centred", ops.subtract(x, self.mean(x, q, "mean", "channel_mean")))
        variance = self.mean(q("square", ops.multiply(centred, centred)), q, "variance", "channel_variance")
        inv_std = q("rsqrt", ops.rsqrt(q("variance_eps", ops.add(variance, self.epsilon))))
        normalised = q("normalised", ops.multiply(centred, inv_std))
        scaled = q("scaled", ops.multiply(normalised, q("gamma", self.gamma)))
        return ops.add(scaled, q("beta", self.beta))

    def mean(self, x, q, tag: str, channel_tag: str):
        """The mean of ``x`` over ``axes``, quantized at ``tag``; over
        positions and channels, by way of the per-channel means over the
        positions, quantized at ``channel_tag`` (see the module docstring)."""
        if not self.position_axes:
            return q(tag, ops.mean(x, axis=self.axes, keepdims=True))
        per_channel = q(channel_tag, ops.mean(x, axis=self.position_axes, keepdims=True))
        return q(tag, ops.mean(per_channel, axis=self.axes[-1], keepdims=True))

    @property
    def position_axes(self) -> tuple[int, ...]:
        """The axes before the last of several ``axes`` (the channels'
        last); () for a mean over one axis, or in one MEAN
        (``per_channel_means`` False: QAT models saved before edgevit took
        this way hold no ranges for the per-channel means)."""
        return self.axes[:-1] if self.per_channel_means else ()

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "axes": list(self.axes), "epsilon": self.epsilon,
                "per_channel_means": self.per_channel_means}
