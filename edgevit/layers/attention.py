"""Self-attention in tensors of rank <= 4, with the official weight layouts.

Both layers keep every tensor at rank 4 or less (the qkv head split is a
single rank-4 transpose) and use no einsum, which TFLite cannot convert.
"""
from __future__ import annotations

import math

import keras
from keras import layers, ops

from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.quantize_points import QuantizePoints


def masked_scores_range(lo: float, hi: float, keys: int) -> tuple[float, float]:
    """The int8 range of masked attention scores (a large negative constant
    added to the masked pairs) whose unmasked scores span [lo, hi]: masked
    pairs only need to saturate at the bottom, ``ln(512 * keys)`` below
    ``lo``. Each then weighs less than ``1 / (512 * keys)`` of the row's
    largest score, so together less than half a step of the softmax's int8
    output (1/256); a range reaching down to the mask itself (-100) would
    round the scores to steps of ~0.4."""
    return lo - math.log(512.0 * keys), hi


@keras.saving.register_keras_serializable(package="edgevit")
class MultiHeadSelfAttention(QuantizePoints, keras.layers.Layer):
    """Multi-head self-attention over ``[B, N, C]`` tokens.

    One ``qkv`` projection whose output channels are ordered (q|k|v, head,
    head_dim), as in timm and ml-cvnets, then an output projection.
    """

    def __init__(self, dim: int, num_heads: int, attn_dropout: float = 0.0, qkv_bias: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads = dim, num_heads
        self.attn_dropout, self.qkv_bias = attn_dropout, qkv_bias
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = self.dense_class(3 * dim, use_bias=qkv_bias, kernel_initializer=DENSE_INIT, name="qkv")
        self.proj = self.dense_class(dim, kernel_initializer=DENSE_INIT, name="proj")
        self.dropout = layers.Dropout(attn_dropout)

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.proj.build((*input_shape[:-1], self.dim))

    def call(self, x, training=None):
        mark = self.quantize_point
        tokens = x.shape[1]
        qkv = ops.reshape(mark("qkv", self.qkv(x)), (-1, tokens, 3 * self.num_heads, self.head_dim))
        q, k, v = ops.split(qkv, 3, axis=2)  # [B, N, heads, head_dim]
        q, v = ops.transpose(q, (0, 2, 1, 3)), ops.transpose(v, (0, 2, 1, 3))
        # keys as [B, heads, head_dim, N]: a transpose inside the matmul would
        # become BATCH_MATMUL's adj_y flag, which the classic GPU delegate ignores
        keys_t = ops.transpose(k, (0, 2, 3, 1))
        attn = mark("scores", self.matmul("scores", mark("query_scaled", q * self.scale), keys_t))
        attn = self.dropout(self.softmax_point("softmax", attn), training=training)
        out = ops.transpose(mark("context", self.matmul("context", attn, v)), (0, 2, 1, 3))  # [B, N, heads, head_dim]
        return self.proj(ops.reshape(out, (-1, tokens, self.dim)))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "num_heads": self.num_heads,
                "attn_dropout": self.attn_dropout, "qkv_bias": self.qkv_bias}


@keras.saving.register_keras_serializable(package="edgevit")
class SeparableSelfAttention(QuantizePoints, keras.layers.Layer):
    """MobileViT v2's linear-cost attention over ``[B, N, P, C]`` patches.

    A single query channel scores the N patches (softmax over N, per pixel
    position P); the score-weighted mean of the keys is a context vector that
    gates ReLU(values). ``qkv`` outputs (1 | C | C) channels as in ml-cvnets.
    The weighted sum is written as a MEAN times N: MEAN has a fast int8
    kernel and no activation-by-activation matmul is needed.
    """

    def __init__(self, dim: int, attn_dropout: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.attn_dropout = dim, attn_dropout
        self.qkv = self.dense_class(1 + 2 * dim, kernel_initializer=DENSE_INIT, name="qkv_proj")
        self.proj = self.dense_class(dim, kernel_initializer=DENSE_INIT, name="out_proj")
        self.dropout = layers.Dropout(attn_dropout)

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.proj.build((*input_shape[:-1], self.dim))

    def project(self, x, start: int, stop: int):
        """Output channels [start, stop) of ``qkv``, a FULLY_CONNECTED of
        their own (the converter folds the weight slice into a constant)."""
        return ops.add(ops.matmul(x, self.qkv.kernel[:, start:stop]), self.qkv.bias[start:stop])

    def call(self, x, training=None):
        mark = self.quantize_point
        _, tokens, pixels, _ = x.shape
        # query and keys, then the values with their ReLU fused into their own
        # FULLY_CONNECTED: XNNPACK takes no int8 RELU on its own (each would
        # split the graph), nor the uneven SPLIT_V of one (1 | C | C) output
        query_key = mark("qkv", self.project(x, 0, 1 + self.dim))
        query, key = query_key[..., :1], query_key[..., 1:]
        values = mark("values", ops.relu(self.project(x, 1 + self.dim, 1 + 2 * self.dim)))
        # softmax over the patches, in rank 4: with rank-3 scores the converter
        # folds a one-patch map's transposes into a rank-3 operand of the MUL
        # below, which the GPU cannot multiply with a rank-4 one in int8
        scores = ops.transpose(query, (0, 2, 3, 1))  # [B, P, 1, N]
        scores = ops.transpose(self.softmax_point("softmax", scores), (0, 3, 1, 2))
        scores = self.dropout(scores, training=training)
        weighted = mark("weighted_keys", ops.multiply(key, scores))
        if tokens == 1:  # one patch (a small map): the converter folds the mean and the product by 1 away
            context = weighted
        else:
            context = mark("context", mark("context_mean", ops.mean(weighted, axis=1, keepdims=True)) * float(tokens))
        gated = mark("gated", ops.multiply(values, context))
        return self.proj(gated)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "attn_dropout": self.attn_dropout}
