"""DeepViT (Zhou et al., 2021), at the paper's smallest size, DeepViT-S
(27M parameters, Table 6): a deeper ViT whose last blocks use Re-Attention.

Re-Attention mixes the H attention maps of a block with a learnable H x H
matrix (a 1x1 convolution over the head axis) and normalises the result
(BatchNorm over heads) before the value product, so deep blocks stop
producing near-identical maps ("attention collapse"):
``Re-Attention(Q, K, V) = Norm(Theta^T Softmax(Q K^T / sqrt(d))) V``.

DeepViT-S as released (``deepvit_S``): a T2T-style convolutional patch
embedding (7x7/2 conv + BN + ReLU, 3x3 conv + BN + ReLU, 8x8/8 projection:
16x16 patches overall), width 396 with 12 heads (head dim 33), MLP ratio 3,
16 blocks of which the last 5 re-attend (the mixed maps scaled by
head_dim ** -0.5), residual branches computed on ``0.5 * x`` and added back
times 2 (``scale_adjustment``; the 0.5 before each LayerNorm is folded into
its epsilon: LN(x/2, eps) = LN(x, 4 eps)). The re-attention runs in rank 4:
the ``[B, H, N, N]`` maps are transposed to ``[B, N, N, H]`` so the head
mixing is a 1x1 convolution over channels.
"""
from __future__ import annotations

import keras
from keras import layers, ops

from edgevit.layers import (DropPath, LayerNorm, PositionEmbedding, PrefixTokens, conv_norm_act, drop_path_rates,
                            mlp, to_tokens)
from edgevit.layers.conv import BN_EPSILON, BN_MOMENTUM, DENSE_INIT
from edgevit.layers.mha import attention_scores, merge_heads, split_heads, split_heads_transposed
from edgevit.layers.quantize_points import QuantizePoints
from edgevit.layers.transformer import join_groups, split_groups
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, class_token_head, image_input
from edgevit.registry import Preprocessing, Unpublished, builder_options, register_model

