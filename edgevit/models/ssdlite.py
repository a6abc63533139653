"""SSDLite detectors (Liu et al. 2016; Sandler et al. 2018) on MobileViT
v1, v2 and v3, as Apple's ml-cvnets trains them on COCO
(``config/detection/ssd_coco``) and the MobileViTv3 release does.

The backbone is the classifier's up to layer 5 (no ``conv_1x1_exp``, same
layer names, so ImageNet weights fill it by name). Six levels feed the
heads: layer 4 (stride 16), layer 5 (stride 32), three stride-2 separable
convolutions past it (64, 128, 256) and a global average pool of the last
one. Every level has a head: an optional 1x1 projection, then a separable
3x3 convolution (a 1x1 one on the pooled level) whose pointwise part cvnets
computes as one tensor of per-anchor [4 box, num_classes] channels; here it
is two convolutions, one per output, so that the graph has no slicing and
an int8 file quantises boxes and class logits each on its own scale.

Outputs, in this order (the detection contract, docs/design.md):

- ``boxes`` [B, A, 4]: SSD regressions against :func:`anchor_boxes`, in
  (ty, tx, th, tw) order as TFLite_Detection_PostProcess and MediaPipe read
  them, encoded as :mod:`edgevit.models.box_coding` encodes them (variances 0.1, 0.2)
  (cvnets computes (tx, ty, tw, th): its importer permutes the channels);
- ``scores`` [B, A, num_classes]: raw class logits, class 0 the background.

The extra levels and the heads use ReLU (cvnets' ``model.activation``), the
backbone Swish (``model.classification.activation``). Their convolutions
start Xavier-uniform, as cvnets resets them (the backbone's He-normal over
the fan-out gave the 1x1 output convolutions, 24 or 6 x classes outputs
over up to 512 inputs, logits and regressions of standard deviation 6-7 on
a fresh model: a first loss of ~135 a matched anchor).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import keras
import numpy as np
from keras import layers

from edgevit.errors import EdgevitError
from edgevit.layers import conv_norm_act
from edgevit.models.common import image_input
from edgevit.models.deeplabv3 import V2_WIDTHS, backbone_features
from edgevit.models.mobilevit import CVNETS_LICENCE, mobilevitv3_release
from edgevit.registry import COCO_MAP, Preprocessing, builder_options, register_model, url_weights

COCO_CLASSES = 81  # 80 categories and the background, class 0
INPUT_SIZE = 320
# Every published configuration (ml-cvnets' ssd_coco/mobilevit*.yaml, the
# MobileViTv3 release's ssd_mobilevitv3_*_320.yaml and ssd_coco/mobilevit_v3.yaml):
# the levels' strides (None: the global pool), their anchor aspect ratios,
# the heads' projection widths, which are also the extra levels' widths.
LEVEL_STRIDES = (16, 32, 64, 128, 256, None)
ASPECT_RATIOS = ((2, 3), (2, 3), (2, 3), (2, 3), (2, 3), (2,))
PROJ_CHANNELS = (512, 256, 256, 128, 128, 64)
MIN_SCALE, MAX_SCALE = 0.1, 1.05
HEAD_ACTIVATION = "relu"
# cvnets' reset of the extra levels' and the heads' convolutions (nn.init.xavier_uniform_, zero bias)
HEAD_INIT = {"class_name": "GlorotUniform", "config": {}}

# ml-cvnets resizes the whole image to 320x320 (no crop), pixels in [0, 1],
# no mean/std: v0.1 (MobileViT v1, the v1-based v3) with OpenCV bilinear,
# v0.2 (MobileViT v2, the v2-based v3) bicubic (image_augmentation.resize).
PREPROCESS_V01 = Preprocessing(input_size=INPUT_SIZE, resize_size=INPUT_SIZE, interpolation="bilinear")
PREPROCESS_V02 = Preprocessing(input_size=INPUT_SIZE, resize_size=INPUT_SIZE, interpolation="bicubic")
REFERENCE = "https://github.com/apple/ml-cvnets (config/detection/ssd_coco)"
REFERENCE_V3 = "https://github.com/micronDLA/MobileViTv3 (config/detection)"

# variant -> the registered MobileViT classifier it stands on
BACKBONES = {
    **{f"ssdlite_mobilevit_v1_{size}": f"mobilevit_v1_{size}" for size in ("xxs", "xs", "s")},
    **{f"ssdlite_mobilevit_v2_{w}": f"mobilevit_v2_{w}" for w in V2_WIDTHS},
    **{f"ssdlite_mobilevit_v3_{size}": f"mobilevit_v3_{size}" for size in ("xxs", "xs", "s", "050", "075", "100")},
}

CVNETS_V01_ZOO = "https://docs-assets.developer.apple.com/ml-research/models/cvnets/detection/"
CVNETS_V2_ZOO = "https://docs-assets.developer.apple.com/ml-research/models/cvnets-v2/detection/mobilevitv2/"


def cvnets_release(url: str, coco_map: float, channel_order: str):
    """An ml-cvnets model-zoo state dict (cvnets naming), its published COCO val mAP."""
    return url_weights(url, "", coco_map, CVNETS_LICENCE, tag=url.rsplit("/", 1)[1].removesuffix(".pt"),
                       naming="cvnets", channel_order=channel_order, metric=COCO_MAP)


def mobilevitv3_coco(folder: str, coco_map: float, channel_order: str):
    """The MobileViTv3 release's COCO checkpoint, stored as its classifiers are."""
    return mobilevitv3_release(folder, coco_map, channel_order, metric=COCO_MAP)


