"""Pre-norm transformer blocks built from the shared attention and norm layers."""
from __future__ import annotations

from keras import layers

from edgevit.layers.attention import MultiHeadSelfAttention, SeparableSelfAttention
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.norm import LayerNorm


def mlp(x, hidden: int, out: int, *, activation: str, dropout: float, name: str):
    x = layers.Dense(hidden, activation=activation, kernel_initializer=DENSE_INIT, name=f"{name}.fc1")(x)
    x = layers.Dropout(dropout, name=f"{name}.drop1")(x)
    return layers.Dense(out, kernel_initializer=DENSE_INIT, name=f"{name}.fc2")(x)


def transformer_encoder(x, dim: int, ffn_dim: int, num_heads: int, *, dropout: float = 0.0,
                        attn_dropout: float = 0.0, ffn_dropout: float = 0.0, activation: str = "silu",
                        name: str):
    """x + MHSA(LN(x)), then x + MLP(LN(x)) over ``[B, N, C]`` tokens."""
    y = LayerNorm(name=f"{name}.norm1")(x)
    y = MultiHeadSelfAttention(dim, num_heads, attn_dropout, name=f"{name}.attn")(y)
    y = layers.Dropout(dropout, name=f"{name}.drop_attn")(y)
    x = layers.Add(name=f"{name}.add1")([x, y])
    y = LayerNorm(name=f"{name}.norm2")(x)
    y = mlp(y, ffn_dim, dim, activation=activation, dropout=ffn_dropout, name=f"{name}.mlp")
    y = layers.Dropout(dropout, name=f"{name}.drop_mlp")(y)
    return layers.Add(name=f"{name}.add2")([x, y])


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
