"""Building blocks shared by the model families."""
from edgevit.layers.aspp import aspp
from edgevit.layers.attention import MultiHeadSelfAttention, SeparableSelfAttention
from edgevit.layers.conv import conv_norm_act, inverted_residual, make_divisible
from edgevit.layers.mha import HeadAttention
from edgevit.layers.norm import LayerNorm
from edgevit.layers.patches import Fold, ResizeBilinear, SpaceToChannels, Unfold
from edgevit.layers.soft_split import SoftSplit
from edgevit.layers.tokens import (BicubicResize, DropPath, PositionEmbedding, PrefixTokens, TokenSlice,
                                  bicubic_matrix, drop_path_rates, patch_embed, to_map, to_tokens)
from edgevit.layers.transformer import mlp, separable_attention_block, transformer_encoder

__all__ = ["aspp", "HeadAttention", "BicubicResize", "DropPath", "PositionEmbedding", "PrefixTokens", "TokenSlice",
           "bicubic_matrix", "drop_path_rates", "patch_embed", "to_map", "to_tokens", "Fold", "LayerNorm",
           "MultiHeadSelfAttention", "ResizeBilinear", "SeparableSelfAttention", "SpaceToChannels",
           "Unfold", "conv_norm_act", "inverted_residual", "make_divisible", "mlp",
           "separable_attention_block", "transformer_encoder", "SoftSplit"]