REFERENCE_DEEPVIT = "https://github.com/zhoudaquan/dvit_repo (DeepViT paper, Table 6: DeepViT-S 27M)"
PREPROCESS_DEEPVIT = Preprocessing(224, 248, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
LN_EPS, SCALE_ADJUSTMENT = 1e-6, 0.5
DIM, HEADS, DEPTH, RE_ATTENTION_BLOCKS, MLP_RATIO, PATCH_SIZE = 396, 12, 16, 5, 3, 16


@keras.saving.register_keras_serializable(package="edgevit")
class ReAttention(QuantizePoints, keras.layers.Layer):
    """Multi-head self-attention (timm ``qkv`` layout) whose softmax maps
    are mixed across heads by ``reatten_matrix`` and normalised by
    ``var_norm`` when ``apply_transform``."""

    def __init__(self, dim: int, num_heads: int, apply_transform: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.num_heads, self.apply_transform = dim, num_heads, apply_transform
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = self.dense_class(3 * dim, kernel_initializer=DENSE_INIT, name="qkv")
        self.proj = self.dense_class(dim, kernel_initializer=DENSE_INIT, name="proj")
        if apply_transform:
            self.reatten_matrix = self.dense_class(num_heads, name="reatten_matrix")
            self.var_norm = self.head_norm()

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.proj.build((*input_shape[:-1], self.dim))
        if self.apply_transform:
            self.reatten_matrix.build((None, None, None, self.num_heads))
            if self.var_norm is not None:
                self.var_norm.build((None, None, None, self.num_heads))

    def call(self, x, training=None):
        mark = self.quantize_point
        q, k, v = ops.split(mark("qkv", self.qkv(x)), 3, axis=-1)
        attn = attention_scores(split_heads(q, self.num_heads), split_heads_transposed(k, self.num_heads),
                                self.scale, self)
        if self.apply_transform:
            mixed = ops.transpose(attn, (0, 2, 3, 1))          # heads as channels
            mixed = mark("mixed", self.mix_heads(mixed, training))
            attn = mark("mixed_scaled", ops.transpose(mixed, (0, 3, 1, 2)) * self.scale)
        context = mark("context", self.matmul("context", attn, split_heads(v, self.num_heads)))
        return self.proj(merge_heads(context))

    def head_norm(self):
        """The BatchNorm after the head mixing (quantization-aware training
        folds it into ``reatten_matrix`` and has none)."""
        return layers.BatchNormalization(epsilon=BN_EPSILON, momentum=BN_MOMENTUM, name="var_norm")

    def mix_heads(self, attn, training=None):
        mixed = self.reatten_matrix(attn)
        return mixed if self.var_norm is None else self.var_norm(mixed, training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "num_heads": self.num_heads,
                "apply_transform": self.apply_transform}


def deepvit_block(groups, apply_transform: bool, drop_path: float, name: str):
    eps = LN_EPS / SCALE_ADJUSTMENT ** 2  # LN(x * 0.5, eps) == LN(x, 4 * eps)
    norm1 = LayerNorm(epsilon=eps, name=f"{name}.norm1")
    y = ReAttention(DIM, HEADS, apply_transform, name=f"{name}.attn")(
        join_groups([norm1(g) for g in groups], f"{name}.join1"))
    y = layers.Rescaling(1 / SCALE_ADJUSTMENT, name=f"{name}.unscale1")(y)
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path1")(y)
    groups = [layers.Add(name=f"{name}.add1.{i}")([g, b])
              for i, (g, b) in enumerate(zip(groups, split_groups(y, groups, f"{name}.split1")))]
    norm2 = LayerNorm(epsilon=eps, name=f"{name}.norm2")
    y = mlp(join_groups([norm2(g) for g in groups], f"{name}.join2"), MLP_RATIO * DIM, DIM,
            activation="gelu", dropout=0.0, name=f"{name}.mlp")
    y = layers.Rescaling(1 / SCALE_ADJUSTMENT, name=f"{name}.unscale2")(y)
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path2")(y)
    return [layers.Add(name=f"{name}.add2.{i}")([g, b])
            for i, (g, b) in enumerate(zip(groups, split_groups(y, groups, f"{name}.split2")))]


def build_deepvit(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    inputs = image_input(input_size)
    x = conv_norm_act(inputs, 64, 7, 2, activation="relu", name="patch_embed.conv1")
    x = conv_norm_act(x, 64, 3, 1, activation="relu", name="patch_embed.conv2")
    x = layers.Conv2D(DIM, PATCH_SIZE // 2, PATCH_SIZE // 2, kernel_initializer=DENSE_INIT,
                      name="patch_embed.proj")(x)
    grid = tuple(x.shape[1:3])
    x = to_tokens(x, "patch_embed.flatten")
    cls = PrefixTokens(["cls_token"], [0.02], concat=False, name="cls_token")(x)
    groups = PositionEmbedding(grid, num_prefix=1, name="pos_embed")([cls, x])
    for i, rate in enumerate(drop_path_rates(drop_path_rate, DEPTH)):
        groups = deepvit_block(groups, i >= DEPTH - RE_ATTENTION_BLOCKS, rate, name=f"blocks.{i}")
    _, logits = class_token_head(groups[0], num_classes, epsilon=LN_EPS)
    return keras.Model(inputs, logits, name=name)


PRETRAINED = {
    "deepvit_s": Unpublished("its authors share checkpoints only as Google Drive links in the README of "
                             "github.com/zhoudaquan/dvit_repo, and edgevit has no importer for their naming yet"),
}


@register_model(family="deepvit", default_input_size=224, preprocessing=PREPROCESS_DEEPVIT,
                input_size_multiple=PATCH_SIZE, reference=REFERENCE_DEEPVIT, checkpoint_formats=(),
                options=builder_options(build_deepvit), pretrained=PRETRAINED)
def deepvit_s(num_classes: int = 1000, input_size: int = 224, **options):
    return build_deepvit("deepvit_s", num_classes, input_size, **options)