# Official COCO weights (``weights="imagenet"`` names every variant's official
# weights). v1 and the v1-based v3: trained on ml-cvnets v0.1, which reads
# images with OpenCV (BGR); v2 and the v2-based v3 on v0.2, PIL (RGB). mAPs:
# ml-cvnets v0.1's examples/README-mobilevit.md, ml-cvnets' model zoo
# (docs/source/en/general/README-model-zoo.md), MobileViTv3's README.
PRETRAINED = {
    **{f"ssdlite_mobilevit_v1_{size}": cvnets_release(f"{CVNETS_V01_ZOO}ssd_mobilevit_{size}_320.pt", coco_map, "BGR")
       for size, coco_map in (("xxs", 19.9), ("xs", 24.8), ("s", 27.9))},
    **{f"ssdlite_mobilevit_v2_{w}": cvnets_release(f"{CVNETS_V2_ZOO}coco-ssd-mobilevitv2-{width}.pt", coco_map, "RGB")
       for w, width, coco_map in (("050", "0.5", 21.24), ("075", "0.75", 24.57), ("100", "1.0", 26.47),
                                  ("125", "1.25", 27.85), ("150", "1.5", 28.83), ("175", "1.75", 29.52),
                                  ("200", "2.0", 30.21))},
    "ssdlite_mobilevit_v3_xxs": mobilevitv3_coco("mobilevitv3_XXS_coco_e200_1930", 19.3, "BGR"),
    "ssdlite_mobilevit_v3_xs": mobilevitv3_coco("mobilevitv3_XS_coco_e200_2560", 25.6, "BGR"),
    "ssdlite_mobilevit_v3_s": mobilevitv3_coco("mobilevitv3_S_coco_e200_2730", 27.3, "BGR"),
    "ssdlite_mobilevit_v3_050": mobilevitv3_coco("mobilevitv3_coco_0_5_0", 21.8, "RGB"),
    "ssdlite_mobilevit_v3_075": mobilevitv3_coco("mobilevitv3_coco_0_7_5", 25.0, "RGB"),
    "ssdlite_mobilevit_v3_100": mobilevitv3_coco("mobilevitv3_coco_1_0_0", 27.0, "RGB"),
}


@dataclass(frozen=True)
class Level:
    stride: int | None            # None: the global pool
    aspect_ratios: tuple[int, ...]
    proj_channels: int

    @property
    def anchors(self) -> int:
        """Per position: a small and a large square box, and each aspect ratio both ways."""
        return 2 + 2 * len(self.aspect_ratios)


LEVELS = tuple(Level(*args) for args in zip(LEVEL_STRIDES, ASPECT_RATIOS, PROJ_CHANNELS))


