"""ConViT (d'Ascoli et al., 2021): a DeiT whose first ten blocks use gated
positional self-attention (GPSA) on the patch tokens; the class token joins
before the last two (standard self-attention) blocks.

GPSA mixes, per head, content attention softmax(q k^T) with positional
attention softmax(r W + b), where r holds the relative offsets (dx, dy,
dx^2 + dy^2) between patches, through a learned gate sigma(g):
``(1 - sigma(g)) * content + sigma(g) * position``. The positional term does
not depend on the image, so the converter folds it into a constant; it is
applied to the values separately from the content attention (int8: see
``call``). Its
"locality" initialisation makes head h attend around its own offset (and
``v`` the identity), so GPSA starts as a convolution. (timm also divides
by the row sums, which are 1 for this convex mix of two softmaxes.)

Names follow timm's ``convit_*`` modules (``blocks.0.attn.qk``,
``blocks.0.attn.pos_proj``, ``blocks.0.attn.gating_param``).
"""
from __future__ import annotations

import keras
import numpy as np
from keras import layers, ops

from edgevit.layers import (PositionEmbedding, PrefixTokens, drop_path_rates, patch_embed,
                            transformer_encoder)
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.mha import attention_scores, merge_heads, split_heads, split_heads_transposed
from edgevit.layers.quantize_points import QuantizePoints, softmax
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, class_token_head, image_input
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

