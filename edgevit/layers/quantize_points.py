"""The hooks through which quantization-aware training reaches inside a layer.

A layer whose ``call`` runs several ops that each become an op of their own
in a LiteRT file marks every such op output with ``quantize_point(tag, x)``
and every weight that enters an op as a constant operand (a LayerNorm's
gamma, a position embedding) with ``quantize_point(tag, weight)`` too. Here
both are the identity, so float models are unchanged; the quantization-aware
subclasses in ``edgevit.quantize.multi_op_layers`` fake-quantize at each tag, which is
what an int8 file computes there. Internal projections are built with
``dense_class``, which those subclasses replace by a Dense with an int8
kernel, products of two activations (BATCH_MATMUL) go through
``matmul``, which they compute on the int8 levels, and a softmax (SOFTMAX)
through ``softmax_point``, which they round from its int8 input as the
target's kernel does.
"""
from __future__ import annotations

import warnings

from keras import layers, ops


def softmax(x):
    """Softmax over the last axis. On a one-patch map (tiny inputs) that axis
    has length 1, where Keras warns although 1.0 is the right answer."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return ops.softmax(x, axis=-1)


class QuantizePoints:
    """Mixin for layers with internal ops (see the module docstring)."""

    dense_class = layers.Dense

    def quantize_point(self, tag: str, x):
        return x

    def matmul(self, tag: str | None, a, b):
        """``a @ b`` of two activations, the op output ``tag`` (None: the
        layer's output)."""
        import tensorflow as tf

        return tf.linalg.matmul(a, b)

    def softmax_point(self, tag: str, logits):
        """The softmax over the last axis of ``logits``, the op output ``tag``."""
        return self.quantize_point(tag, softmax(logits))
