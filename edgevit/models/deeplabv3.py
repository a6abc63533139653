"""DeepLabV3 segmenters (Chen et al. 2017) on MobileViT v1, v2 and v3, as
Apple's ml-cvnets trains them on PASCAL VOC and transformers ports them
(``MobileViTForSemanticSegmentation``, ``MobileViTV2ForSemanticSegmentation``).

The backbone is the classifier's up to layer 5 (no ``conv_1x1_exp``), at
output stride 16 or 8 by dilation (``mobilevit.downsampling``), the same
layer names as the classifier's, so ImageNet weights load into it by name.
ASPP (``edgevit/layers/aspp.py``) and a 1x1 classifier give raw logits,
``[B, H / output_stride, W / output_stride, num_classes]`` NHWC: no
upsampling inside the model, as MediaPipe's ImageSegmenter expects (it
resizes the logits to the image itself).
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers

from edgevit.errors import EdgevitError
from edgevit.layers import aspp
from edgevit.models.common import image_input
from edgevit.models.mobilevit import CONFIGS as V1_BASED, CVNETS_LICENCE, mobilevit_features, mobilevitv3_release
from edgevit.models.mobilevit_v2 import mobilevit_v2_features
from edgevit.registry import (VOC_MIOU, Preprocessing, Unpublished, builder_options, hub_weights, register_model,
                              url_weights)

VOC_CLASSES = 21
# ml-cvnets evaluates its VOC segmenters on the whole image resized to
# 512x512 (bicubic), pixels in [0, 1], no mean/std.
PREPROCESS_VOC = Preprocessing(input_size=512, resize_size=512, interpolation="bicubic")
REFERENCE = "https://github.com/apple/ml-cvnets (config/segmentation/pascal_voc)"
REFERENCE_V3 = "https://github.com/micronDLA/MobileViTv3 (config/segmentation)"


@dataclass(frozen=True)
class DeepLabV3Config:
    """``backbone`` is a registered MobileViT classifier; ``output_stride``
    and ``atrous_rates`` go together (cvnets' newer recipe: 8 and (12, 24, 36))."""

    backbone: str
    aspp_channels: int
    output_stride: int = 16
    atrous_rates: tuple[int, int, int] = (6, 12, 18)


V2_WIDTHS = ("050", "075", "100", "125", "150", "175", "200")
# As published: transformers' releases (deeplabv3-mobilevit-{xx-small,x-small,small}:
# ASPP 256; mobilevitv2-1.0-voc-deeplabv3 and cvnets' v2 VOC config: ASPP 512)
# and MobileViTv3's VOC configs (v1-based: 256; v2-based, MobileViTv3-v2's
# pascal_voc/deeplabv3_mobilevitv3.yaml: 512, rates 6, 12, 18), all at output stride 16.
CONFIGS = {
    "deeplabv3_mobilevit_v1_xxs": DeepLabV3Config("mobilevit_v1_xxs", 256),
    "deeplabv3_mobilevit_v1_xs": DeepLabV3Config("mobilevit_v1_xs", 256),
    "deeplabv3_mobilevit_v1_s": DeepLabV3Config("mobilevit_v1_s", 256),
    **{f"deeplabv3_mobilevit_v2_{w}": DeepLabV3Config(f"mobilevit_v2_{w}", 512) for w in V2_WIDTHS},
    "deeplabv3_mobilevit_v3_xxs": DeepLabV3Config("mobilevit_v3_xxs", 256),
    "deeplabv3_mobilevit_v3_xs": DeepLabV3Config("mobilevit_v3_xs", 256),
    "deeplabv3_mobilevit_v3_s": DeepLabV3Config("mobilevit_v3_s", 256),
    **{f"deeplabv3_mobilevit_v3_{w}": DeepLabV3Config(f"mobilevit_v3_{w}", 512) for w in ("050", "075", "100")},
}


APPLE_LICENCE = ("Apple sample code licence, research use (the model card: https://huggingface.co/apple/{repo}; "
                 "Hub licence 'other')")
CVNETS_ZOO = ("https://docs-assets.developer.apple.com/ml-research/models/cvnets-v2/segmentation/pascalvoc/mobilevitv2/"
              "deeplabv3-mobilevitv2-{width}.pt")


def apple_release(repo: str, miou: float, channel_order: str):
    """transformers' port of Apple's VOC checkpoint on the Hub (its PASCAL VOC val mIoU as published)."""
    return hub_weights(f"apple/{repo}", "pytorch_model.bin", miou, APPLE_LICENCE.format(repo=repo),
                       naming="huggingface", channel_order=channel_order, metric=VOC_MIOU)


def cvnets_zoo(width: str, miou: float):
    """Apple's ml-cvnets model zoo file (cvnets naming; no published checksum: edgevit records the first
    download's), its mIoU as the zoo's table gives it; trained on ml-cvnets v0.2, which reads images with PIL."""
    return url_weights(CVNETS_ZOO.format(width=width), "", miou, CVNETS_LICENCE,
                       tag=f"deeplabv3-mobilevitv2-{width}", naming="cvnets", metric=VOC_MIOU)


NO_VOC = Unpublished("no PASCAL VOC DeepLabV3 checkpoint of this width is published (ml-cvnets' model zoo has "
                     "ADE20k ones, 150 classes, in cvnets naming)")

# Official PASCAL VOC weights (``weights="imagenet"`` names every variant's
# official weights). v1: MobileViT's paper mIoU, trained on ml-cvnets v0.1,
# which read images with OpenCV: BGR, turned RGB at import. v2: trained on
# ml-cvnets v0.2, which reads images with PIL (data/datasets/segmentation/
# base_segmentation.py, read_image_pil): RGB; mIoU as ml-cvnets' model zoo;
# its v2 blocks dilated (the cvnets importer builds them so). v3: the
# MobileViTv3 release's VOC files (README mIoU; non-commercial licence), on
# ml-cvnets v0.1: BGR; the v2-based ones (0.5, 1.0) on ml-cvnets v0.2: RGB,
# their blocks dilated as cvnets' v2 (MobileViTBlockv3 takes the layer's
# dilation), which their importer builds. The zoo's and the release's parameter counts (6.2 M,
# 17.7 M, 22.6 M; 2.0 M, 3.3 M, 7.2 M) are the registered variants' (ASPP 512
# and 256, output stride 16), as their configs have them.
PRETRAINED = {
    "deeplabv3_mobilevit_v1_xxs": apple_release("deeplabv3-mobilevit-xx-small", 73.6, "BGR"),
    "deeplabv3_mobilevit_v1_xs": apple_release("deeplabv3-mobilevit-x-small", 77.1, "BGR"),
    "deeplabv3_mobilevit_v1_s": apple_release("deeplabv3-mobilevit-small", 79.1, "BGR"),
    "deeplabv3_mobilevit_v2_050": cvnets_zoo("0.5", 75.07),
    "deeplabv3_mobilevit_v2_075": NO_VOC,
    # Not transformers' port (apple/mobilevitv2-1.0-voc-deeplabv3) of the same weights: it runs the blocks'
    # depthwise 3x3 undilated, while ml-cvnets trained them dilated at output stride 16.
    "deeplabv3_mobilevit_v2_100": cvnets_zoo("1.0", 78.94),
    "deeplabv3_mobilevit_v2_125": cvnets_zoo("1.25", 79.68),
    "deeplabv3_mobilevit_v2_150": cvnets_zoo("1.5", 80.30),
    "deeplabv3_mobilevit_v2_175": NO_VOC,
    "deeplabv3_mobilevit_v2_200": NO_VOC,
    "deeplabv3_mobilevit_v3_xxs": mobilevitv3_release("mobilevitv3_XXS_voc_e50_7404", 74.04, "BGR", VOC_MIOU),
    "deeplabv3_mobilevit_v3_xs": mobilevitv3_release("mobilevitv3_XS_voc_e50_7877", 78.77, "BGR", VOC_MIOU),
    "deeplabv3_mobilevit_v3_s": mobilevitv3_release("mobilevitv3_S_voc_e50_7959", 79.59, "BGR", VOC_MIOU),
    "deeplabv3_mobilevit_v3_050": mobilevitv3_release("mobilevitv3_voc_0_5_0", 76.48, "RGB", VOC_MIOU),
    "deeplabv3_mobilevit_v3_075": Unpublished("the MobileViTv3 release has no PASCAL VOC checkpoint of width 0.75 "
                                              "(only ADE20k, 150 classes: mobilevitv3_ade20k_0_7_5)"),
    "deeplabv3_mobilevit_v3_100": mobilevitv3_release("mobilevitv3_voc_1_0_0", 80.04, "RGB", VOC_MIOU),
}


def backbone_features(inputs, backbone: str, output_stride: int, dilate_blocks: bool = False, **dropouts) -> list:
    """The feature maps of a MobileViT backbone (layers 3, 4, 5);
    ``dilate_blocks`` as ``mobilevit_v2.mobilevit_v2_features`` (v2-based
    backbones: ml-cvnets' v1 blocks, and MobileViTv3's on them, dilate none)."""
    if backbone in V1_BASED:
        if dilate_blocks:
            raise EdgevitError(f"dilate_blocks is for MobileViT v2-based backbones; {backbone}'s blocks are never "
                               "dilated (ml-cvnets and transformers alike).")
        return mobilevit_features(inputs, backbone, output_stride, **dropouts)
    return mobilevit_v2_features(inputs, backbone, output_stride, dilate_blocks=dilate_blocks, **dropouts)


def build_deeplabv3(name: str, num_classes: int = VOC_CLASSES, input_size: int = 512, *, dropout: float = 0.0,
                    attn_dropout: float = 0.0, ffn_dropout: float = 0.0, aspp_dropout: float = 0.1,
                    classifier_dropout: float = 0.1, dilate_blocks: bool = False) -> keras.Model:
    """``dilate_blocks`` changes the arithmetic, not the weights: the v2
    blocks' depthwise 3x3 dilated as ml-cvnets trained its v2 checkpoints
    (its importer builds the model so); transformers' ports of them run
    undilated."""
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    x = backbone_features(inputs, cfg.backbone, cfg.output_stride, dilate_blocks, dropout=dropout,
                          attn_dropout=attn_dropout, ffn_dropout=ffn_dropout)[-1]
    x = aspp(x, cfg.aspp_channels, cfg.atrous_rates, dropout=aspp_dropout, name="aspp")
    if classifier_dropout:
        x = layers.SpatialDropout2D(classifier_dropout, name="classifier.drop")(x)
    outputs = layers.Conv2D(num_classes, 1, name="classifier.conv")(x)
    return keras.Model(inputs, outputs, name=name)


def switches_of(model) -> dict:
    """The switches (``registry.SWITCHES``) a built model computes with, read
    from its layers: ``dilate_blocks`` where a v2 block's depthwise 3x3 is
    dilated; nothing for any other model."""
    dilated = any(layer.name.endswith(".local_rep.conv_3x3.conv") and max(layer.dilation_rate) > 1
                  for layer in model.layers)
    return {"dilate_blocks": True} if dilated else {}


_COMMON = dict(default_input_size=512, preprocessing=PREPROCESS_VOC, task="segmentation", num_classes=VOC_CLASSES,
               options=builder_options(build_deeplabv3), pretrained=PRETRAINED)
_V1 = dict(family="deeplabv3_mobilevit_v1", reference=REFERENCE, checkpoint_formats=("huggingface", "cvnets"),
           **_COMMON)
_V2 = dict(family="deeplabv3_mobilevit_v2", reference=REFERENCE, checkpoint_formats=("huggingface", "cvnets"),
           **_COMMON)
_V3 = dict(family="deeplabv3_mobilevit_v3", reference=REFERENCE_V3, checkpoint_formats=("cvnets",), **_COMMON)
# A family of their own: their checkpoints import with other rules and options than the v1-based ones'.
_V3_ON_V2 = dict(_V3, family="deeplabv3_mobilevit_v3_v2based")


@register_model(**_V1)
def deeplabv3_mobilevit_v1_xxs(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v1_xxs", num_classes, input_size, **options)


@register_model(**_V1)
def deeplabv3_mobilevit_v1_xs(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v1_xs", num_classes, input_size, **options)


@register_model(**_V1)
def deeplabv3_mobilevit_v1_s(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v1_s", num_classes, input_size, **options)


@register_model(**_V2)
def deeplabv3_mobilevit_v2_050(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v2_050", num_classes, input_size, **options)


@register_model(**_V2)
def deeplabv3_mobilevit_v2_075(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v2_075", num_classes, input_size, **options)


@register_model(**_V2)
def deeplabv3_mobilevit_v2_100(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v2_100", num_classes, input_size, **options)


@register_model(**_V2)
def deeplabv3_mobilevit_v2_125(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v2_125", num_classes, input_size, **options)


@register_model(**_V2)
def deeplabv3_mobilevit_v2_150(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v2_150", num_classes, input_size, **options)


@register_model(**_V2)
def deeplabv3_mobilevit_v2_175(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v2_175", num_classes, input_size, **options)


@register_model(**_V2)
def deeplabv3_mobilevit_v2_200(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v2_200", num_classes, input_size, **options)


@register_model(**_V3)
def deeplabv3_mobilevit_v3_xxs(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v3_xxs", num_classes, input_size, **options)


@register_model(**_V3)
def deeplabv3_mobilevit_v3_xs(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v3_xs", num_classes, input_size, **options)


@register_model(**_V3)
def deeplabv3_mobilevit_v3_s(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v3_s", num_classes, input_size, **options)


@register_model(**_V3_ON_V2)
def deeplabv3_mobilevit_v3_050(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v3_050", num_classes, input_size, **options)


@register_model(**_V3_ON_V2)
def deeplabv3_mobilevit_v3_075(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v3_075", num_classes, input_size, **options)


@register_model(**_V3_ON_V2)
def deeplabv3_mobilevit_v3_100(num_classes: int = VOC_CLASSES, input_size: int = 512, **options):
    return build_deeplabv3("deeplabv3_mobilevit_v3_100", num_classes, input_size, **options)
