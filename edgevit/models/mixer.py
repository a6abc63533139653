"""MLP-Mixer (Tolstikhin et al., 2021): patch embedding, then blocks that mix
tokens (an MLP across the patch axis, applied to the transposed tokens) and
channels (an MLP per token), each pre-normalised with LayerNorm (eps 1e-6)
and residual; global average pooling and a linear head.

The token-mixing MLP has one weight per patch position, so its parameter
count depends on the input size (the reference counts are at 224x224).
Layer names follow timm's ``mixer_*`` modules (``stem.proj``,
``blocks.3.mlp_tokens.fc1``). timm zero-initialises the head, which makes a
randomly initialised model output all-zero logits; here the head starts at
truncated-normal(0.02) so untrained exports can still be validated.
"""
from __future__ import annotations

from dataclasses import dataclass

import keras

from edgevit.layers import LayerNorm, drop_path_rates, mlp, patch_embed
from edgevit.layers.transformer import residual
from edgevit.models.common import image_input, mean_pool_head, transpose_tokens
from edgevit.registry import Preprocessing, Unpublished, builder_options, register_model, timm_weights

REFERENCE_TIMM_MIXER = "https://github.com/huggingface/pytorch-image-models (mlp_mixer.py)"
# timm mixer_*_224 (Google in21k-ft-in1k weights): mean/std 0.5, bicubic,
# shorter side 256 (crop 0.875), centre crop 224.
PREPROCESS_MIXER = Preprocessing(224, 256, "bicubic", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
LN_EPS = 1e-6


@dataclass(frozen=True)
class MixerConfig:
    patch_size: int
    dim: int
    depth: int
    tokens_ratio: float = 0.5
    channels_ratio: float = 4.0


CONFIGS = {
    "mixer_s16": MixerConfig(16, 512, 8),
    "mixer_b16": MixerConfig(16, 768, 12),
}


def mixer_block(x, cfg: MixerConfig, drop_path: float, name: str):
    tokens = x.shape[1]
    y = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm1")(x)
    y = transpose_tokens(y, f"{name}.to_tokens_last")
    y = mlp(y, int(cfg.tokens_ratio * cfg.dim), tokens, activation="gelu", dropout=0.0,
            name=f"{name}.mlp_tokens")
    x = residual(x, transpose_tokens(y, f"{name}.to_channels_last"), drop_path, name, 1)
    y = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm2")(x)
    y = mlp(y, int(cfg.channels_ratio * cfg.dim), cfg.dim, activation="gelu", dropout=0.0,
            name=f"{name}.mlp_channels")
    return residual(x, y, drop_path, name, 2)


def build_mixer(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    x = patch_embed(inputs, cfg.dim, cfg.patch_size, name="stem")
    for i, rate in enumerate(drop_path_rates(drop_path_rate, cfg.depth)):
        x = mixer_block(x, cfg, rate, name=f"blocks.{i}")
    x = LayerNorm(epsilon=LN_EPS, name="norm")(x)
    return keras.Model(inputs, mean_pool_head(x, num_classes), name=name)


# Official ImageNet weights (``weights="imagenet"``): Google's ImageNet-21k
# pretrained, ImageNet-1k fine-tuned Mixer-B/16 as timm hosts it (top-1
# from timm). Google published no Mixer-S/16 weights in that recipe.
PRETRAINED = {
    "mixer_s16": Unpublished("Google's only Mixer-S/16 ImageNet weights are the GSAM-trained JAX checkpoint "
                             "gs://mixer_models/gsam/Mixer-S_16.npz (github.com/google-research/vision_transformer), "
                             "which edgevit cannot import yet, and timm has none; mixer_b16 has official weights"),
    "mixer_b16": timm_weights("mixer_b16_224.goog_in21k_ft_in1k", 76.616, "Apache-2.0"),
}

_MIXER = dict(family="mlp_mixer", default_input_size=224, preprocessing=PREPROCESS_MIXER,
              input_size_multiple=16, reference=REFERENCE_TIMM_MIXER, checkpoint_formats=("timm",),
              options=builder_options(build_mixer),
              pretrained=PRETRAINED)


@register_model(**_MIXER)
def mixer_s16(num_classes: int = 1000, input_size: int = 224, **options):
    return build_mixer("mixer_s16", num_classes, input_size, **options)


@register_model(**_MIXER)
def mixer_b16(num_classes: int = 1000, input_size: int = 224, **options):
    return build_mixer("mixer_b16", num_classes, input_size, **options)
