"""DeiT (Touvron et al., 2020): the ViT architecture trained data-efficiently,
plus ``_distilled`` variants with a second prefix token (the distillation
token) and its own head; at inference the two heads are averaged.

Same layer names as timm's ``deit_*_patch16_224`` checkpoints
(``cls_token``, ``dist_token``, ``head``, ``head_dist``).
"""
from __future__ import annotations

from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD
from edgevit.models.vit import ViTConfig, build_vit
from edgevit.registry import Preprocessing, builder_options, register_model, timm_weights

REFERENCE_DEIT = "https://github.com/facebookresearch/deit (timm deit.py)"
# ImageNet mean/std, bicubic resize of the shorter side to 248, crop 224.
PREPROCESS_DEIT = Preprocessing(224, 248, "bicubic", IMAGENET_MEAN, IMAGENET_STD)

CONFIGS = {
    "deit_tiny": ViTConfig(16, 192, 12, 3),
    "deit_small": ViTConfig(16, 384, 12, 6),
    "deit_base": ViTConfig(16, 768, 12, 12),
    "deit_tiny_distilled": ViTConfig(16, 192, 12, 3, distilled=True),
    "deit_small_distilled": ViTConfig(16, 384, 12, 6, distilled=True),
    "deit_base_distilled": ViTConfig(16, 768, 12, 12, distilled=True),
}

# Official ImageNet weights (``weights="imagenet"``): Facebook's, as timm
# hosts them; top-1 from timm.
PRETRAINED = {
    "deit_tiny": timm_weights("deit_tiny_patch16_224.fb_in1k", 72.190, "Apache-2.0"),
    "deit_small": timm_weights("deit_small_patch16_224.fb_in1k", 79.856, "Apache-2.0"),
    "deit_base": timm_weights("deit_base_patch16_224.fb_in1k", 81.980, "Apache-2.0"),
    "deit_tiny_distilled": timm_weights("deit_tiny_distilled_patch16_224.fb_in1k", 74.538, "Apache-2.0"),
    "deit_small_distilled": timm_weights("deit_small_distilled_patch16_224.fb_in1k", 81.204, "Apache-2.0"),
    "deit_base_distilled": timm_weights("deit_base_distilled_patch16_224.fb_in1k", 83.384, "Apache-2.0"),
}

_DEIT = dict(family="deit", default_input_size=224, preprocessing=PREPROCESS_DEIT, input_size_multiple=16,
             reference=REFERENCE_DEIT, checkpoint_formats=("timm",), options=builder_options(build_vit),
             pretrained=PRETRAINED)


@register_model(**_DEIT)
def deit_tiny(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("deit_tiny", CONFIGS["deit_tiny"], num_classes, input_size, **options)


@register_model(**_DEIT)
def deit_small(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("deit_small", CONFIGS["deit_small"], num_classes, input_size, **options)


@register_model(**_DEIT)
def deit_base(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("deit_base", CONFIGS["deit_base"], num_classes, input_size, **options)


@register_model(**_DEIT)
def deit_tiny_distilled(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("deit_tiny_distilled", CONFIGS["deit_tiny_distilled"], num_classes, input_size, **options)


@register_model(**_DEIT)
def deit_small_distilled(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("deit_small_distilled", CONFIGS["deit_small_distilled"], num_classes, input_size, **options)


@register_model(**_DEIT)
def deit_base_distilled(num_classes: int = 1000, input_size: int = 224, **options):
    return build_vit("deit_base_distilled", CONFIGS["deit_base_distilled"], num_classes, input_size, **options)