def level_sizes(input_size: int) -> list[int]:
    """Feature-map side of each level: every stride-2 3x3 convolution (padding
    1) rounds up, the pooled level is 1x1."""
    side = math.ceil(input_size / LEVEL_STRIDES[0])
    sizes = [side]
    for level in LEVELS[1:]:
        side = 1 if level.stride is None else math.ceil(side / 2)
        sizes.append(side)
    return sizes


def anchor_boxes(model: keras.Model) -> np.ndarray:
    """float32 [A, 4] (ycenter, xcenter, height, width), normalised to [0, 1],
    in the order of ``model``'s A axis: level by level, row-major positions,
    and at each position cvnets' order: the small square box (scale s_k),
    the large one (sqrt(s_k s_k+1)), then each aspect ratio r as
    (w, h) = (s_k sqrt(r), s_k / sqrt(r)) and (s_k / sqrt(r), s_k sqrt(r));
    scales spread evenly over [0.1, 1.05], every value clipped to [0, 1]."""
    size = int(model.inputs[0].shape[1])
    scales = np.linspace(MIN_SCALE, MAX_SCALE, len(LEVELS) + 1)
    out = []
    for i, (level, side) in enumerate(zip(LEVELS, level_sizes(size))):
        small, large = scales[i], math.sqrt(scales[i] * scales[i + 1])
        shapes = [(small, small), (large, large)]  # (height, width)
        for ratio in level.aspect_ratios:
            root = math.sqrt(ratio)
            shapes += [(small / root, small * root), (small * root, small / root)]
        centres = (np.arange(side) + 0.5) / side
        for y in centres:
            for x in centres:
                out.extend((y, x, h, w) for h, w in shapes)
    anchors = np.clip(np.asarray(out, np.float64), 0.0, 1.0).astype(np.float32)
    boxes = model.outputs[0].shape[1] if model.outputs else None
    if boxes != len(anchors):
        raise EdgevitError(f"{model.name} is not an SSDLite detector at {size} px: its first output has {boxes} "
                           f"boxes, the SSDLite levels give {len(anchors)} anchors.")
    return anchors


def extra_level(x, channels: int, name: str):
    """A stride-2 separable 3x3 convolution: depthwise + BatchNorm, then
    pointwise + BatchNorm + ReLU."""
    x = conv_norm_act(x, None, 3, 2, depthwise=True, activation=None, initializer=HEAD_INIT, name=f"{name}.dw_conv")
    return conv_norm_act(x, channels, 1, activation=HEAD_ACTIVATION, initializer=HEAD_INIT, name=f"{name}.pw_conv")


def pooled_level(x, channels: int, name: str):
    """Global average pool, then a 1x1 convolution (no bias, no norm) + ReLU."""
    x = layers.GlobalAveragePooling2D(keepdims=True, name=f"{name}.pool")(x)
    return conv_norm_act(x, channels, 1, norm=False, use_bias=False, activation=HEAD_ACTIVATION,
                         initializer=HEAD_INIT, name=f"{name}.proj")


def ssd_head(x, level: Level, num_classes: int, name: str):
    """(boxes [B, H*W*anchors, 4], logits [B, H*W*anchors, num_classes])."""
    if level.stride is not None:
        if level.proj_channels != x.shape[-1]:
            x = conv_norm_act(x, level.proj_channels, 1, activation=HEAD_ACTIVATION, initializer=HEAD_INIT,
                              name=f"{name}.proj_layer")
        x = conv_norm_act(x, None, 3, depthwise=True, activation=None, initializer=HEAD_INIT,
                          name=f"{name}.loc_cls_layer.dw_conv")
    positions = int(x.shape[1]) * int(x.shape[2]) * level.anchors
    outputs = []
    for part, channels in (("box", 4), ("class", num_classes)):
        y = layers.Conv2D(level.anchors * channels, 1, kernel_initializer=HEAD_INIT, name=f"{name}.{part}_conv")(x)
        outputs.append(layers.Reshape((positions, channels), name=f"{name}.{part}_reshape")(y))
    return tuple(outputs)