REFERENCE_CONVIT = "https://github.com/facebookresearch/convit (timm convit.py)"
PREPROCESS_CONVIT = Preprocessing(224, 256, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
LN_EPS, PATCH_SIZE, DEPTH, LOCAL_BLOCKS, HEAD_DIM = 1e-6, 16, 12, 10, 48


def relative_indices(grid: int) -> np.ndarray:
    """``[N, N, 3]`` (dx, dy, dx^2 + dy^2) between the patches of a
    ``grid x grid`` map, row-major."""
    coords = np.stack(np.meshgrid(np.arange(grid), np.arange(grid), indexing="ij"), -1).reshape(-1, 2)
    dy = coords[None, :, 0] - coords[:, None, 0]
    dx = coords[None, :, 1] - coords[:, None, 1]
    return np.stack([dx, dy, dx ** 2 + dy ** 2], -1).astype("float32")


@keras.saving.register_keras_serializable(package="edgevit")
class GatedPositionalSelfAttention(QuantizePoints, keras.layers.Layer):
    # pos_proj stays a float Dense under QAT: it acts on constant offsets, so
    # the converter folds it into the (then quantized) positional scores.
    def __init__(self, dim: int, num_heads: int, locality_strength: float = 1.0, qkv_bias: bool = False,
                 **kwargs):
        super().__init__(**kwargs)
        self.dim, self.num_heads = dim, num_heads
        self.locality_strength, self.qkv_bias = locality_strength, qkv_bias
        self.qk = self.dense_class(2 * dim, use_bias=qkv_bias, kernel_initializer=DENSE_INIT, name="qk")
        self.v = self.dense_class(dim, use_bias=qkv_bias, kernel_initializer=DENSE_INIT, name="v")
        self.proj = self.dense_class(dim, kernel_initializer=DENSE_INIT, name="proj")
        self.pos_proj = layers.Dense(num_heads, kernel_initializer=DENSE_INIT, name="pos_proj")

    def build(self, input_shape):
        self.qk.build(input_shape)
        self.v.build(input_shape)
        self.proj.build((*input_shape[:-1], self.dim))
        self.pos_proj.build((None, 3))
        self.gating_param = self.add_weight(name="gating_param", shape=(self.num_heads,), initializer="ones")
        self._locality_init()

    def _locality_init(self):
        """v = identity; head (h1, h2) of a k x k layout peaks at offset
        (h1 - c, h2 - c) with width set by ``locality_strength``."""
        self.v.kernel.assign(np.eye(self.dim, dtype="float32"))
        kernel = np.array(self.pos_proj.kernel.numpy())  # [3, heads] = torch weight.T
        size = int(self.num_heads ** 0.5)
        center = (size - 1) / 2 if size % 2 == 0 else size // 2
        for h1 in range(size):
            for h2 in range(size):
                position = h1 + size * h2
                kernel[:, position] = [2 * (h2 - center), 2 * (h1 - center), -1]
        self.pos_proj.kernel.assign(kernel * self.locality_strength)

    def call(self, x):
        mark = self.quantize_point
        tokens = x.shape[1]
        grid = int(round(tokens ** 0.5))
        q, k = ops.split(mark("qk", self.qk(x)), 2, axis=-1)
        content = attention_scores(split_heads(q, self.num_heads), split_heads_transposed(k, self.num_heads),
                                   (self.dim // self.num_heads) ** -0.5, self)
        rel = ops.convert_to_tensor(relative_indices(grid).reshape(1, tokens * tokens, 3))
        position = ops.reshape(self.pos_proj(rel), (1, tokens, tokens, self.num_heads))
        # image-independent, so the converter folds it into a constant operand
        position = mark("position", softmax(ops.transpose(position, (0, 3, 1, 2))))
        gate = ops.reshape(ops.sigmoid(self.gating_param), (1, self.num_heads, 1, 1))
        # (1 - g) content + g position, applied to v term by term: the mixed
        # map would hold the peaked positional weights (~1) and the diffuse
        # content weights (~1/N) in one int8 scale, which rounds the content
        # part away (measured: logits cosine 0.92 at 224); each product is a
        # weighted mean of v, so the two terms share a scale without loss.
        values = mark("v", self.v(x))
        v = split_heads(values, self.num_heads)
        content = mark("content_context", self.matmul("content_context", content, v))
        content = mark("content_gated", ops.multiply(content, mark("content_gate", 1.0 - gate)))
        position = mark("position_context", self.positional_context(position, values))
        position = mark("position_gated", ops.multiply(position, mark("position_gate", gate)))
        return self.proj(merge_heads(mark("mixed", ops.add(content, position))))

    def positional_context(self, position, values):
        """``position @ v`` per head, ``[B, heads, N, d]``, written as
        ``(v^T position^T)^T`` with one matmul per head: the positional scores
        are a constant, and LiteRT's GPU runs no matmul whose first operand is
        a constant ("non-constant tensor"); the GPU delegates take a constant
        operand only as the second one, 2-D (here: FULLY_CONNECTED weights)."""
        import tensorflow as tf

        tokens, head_dim = values.shape[1], self.dim // self.num_heads
        values_t = ops.transpose(ops.reshape(values, (-1, tokens, self.num_heads, head_dim)), (0, 2, 3, 1))
        # rank 3 x rank 2: TensorFlow's CPU matmul broadcasting a rank-4
        # batch against a rank-2 operand returns garbage
        heads = [ops.reshape(tf.linalg.matmul(ops.reshape(v_t, (-1, head_dim, tokens)), ops.transpose(position[0, h])),
                             (-1, 1, head_dim, tokens))
                 for h, v_t in enumerate(ops.split(values_t, self.num_heads, axis=1))]
        return ops.transpose(ops.concatenate(heads, axis=1), (0, 1, 3, 2))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "num_heads": self.num_heads,
                "locality_strength": self.locality_strength, "qkv_bias": self.qkv_bias}


def build_convit(name: str, num_heads: int, num_classes: int, input_size: int, *,
                 drop_path_rate: float = 0.0) -> keras.Model:
    dim = HEAD_DIM * num_heads
    inputs = image_input(input_size)
    grid = input_size // PATCH_SIZE
    x = patch_embed(inputs, dim, PATCH_SIZE)
    x = PositionEmbedding((grid, grid), num_prefix=0, name="pos_embed")(x)
    rates = drop_path_rates(drop_path_rate, DEPTH)
    for i in range(LOCAL_BLOCKS):
        attn = GatedPositionalSelfAttention(dim, num_heads, name=f"blocks.{i}.attn")
        x = transformer_encoder(x, dim, 4 * dim, num_heads, activation="gelu", epsilon=LN_EPS,
                                drop_path=rates[i], attention=attn, name=f"blocks.{i}")
    # the class token joins here, as a tensor of its own (int8 scale of its own)
    groups = [PrefixTokens(["cls_token"], [0.02], concat=False, name="cls_token")(x), x]
    for i in range(LOCAL_BLOCKS, DEPTH):
        groups = transformer_encoder(groups, dim, 4 * dim, num_heads, activation="gelu", epsilon=LN_EPS,
                                     qkv_bias=False, drop_path=rates[i], name=f"blocks.{i}")
    _, logits = class_token_head(groups[0], num_classes, epsilon=LN_EPS)
    return keras.Model(inputs, logits, name=name)


# Official ImageNet weights (``weights="imagenet"``): Facebook's, as timm
# hosts them; top-1 from timm.
PRETRAINED = {
    "convit_tiny": timm_weights("convit_tiny.fb_in1k", 73.140, "Apache-2.0"),
    "convit_small": timm_weights("convit_small.fb_in1k", 81.412, "Apache-2.0"),
    "convit_base": timm_weights("convit_base.fb_in1k", 82.296, "Apache-2.0"),
}

_CONVIT = dict(family="convit", default_input_size=224, preprocessing=PREPROCESS_CONVIT,
               input_size_multiple=PATCH_SIZE, reference=REFERENCE_CONVIT, checkpoint_formats=("timm",),
               options=builder_options(build_convit),
               pretrained=PRETRAINED)


@register_model(**_CONVIT)
def convit_tiny(num_classes: int = 1000, input_size: int = 224, **options):
    return build_convit("convit_tiny", 4, num_classes, input_size, **options)


@register_model(**_CONVIT)
def convit_small(num_classes: int = 1000, input_size: int = 224, **options):
    return build_convit("convit_small", 9, num_classes, input_size, **options)


@register_model(**_CONVIT)
def convit_base(num_classes: int = 1000, input_size: int = 224, **options):
    return build_convit("convit_base", 16, num_classes, input_size, **options)
