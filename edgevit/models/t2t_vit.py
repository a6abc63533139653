"""T2T-ViT, Tokens-to-Token ViT (Yuan et al., 2021): a ViT whose patch
embedding is a progressive "tokens-to-token" module.

The image is soft-split into overlapping 7x7 patches at stride 4
(``nn.Unfold``: each patch's 147 values become one token), a small
transformer layer runs over those tokens, they are re-structured into a map
and soft-split again (3x3, stride 2), a second layer runs, and a last 3x3
stride-2 split is projected to the embedding width: a 224 image becomes
14x14 tokens. Then a class token, a fixed sinusoid position table and
standard pre-norm blocks (no qkv bias, LayerNorm eps 1e-5).

The token layers are Performers (``t2t_vit_7`` ... ``_24``: linear
attention through 32 positive random features ``exp(w x - |x|^2 / 2)``) or
single-head transformers (``t2t_vit_t_*``), both with 64 channels and the
values as their residual (the input width differs from the output width).

For TFLite: the soft splits are constant one-hot depthwise convolutions
(:class:`edgevit.layers.soft_split.SoftSplit`, already in ``nn.Unfold``'s
channel order); the last one and its projection are one 3x3 stride-2
convolution; re-structurization is a reshape of the NHWC map; everything
stays at rank <= 4.

Names follow the official repository's modules (``tokens_to_token.attention1.kqv``,
``tokens_to_token.project``, ``blocks.3.attn.qkv``), so its checkpoints import
with plain renames (``edgevit.converters.t2t``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import keras
from keras import layers, ops

from edgevit.layers import (LayerNorm, PositionEmbedding, PrefixTokens, SoftSplit, drop_path_rates, to_map,
                            to_tokens, transformer_encoder)
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.mha import attention_scores, merge_heads, split_heads, split_heads_transposed
from edgevit.layers.quantize_points import QuantizePoints
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, class_token_head, image_input
from edgevit.registry import Preprocessing, builder_options, register_model, url_weights

REFERENCE_T2T = "https://github.com/yitu-opensource/T2T-ViT"
# crop 0.9: bicubic resize of the shorter side to 248, centre crop 224
PREPROCESS_T2T = Preprocessing(224, 248, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
LN_EPS = 1e-5
TOKEN_DIM = 64
# (kernel, stride, padding) of the three soft splits: overall stride 16
SOFT_SPLITS = ((7, 4, 2), (3, 2, 1), (3, 2, 1))
PERFORMER_DROPOUT = 0.1  # the official token performer always trains with it
PERFORMER_EPSILON = 1e-8
KERNEL_RATIO = 0.5


@keras.saving.register_keras_serializable(package="edgevit")
class TokenPerformer(QuantizePoints, keras.layers.Layer):
    """Performer attention over ``[B, T, C]`` tokens, into ``emb`` channels.

    ``kqv`` projects to keys, queries and values (in that order), each of
    ``emb`` channels; keys and queries become positive random features
    ``phi(x) = exp(x w^T - |x|^2 / 2) / sqrt(m)`` over ``m = emb * kernel_ratio``
    fixed orthogonal directions ``w`` (drawn once at initialisation, stored
    in checkpoints); attention is ``phi(q) (phi(k)^T v)`` normalised by
    ``phi(q) . sum_t phi(k_t)`` (+ ``epsilon``); the values are the residual:
    ``v + proj(attention)``.

    The normaliser spans three decades over the tokens of one image with
    weights of a trained scale, and most key features are far below the
    largest: the int8 error of this layer is measured in docs/families.md.
    """

    def __init__(self, emb: int, kernel_ratio: float = KERNEL_RATIO, dropout: float = PERFORMER_DROPOUT,
                 epsilon: float = PERFORMER_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.emb, self.kernel_ratio, self.dropout_rate, self.epsilon = emb, kernel_ratio, dropout, epsilon
        self.features = int(emb * kernel_ratio)
        self.kqv = self.dense_class(3 * emb, kernel_initializer=DENSE_INIT, name="kqv")
        self.proj = self.dense_class(emb, kernel_initializer=DENSE_INIT, name="proj")
        self.dropout = layers.Dropout(dropout)

    def build(self, input_shape):
        self.kqv.build(input_shape)
        self.proj.build((*input_shape[:-1], self.emb))
        # orthogonal rows of norm sqrt(m), as the official code draws them
        self.w = self.add_weight(name="w", shape=(self.features, self.emb), trainable=False,
                                 initializer=keras.initializers.Orthogonal(gain=math.sqrt(self.features)))

    def random_features(self, x, role: str, mark):
        """``sqrt(m) phi(x)`` of keys or queries ``[B, T, emb]`` -> ``[B, T, m]``
        (the squared norm as a mean times its count, for MEAN's int8 kernel).
        The 1 / sqrt(m) of both feature maps cancels in the normalised
        attention but for ``epsilon``, which is scaled by m instead."""
        square_mean = mark(f"{role}_square_mean", ops.mean(mark(f"{role}_square", x * x), axis=-1, keepdims=True))
        half_norm = mark(f"{role}_half_norm", square_mean * (self.emb / 2))
        projected = mark(f"{role}_projected", ops.matmul(x, mark("directions", ops.transpose(self.w))))
        return mark(f"{role}_features", ops.exp(mark(f"{role}_exponent", projected - half_norm)))

    def call(self, x, training=None):
        values, update = self.attend(x, self.quantize_point, self.matmul)
        return values + self.dropout(update, training=training)

    def attend(self, x, mark, matmul):
        """The values and the attention's update to them (before dropout),
        with ``mark(tag, tensor)`` at each op output and ``matmul(tag, a, b)``
        for the products of two activations (see ``QuantizePoints``)."""
        tokens = x.shape[1]
        k, q, v = ops.split(mark("kqv", self.kqv(x)), 3, axis=-1)
        key_features, query_features = self.random_features(k, "key", mark), self.random_features(q, "query", mark)
        key_sum = mark("key_sum", mark("key_mean", ops.mean(key_features, axis=1, keepdims=True)) * tokens)
        weighted = mark("weighted", query_features * key_sum)
        normaliser = mark("normaliser", mark("normaliser_mean", ops.mean(weighted, axis=-1, keepdims=True))
                          * self.features)
        # [m, T] @ [T, emb]: the features' value sums, then each query's mix of
        # them, as one-head attention at rank 4 (split_heads_transposed: a rank-3
        # transpose next to the matmul would become its adj_x flag, which the
        # classic GPU delegate ignores)
        context = mark("context", matmul("context", split_heads_transposed(key_features, 1), split_heads(v, 1)))
        mixed = mark("mixed", merge_heads(matmul("mixed", split_heads(query_features, 1), context)))
        # 1 / (normaliser + eps) as rsqrt squared: an int8 DIV stops the
        # interpreter when its divisor rounds to zero, an int8 RSQRT saturates
        epsilon = self.epsilon * self.features
        inverse_root = mark("inverse_root", ops.rsqrt(mark("normaliser_eps", normaliser + epsilon)))
        attended = mark("attended", mark("mixed_scaled", mixed * inverse_root) * inverse_root)
        return v, mark("proj", self.proj(attended))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.emb)

    def get_config(self):
        return {**super().get_config(), "emb": self.emb, "kernel_ratio": self.kernel_ratio,
                "dropout": self.dropout_rate, "epsilon": self.epsilon}


@keras.saving.register_keras_serializable(package="edgevit")
class TokenAttention(QuantizePoints, keras.layers.Layer):
    """Single-head self-attention over ``[B, T, C]`` tokens into ``emb``
    channels (T2T-ViT_t's token transformer): ``qkv`` without bias, scores
    scaled by ``C ** -0.5`` (the input width, as the official code does),
    the values as the residual: ``v + proj(softmax(q k^T) v)``."""

    def __init__(self, emb: int, **kwargs):
        super().__init__(**kwargs)
        self.emb = emb
        self.qkv = self.dense_class(3 * emb, use_bias=False, kernel_initializer=DENSE_INIT, name="qkv")
        self.proj = self.dense_class(emb, kernel_initializer=DENSE_INIT, name="proj")

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.proj.build((*input_shape[:-1], self.emb))
        self.scale = input_shape[-1] ** -0.5

    def call(self, x):
        q, k, v = ops.split(self.quantize_point("qkv", self.qkv(x)), 3, axis=-1)
        scores = attention_scores(split_heads(q, 1), split_heads_transposed(k, 1), self.scale, self)
        context = self.quantize_point("context", merge_heads(self.matmul("context", scores, split_heads(v, 1))))
        return v + self.quantize_point("proj", self.proj(context))

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.emb)

    def get_config(self):
        return {**super().get_config(), "emb": self.emb}


def token_layer(x, tokens_type: str, name: str):
    """One tokens-to-token layer: ``y = attention(LN(x))`` (the values as
    its residual), then ``y + MLP(LN(y))`` with a hidden width of 64."""
    x = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm1")(x)
    if tokens_type == "performer":
        x = TokenPerformer(TOKEN_DIM, name=name)(x)
        fc1, fc2, dropout = f"{name}.mlp.0", f"{name}.mlp.2", PERFORMER_DROPOUT
    else:
        x = TokenAttention(TOKEN_DIM, name=f"{name}.attn")(x)
        fc1, fc2, dropout = f"{name}.mlp.fc1", f"{name}.mlp.fc2", 0.0
    y = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm2")(x)
    y = layers.Dense(TOKEN_DIM, activation="gelu", kernel_initializer=DENSE_INIT, name=fc1)(y)
    y = layers.Dense(TOKEN_DIM, kernel_initializer=DENSE_INIT, name=fc2)(y)
    y = layers.Dropout(dropout, name=f"{name}.mlp.drop")(y)
    return layers.Add(name=f"{name}.add")([x, y])


def tokens_to_token(x, tokens_type: str, embed_dim: int):
    """Soft split, token layer, re-structurization (tokens back to a map),
    twice; the last soft split and its linear projection as one 3x3 stride-2
    convolution (its kernel is the projection's, ``(c, kh, kw)``-ordered)."""
    for i, (kernel, stride, padding) in enumerate(SOFT_SPLITS[:2]):
        x = SoftSplit(kernel, stride, padding, name=f"tokens_to_token.soft_split{i}")(x)
        grid = tuple(x.shape[1:3])
        x = token_layer(to_tokens(x, f"tokens_to_token.flatten{i}"), tokens_type,
                        name=f"tokens_to_token.attention{i + 1}")
        x = to_map(x, grid, f"tokens_to_token.restructure{i + 1}")
    kernel, stride, padding = SOFT_SPLITS[2]
    x = layers.ZeroPadding2D(padding, name="tokens_to_token.project.pad")(x)
    return layers.Conv2D(embed_dim, kernel, stride, kernel_initializer=DENSE_INIT, name="tokens_to_token.project")(x)


@dataclass(frozen=True)
class T2TConfig:
    tokens_type: str        # "performer" or "transformer"
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float


CONFIGS = {
    "t2t_vit_7": T2TConfig("performer", 256, 7, 4, 2.0),
    "t2t_vit_10": T2TConfig("performer", 256, 10, 4, 2.0),
    "t2t_vit_12": T2TConfig("performer", 256, 12, 4, 2.0),
    "t2t_vit_14": T2TConfig("performer", 384, 14, 6, 3.0),
    "t2t_vit_19": T2TConfig("performer", 448, 19, 7, 3.0),
    "t2t_vit_24": T2TConfig("performer", 512, 24, 8, 3.0),
    "t2t_vit_t_14": T2TConfig("transformer", 384, 14, 6, 3.0),
    "t2t_vit_t_19": T2TConfig("transformer", 448, 19, 7, 3.0),
    "t2t_vit_t_24": T2TConfig("transformer", 512, 24, 8, 3.0),
}


def build_t2t_vit(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    x = tokens_to_token(inputs, cfg.tokens_type, cfg.embed_dim)
    grid = tuple(x.shape[1:3])
    x = to_tokens(x, "tokens_to_token.flatten2")
    # The class token travels as a tensor of its own (int8 scale of its own), as in ViT.
    cls = PrefixTokens(["cls_token"], [0.02], concat=False, name="cls_token")(x)
    # a table saved at another size is resampled as the official loader does (no antialias)
    groups = PositionEmbedding(grid, num_prefix=1, sinusoid=True, antialias=False, name="pos_embed")([cls, x])
    for i, rate in enumerate(drop_path_rates(drop_path_rate, cfg.depth)):
        groups = transformer_encoder(groups, cfg.embed_dim, int(cfg.embed_dim * cfg.mlp_ratio), cfg.num_heads,
                                     activation="gelu", epsilon=LN_EPS, qkv_bias=False, drop_path=rate,
                                     name=f"blocks.{i}")
    _, logits = class_token_head(groups[0], num_classes, epsilon=LN_EPS)
    return keras.Model(inputs, logits, name=name)


# The official release (training checkpoints: the importer reads state_dict_ema, as timm's re-measurement of
# these files did); the file names carry the top-1 the official README reports.
_RELEASE = "https://github.com/yitu-opensource/T2T-ViT/releases/download/main/"
PRETRAINED = {
    name: url_weights(_RELEASE + file, "", top1, "BSD-3-Clause-Clear (Shanghai Yitu)",
                      tag=file.removesuffix(".pth.tar"), naming="official")
    for name, file, top1 in [
        ("t2t_vit_7", "71.7_T2T_ViT_7.pth.tar", 71.7), ("t2t_vit_10", "75.2_T2T_ViT_10.pth.tar", 75.2),
        ("t2t_vit_12", "76.5_T2T_ViT_12.pth.tar", 76.5), ("t2t_vit_14", "81.5_T2T_ViT_14.pth.tar", 81.5),
        ("t2t_vit_19", "81.9_T2T_ViT_19.pth.tar", 81.9), ("t2t_vit_24", "82.3_T2T_ViT_24.pth.tar", 82.3),
        ("t2t_vit_t_14", "81.7_T2T_ViTt_14.pth.tar", 81.7), ("t2t_vit_t_19", "82.4_T2T_ViTt_19.pth.tar", 82.4),
        ("t2t_vit_t_24", "82.6_T2T_ViTt_24.pth.tar", 82.6)]
}

_T2T = dict(family="t2t_vit", default_input_size=224, preprocessing=PREPROCESS_T2T, input_size_multiple=16,
            reference=REFERENCE_T2T, checkpoint_formats=("official",), options=builder_options(build_t2t_vit),
            mixed_float_layers=("tokens_to_token.attention1.norm1", "tokens_to_token.attention1",
                                "tokens_to_token.attention2"), pretrained=PRETRAINED)
_T2T_T = {**_T2T, "mixed_float_layers": ("tokens_to_token.attention1.norm1",)}


@register_model(**_T2T)
def t2t_vit_7(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_7", num_classes, input_size, **options)


@register_model(**_T2T)
def t2t_vit_10(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_10", num_classes, input_size, **options)


@register_model(**_T2T)
def t2t_vit_12(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_12", num_classes, input_size, **options)


@register_model(**_T2T)
def t2t_vit_14(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_14", num_classes, input_size, **options)


@register_model(**_T2T)
def t2t_vit_19(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_19", num_classes, input_size, **options)


@register_model(**_T2T)
def t2t_vit_24(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_24", num_classes, input_size, **options)


@register_model(**_T2T_T)
def t2t_vit_t_14(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_t_14", num_classes, input_size, **options)


@register_model(**_T2T_T)
def t2t_vit_t_19(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_t_19", num_classes, input_size, **options)


@register_model(**_T2T_T)
def t2t_vit_t_24(num_classes: int = 1000, input_size: int = 224, **options):
    return build_t2t_vit("t2t_vit_t_24", num_classes, input_size, **options)