def build_ssdlite(name: str, num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, *, dropout: float = 0.0,
                  attn_dropout: float = 0.0, ffn_dropout: float = 0.0) -> keras.Model:
    inputs = image_input(input_size)
    _, x16, x32 = backbone_features(inputs, BACKBONES[name], 32, dropout=dropout, attn_dropout=attn_dropout,
                                    ffn_dropout=ffn_dropout)
    maps = [x16, x32]
    for level in LEVELS[2:]:
        stage = f"extra_layers.os_{level.stride}" if level.stride else "extra_layers.global"
        make = extra_level if level.stride else pooled_level
        maps.append(make(maps[-1], level.proj_channels, stage))
    boxes, scores = zip(*(ssd_head(x, level, num_classes, f"ssd_heads.{i}")
                          for i, (x, level) in enumerate(zip(maps, LEVELS))))
    outputs = [layers.Concatenate(axis=1, name="boxes")(list(boxes)),
               layers.Concatenate(axis=1, name="scores")(list(scores))]
    return keras.Model(inputs, outputs, name=name)


def is_detector(model) -> bool:
    """Whether ``model`` is an SSD detector: two outputs, boxes [B, A, 4] and
    class logits [B, A, C], told by their shapes: a QAT copy keeps the names
    "boxes" and "scores" (edgevit.quantize.qat), but QAT ``.keras`` files
    saved before it did name them after their last quantizers, and load."""
    return len(model.outputs) == 2 and int(model.outputs[0].shape[-1]) == 4 and len(model.outputs[1].shape) == 3


_COMMON = dict(default_input_size=INPUT_SIZE, task="detection", num_classes=COCO_CLASSES,
               options=builder_options(build_ssdlite), checkpoint_formats=("cvnets",), pretrained=PRETRAINED)
_V1 = dict(family="ssdlite_mobilevit_v1", preprocessing=PREPROCESS_V01, reference=REFERENCE, **_COMMON)
_V2 = dict(family="ssdlite_mobilevit_v2", preprocessing=PREPROCESS_V02, reference=REFERENCE, **_COMMON)
_V3 = dict(family="ssdlite_mobilevit_v3", preprocessing=PREPROCESS_V01, reference=REFERENCE_V3, **_COMMON)
_V3_V2 = dict(_V3, preprocessing=PREPROCESS_V02)


@register_model(**_V1)
def ssdlite_mobilevit_v1_xxs(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v1_xxs", num_classes, input_size, **options)


@register_model(**_V1)
def ssdlite_mobilevit_v1_xs(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v1_xs", num_classes, input_size, **options)


@register_model(**_V1)
def ssdlite_mobilevit_v1_s(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v1_s", num_classes, input_size, **options)


@register_model(**_V2)
def ssdlite_mobilevit_v2_050(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v2_050", num_classes, input_size, **options)


@register_model(**_V2)
def ssdlite_mobilevit_v2_075(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v2_075", num_classes, input_size, **options)


@register_model(**_V2)
def ssdlite_mobilevit_v2_100(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v2_100", num_classes, input_size, **options)


@register_model(**_V2)
def ssdlite_mobilevit_v2_125(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v2_125", num_classes, input_size, **options)


@register_model(**_V2)
def ssdlite_mobilevit_v2_150(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v2_150", num_classes, input_size, **options)


@register_model(**_V2)
def ssdlite_mobilevit_v2_175(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v2_175", num_classes, input_size, **options)


@register_model(**_V2)
def ssdlite_mobilevit_v2_200(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v2_200", num_classes, input_size, **options)


@register_model(**_V3)
def ssdlite_mobilevit_v3_xxs(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v3_xxs", num_classes, input_size, **options)


@register_model(**_V3)
def ssdlite_mobilevit_v3_xs(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v3_xs", num_classes, input_size, **options)


@register_model(**_V3)
def ssdlite_mobilevit_v3_s(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v3_s", num_classes, input_size, **options)


@register_model(**_V3_V2)
def ssdlite_mobilevit_v3_050(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v3_050", num_classes, input_size, **options)


@register_model(**_V3_V2)
def ssdlite_mobilevit_v3_075(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v3_075", num_classes, input_size, **options)


@register_model(**_V3_V2)
def ssdlite_mobilevit_v3_100(num_classes: int = COCO_CLASSES, input_size: int = INPUT_SIZE, **options):
    return build_ssdlite("ssdlite_mobilevit_v3_100", num_classes, input_size, **options)
