"""Pre-norm transformer blocks built from the shared attention and norm layers."""
from __future__ import annotations

import keras
import numpy as np
from keras import layers

from edgevit.layers.attention import MultiHeadSelfAttention, SeparableSelfAttention
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.norm import LayerNorm
from edgevit.layers.tokens import DropPath


def mlp(x, hidden: int, out: int, *, activation: str, dropout: float, name: str):
    x = layers.Dense(hidden, activation=activation, kernel_initializer=DENSE_INIT, name=f"{name}.fc1")(x)
    x = layers.Dropout(dropout, name=f"{name}.drop1")(x)
    return layers.Dense(out, kernel_initializer=DENSE_INIT, name=f"{name}.fc2")(x)


def transformer_encoder(x, dim: int, ffn_dim: int, num_heads: int, *, dropout: float = 0.0,
                        attn_dropout: float = 0.0, ffn_dropout: float = 0.0, activation: str = "silu",
                        epsilon: float = 1e-5, qkv_bias: bool = True, drop_path: float = 0.0,
                        attention=None, name: str):
    """x + MHSA(LN(x)), then x + MLP(LN(x)) over ``[B, N, C]`` tokens.

    ``epsilon`` is the LayerNorm epsilon (timm ViTs: 1e-6), ``drop_path`` the
    stochastic-depth rate of both residual branches, and ``attention`` an
    optional attention layer (named ``{name}.attn``) replacing the standard
    multi-head self-attention (GPSA, Re-Attention, ...).

    ``x`` may also be a list of token groups (e.g. ``[class token, patches]``):
    the residual stream of each group then stays a tensor of its own, so int8
    gives each group its own scale (a class token much smaller than the patch
    tokens would otherwise be rounded away, and LayerNorm would amplify the
    error). Groups are joined only after the LayerNorms, where every token has
    unit scale; the math is identical and so are the weights. Returns a list
    in that case.
    """
    groups = list(x) if isinstance(x, (list, tuple)) else [x]
    norm1 = LayerNorm(epsilon=epsilon, name=f"{name}.norm1")
    if attention is None:
        attention = MultiHeadSelfAttention(dim, num_heads, attn_dropout, qkv_bias=qkv_bias, name=f"{name}.attn")
    y = attention(join_groups([norm1(g) for g in groups], name=f"{name}.join1"))
    y = layers.Dropout(dropout, name=f"{name}.drop_attn")(y)
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path1")(y)
    groups = [layers.Add(name=_suffixed(f"{name}.add1", i, groups))([g, b])
              for i, (g, b) in enumerate(zip(groups, split_groups(y, groups, name=f"{name}.split1")))]
    norm2 = LayerNorm(epsilon=epsilon, name=f"{name}.norm2")
    y = join_groups([norm2(g) for g in groups], name=f"{name}.join2")
    y = mlp(y, ffn_dim, dim, activation=activation, dropout=ffn_dropout, name=f"{name}.mlp")
    y = layers.Dropout(dropout, name=f"{name}.drop_mlp")(y)
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path2")(y)
    groups = [layers.Add(name=_suffixed(f"{name}.add2", i, groups))([g, b])
              for i, (g, b) in enumerate(zip(groups, split_groups(y, groups, name=f"{name}.split2")))]
    return groups if isinstance(x, (list, tuple)) else groups[0]


def residual(x, y, drop_path: float, block: str, index: int):
    """``x + y``, the ``index``-th residual add of ``block`` (``{block}.add{index}``),
    with stochastic depth on the branch ``y`` while training."""
    if drop_path:
        y = DropPath(drop_path, name=f"{block}.drop_path{index}")(y)
    return layers.Add(name=f"{block}.add{index}")([x, y])


def _suffixed(name: str, index: int, groups: list) -> str:
    return name if len(groups) == 1 else f"{name}.{index}"


def join_groups(groups: list, name: str):
    """Concatenate token groups along the token axis (identity for one)."""
    return groups[0] if len(groups) == 1 else layers.Concatenate(axis=1, name=name)(groups)


def split_groups(y, groups: list, name: str) -> list:
    """Split ``y`` back into tensors with the token counts of ``groups``."""
    if len(groups) == 1:
        return [y]
    sizes = [g.shape[1] for g in groups]
    return TokenSplit(sizes, name=name)(y)


@keras.saving.register_keras_serializable(package="edgevit")
class TokenSplit(keras.layers.Layer):
    """Split ``[B, N, C]`` along the token axis (or ``axis``, e.g. -1 for
    the channels of a joint key/value projection) into parts of ``sizes``."""

    def __init__(self, sizes, axis: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.sizes = [int(s) for s in sizes]
        self.axis = int(axis)

    def call(self, x):
        # one slice per group, not one SPLIT: a group nobody reads (the
        # patches after the last block) is then removed by the converter
        # instead of leaving a split output without calibration statistics
        # (which the int8 converter keeps in float)
        axis = self.axis % len(x.shape)
        bounds = [0, *np.cumsum(self.sizes)]
        return [x[(slice(None),) * axis + (slice(int(a), int(b)),)] for a, b in zip(bounds[:-1], bounds[1:])]

    def compute_output_shape(self, input_shape):
        axis = self.axis % len(input_shape)
        return [(*input_shape[:axis], s, *input_shape[axis + 1:]) for s in self.sizes]

    def get_config(self):
        return {**super().get_config(), "sizes": self.sizes, "axis": self.axis}


def separable_attention_block(x, dim: int, ffn_dim: int, *, dropout: float = 0.0,
                              attn_dropout: float = 0.0, ffn_dropout: float = 0.0, name: str):
    """MobileViT v2's LinearAttnFFN over ``[B, N, P, C]``, with GroupNorm(1) norms."""
    y = LayerNorm(axes=(1, 2, 3), name=f"{name}.norm1")(x)
    y = SeparableSelfAttention(dim, attn_dropout, name=f"{name}.attn")(y)
    y = layers.Dropout(dropout, name=f"{name}.drop_attn")(y)
    x = layers.Add(name=f"{name}.add1")([x, y])
    y = LayerNorm(axes=(1, 2, 3), name=f"{name}.norm2")(x)
    y = mlp(y, ffn_dim, dim, activation="silu", dropout=ffn_dropout, name=f"{name}.mlp")
    y = layers.Dropout(dropout, name=f"{name}.drop_mlp")(y)
    return layers.Add(name=f"{name}.add2")([x, y])
