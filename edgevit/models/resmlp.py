"""ResMLP (Touvron et al., 2021): an MLP-Mixer without LayerNorm. Each block
normalises with a per-channel affine map (``alpha * x + beta``), mixes
tokens with one linear layer across the patch axis, mixes channels with a
GELU MLP, and scales both residual branches with a learned per-channel
LayerScale (initial value 0.1 / 1e-5 / 1e-6 for 12 / 24 / 36 blocks).

Without normalisation every op is a plain int8 kernel (no MEAN/RSQRT): the
cheapest family to quantize. The linear token-mixing layer has one weight
per patch pair, so the parameter count depends on the input size (the
reference counts are at 224x224). Names follow timm (``blocks.3.linear_tokens``,
``blocks.3.ls1``); the head starts at truncated-normal(0.02), not timm's zeros.
"""
from __future__ import annotations

import keras
from keras import layers, ops

from edgevit.layers import drop_path_rates, mlp, patch_embed
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.quantize_points import QuantizePoints
from edgevit.layers.tokens import DropPath
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, image_input, mean_pool_head, transpose_tokens
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

REFERENCE_TIMM_RESMLP = "https://github.com/facebookresearch/deit (timm mlp_mixer.py, ResBlock)"
PREPROCESS_RESMLP = Preprocessing(224, 256, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
DIM, PATCH_SIZE, MLP_RATIO = 384, 16, 4


@keras.saving.register_keras_serializable(package="edgevit")
class Affine(QuantizePoints, keras.layers.Layer):
    """ResMLP's normalisation: ``alpha * x + beta`` per channel."""

    def build(self, input_shape):
        self.alpha = self.add_weight(name="alpha", shape=(input_shape[-1],), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(input_shape[-1],), initializer="zeros")

    def call(self, x):
        q = self.quantize_point
        return ops.add(q("scaled", ops.multiply(x, q("alpha", self.alpha))), q("beta", self.beta))

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="edgevit")
class LayerScale(QuantizePoints, keras.layers.Layer):
    """Per-channel learned scale of a residual branch (``ls1``/``ls2``)."""

    def __init__(self, init_value: float = 1e-4, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],),
                                     initializer=keras.initializers.Constant(self.init_value))

    def call(self, x):
        return ops.multiply(x, self.quantize_point("gamma", self.gamma))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "init_value": self.init_value}


def res_block(x, init_value: float, drop_path: float, name: str):
    tokens = x.shape[1]
    y = Affine(name=f"{name}.norm1")(x)
    y = transpose_tokens(y, f"{name}.to_tokens_last")
    y = layers.Dense(tokens, kernel_initializer=DENSE_INIT, name=f"{name}.linear_tokens")(y)
    y = transpose_tokens(y, f"{name}.to_channels_last")
    y = LayerScale(init_value, name=f"{name}.ls1")(y)
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path1")(y)
    x = layers.Add(name=f"{name}.add1")([x, y])
    y = Affine(name=f"{name}.norm2")(x)
    y = mlp(y, MLP_RATIO * DIM, DIM, activation="gelu", dropout=0.0, name=f"{name}.mlp_channels")
    y = LayerScale(init_value, name=f"{name}.ls2")(y)
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path2")(y)
    return layers.Add(name=f"{name}.add2")([x, y])


def build_resmlp(name: str, depth: int, init_value: float, num_classes: int, input_size: int, *,
                 drop_path_rate: float = 0.0) -> keras.Model:
    inputs = image_input(input_size)
    x = patch_embed(inputs, DIM, PATCH_SIZE, name="stem")
    for i, rate in enumerate(drop_path_rates(drop_path_rate, depth)):
        x = res_block(x, init_value, rate, name=f"blocks.{i}")
    x = Affine(name="norm")(x)
    return keras.Model(inputs, mean_pool_head(x, num_classes), name=name)


# Official ImageNet weights (``weights="imagenet"``): Facebook's ImageNet-1k
# ones, timm's default tags, as timm hosts them; top-1 from timm.
PRETRAINED = {
    "resmlp_12": timm_weights("resmlp_12_224.fb_in1k", 76.660, "Apache-2.0"),
    "resmlp_24": timm_weights("resmlp_24_224.fb_in1k", 79.380, "Apache-2.0"),
    "resmlp_36": timm_weights("resmlp_36_224.fb_in1k", 79.772, "Apache-2.0"),
}

_RESMLP = dict(family="resmlp", default_input_size=224, preprocessing=PREPROCESS_RESMLP,
               input_size_multiple=PATCH_SIZE, reference=REFERENCE_TIMM_RESMLP, checkpoint_formats=("timm",),
               options=builder_options(build_resmlp),
               pretrained=PRETRAINED)


@register_model(**_RESMLP)
def resmlp_12(num_classes: int = 1000, input_size: int = 224, **options):
    return build_resmlp("resmlp_12", 12, 0.1, num_classes, input_size, **options)


@register_model(**_RESMLP)
def resmlp_24(num_classes: int = 1000, input_size: int = 224, **options):
    return build_resmlp("resmlp_24", 24, 1e-5, num_classes, input_size, **options)


@register_model(**_RESMLP)
def resmlp_36(num_classes: int = 1000, input_size: int = 224, **options):
    return build_resmlp("resmlp_36", 36, 1e-6, num_classes, input_size, **options)
