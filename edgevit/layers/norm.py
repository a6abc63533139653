"""Layer normalisation written for integer kernels.

Keras' LayerNormalization converts with a NEG and a SQUARED_DIFFERENCE that
stay float (or run 13x slower) under int8; GroupNormalization(groups=1) leaves
a float SQUARE and rank-5 tensors. This version uses only MEAN, SUB, MUL, ADD
and one RSQRT per token, all of which have int8 kernels.
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

    def __init__(self, axes=(-1,), epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        self.axes = tuple(axes)
        self.epsilon = epsilon

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
        centred = q("centred", ops.subtract(x, q("mean", ops.mean(x, axis=self.axes, keepdims=True))))
        variance = q("variance", ops.mean(q("square", ops.multiply(centred, centred)),
                                          axis=self.axes, keepdims=True))
        inv_std = q("rsqrt", ops.rsqrt(q("variance_eps", ops.add(variance, self.epsilon))))
        normalised = q("normalised", ops.multiply(centred, inv_std))
        scaled = q("scaled", ops.multiply(normalised, q("gamma", self.gamma)))
        return ops.add(scaled, q("beta", self.beta))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "axes": list(self.axes), "epsilon": self.epsilon}
