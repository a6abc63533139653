"""Attention over separately projected queries, keys and values, in tensors
of rank <= 4 (heads split with one rank-4 transpose, no einsum).

The families whose queries and keys differ in length or origin use it:
CvT (keys/values from a strided conv), CrossViT (one class-token query
against the other branch's tokens), ConViT (gated positional attention),
DeepViT (head mixing between softmax and the value product).
"""
from __future__ import annotations

import keras
from keras import ops

from edgevit.layers.quantize_points import QuantizePoints


def split_heads(x, num_heads: int):
    """``[B, N, C]`` -> ``[B, heads, N, C / heads]``."""
    tokens, channels = x.shape[1], x.shape[2]
    x = ops.reshape(x, (-1, tokens, num_heads, channels // num_heads))
    return ops.transpose(x, (0, 2, 1, 3))


def split_heads_transposed(x, num_heads: int):
    """``[B, N, C]`` -> ``[B, heads, C / heads, N]``: keys ready for ``q @ k^T``
    without a transpose inside the matmul, which the converter would turn
    into BATCH_MATMUL's adj_y flag (ignored by the classic GPU delegate)."""
    tokens, channels = x.shape[1], x.shape[2]
    x = ops.reshape(x, (-1, tokens, num_heads, channels // num_heads))
    return ops.transpose(x, (0, 2, 3, 1))


def merge_heads(x):
    """``[B, heads, N, d]`` -> ``[B, N, heads * d]``."""
    heads, tokens, head_dim = x.shape[1], x.shape[2], x.shape[3]
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (-1, tokens, heads * head_dim))


def attention_scores(q, keys_t, scale: float, layer):
    """Softmax(q k^T * scale) of ``[B, heads, Nq, d]`` queries and
    ``[B, heads, d, Nk]`` keys (:func:`split_heads_transposed`), with the
    calling ``layer``'s quantize points and matmul."""
    mark = layer.quantize_point
    scores = mark("scores", layer.matmul("scores", mark("query_scaled", q * scale), keys_t))
    return layer.softmax_point("softmax", scores)


@keras.saving.register_keras_serializable(package="edgevit")
class HeadAttention(QuantizePoints, keras.layers.Layer):
    """Multi-head attention of projected ``[q, k, v]`` token tensors
    (``[B, Nq, C]``, ``[B, Nk, C]``, ``[B, Nk, C]``) -> ``[B, Nq, C]``;
    no weights of its own. ``scale`` defaults to head_dim ** -0.5."""

    def __init__(self, num_heads: int, scale: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.scale = num_heads, scale

    def call(self, inputs):
        q, k, v = inputs
        scale = self.scale if self.scale is not None else (q.shape[-1] // self.num_heads) ** -0.5
        scores = attention_scores(split_heads(q, self.num_heads), split_heads_transposed(k, self.num_heads), scale,
                                  self)
        return merge_heads(self.matmul(None, scores, split_heads(v, self.num_heads)))

    def compute_output_shape(self, input_shapes):
        return tuple(input_shapes[0])

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads, "scale": self.scale}
