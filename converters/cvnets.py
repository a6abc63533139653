"""Apple ml-cvnets checkpoints of MobileViT v1/v2, and the official
MobileViTv3 release checkpoints (``checkpoint_ema_best.pt``), which use the
same cvnets naming.

Module paths followed (the classification models and their blocks):

- MobileViT v1 and v1-based v3: ml-cvnets d38a116fe134a8cd5db18670764fdaafd39a5d4f
  (``cvnets/models/classification/mobilevit.py``, ``modules/mobilevit_block.py``,
  ``modules/transformer.py``, ``modules/mobilenetv2.py``), with the files of
  micronDLA/MobileViTv3 d381beb (``MobileViTv3-v1/``) on top;
- MobileViT v2 and v2-based v3: ml-cvnets 84d992f413e52c0468f86d23196efd9dad885e6f
  with micronDLA/MobileViTv3 d381beb (``MobileViTv3-v2/``) on top.

The names are unchanged in ml-cvnets 7771756 (latest), so checkpoints of the
newer cvnets model zoo load as well. edgevit's layer names already mirror
cvnets' module paths; a cvnets ``ConvLayer`` adds a ``.block`` level.
"""
from __future__ import annotations

import re

import numpy as np

from edgevit.models.ssdlite import LEVELS

from .registry import Importer, register
from .rules import Rule

CVNETS = "https://github.com/apple/ml-cvnets"
V3 = "https://github.com/micronDLA/MobileViTv3"
CVNETS_V1_COMMIT = "d38a116fe134a8cd5db18670764fdaafd39a5d4f"
CVNETS_V2_COMMIT = "84d992f413e52c0468f86d23196efd9dad885e6f"
MOBILEVITV3_COMMIT = "d381beb"

_COMMON = [
    Rule(r"stem\.(conv|norm)", r"conv_1.block.\1"),
    Rule(r"(layer_\d\.\d+)\.(exp_1x1|conv_3x3|red_1x1)\.(conv|norm)", r"\1.block.\2.block.\3"),
    Rule(r"(layer_\d\.1)\.conv_proj\.(conv|norm)", r"\1.conv_proj.block.\2"),
]

# v1 / v1-based v3: TransformerEncoder = pre_norm_mha [LayerNorm, MultiHeadAttention,
# Dropout] and pre_norm_ffn [LayerNorm, Linear, act, Dropout, Linear, Dropout].
V1_BACKBONE = _COMMON + [
    Rule(r"(layer_\d\.1\.local_rep\.conv_(?:3x3|1x1))\.(conv|norm)", r"\1.block.\2"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.norm1", r"\1.pre_norm_mha.0"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.attn/qkv", r"\1.pre_norm_mha.1.qkv_proj"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.attn/proj", r"\1.pre_norm_mha.1.out_proj"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.norm2", r"\1.pre_norm_ffn.0"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.mlp\.fc1", r"\1.pre_norm_ffn.1"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.mlp\.fc2", r"\1.pre_norm_ffn.4"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)", r"\1"),
    Rule(r"(layer_\d\.1)\.fusion\.(conv|norm)", r"\1.fusion.block.\2"),
]
V1_RULES = V1_BACKBONE + [
    Rule(r"conv_1x1_exp\.(conv|norm)", r"conv_1x1_exp.block.\1"),
    Rule(r"head\.fc", "classifier.fc"),
]

# v2 / v2-based v3: local_rep is an unnamed Sequential, LinearAttnFFN =
# pre_norm_attn [GroupNorm, LinearSelfAttention, Dropout] and pre_norm_ffn
# [GroupNorm, ConvLayer, Dropout, ConvLayer, Dropout]; every projection is a
# 1x1 ConvLayer; the classifier is Sequential(GlobalPool, Linear).
V2_BACKBONE = _COMMON + [
    Rule(r"(layer_\d\.1\.local_rep)\.conv_3x3\.(conv|norm)", r"\1.0.block.\2"),
    Rule(r"(layer_\d\.1\.local_rep)\.conv_1x1\.conv", r"\1.1.block.conv"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.norm1", r"\1.pre_norm_attn.0"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.attn/(qkv_proj|out_proj)", r"\1.pre_norm_attn.1.\2.block.conv",
         dense_as_conv=True),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.norm2", r"\1.pre_norm_ffn.0"),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.mlp\.fc1", r"\1.pre_norm_ffn.1.block.conv", dense_as_conv=True),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)\.mlp\.fc2", r"\1.pre_norm_ffn.3.block.conv", dense_as_conv=True),
    Rule(r"(layer_\d\.1\.global_rep\.\d+)", r"\1"),
]
V2_RULES = V2_BACKBONE + [Rule(r"head\.fc", "classifier.1")]

# ml-cvnets v0.1 (d38a116, data/datasets/dataset_base.py) reads training and
# validation images with cv2.imread: Apple's MobileViT v1 files and the
# MobileViTv3 files trained on it (XXS/XS/S, _L2) expect BGR. v0.2 (84d992f,
# data/datasets/classification/imagenet.py) reads them with PIL: RGB.
register(Importer("cvnets", "mobilevit_v1", lambda model: V1_RULES, reference=f"{CVNETS}/tree/{CVNETS_V1_COMMIT}",
                  notes="ml-cvnets MobileViT v1 (mobilevit_xxs/xs/s.pt)", channel_order=lambda model: "BGR"))
register(Importer("cvnets", "mobilevit_v2", lambda model: V2_RULES, reference=f"{CVNETS}/tree/{CVNETS_V2_COMMIT}",
                  notes="ml-cvnets MobileViT v2 (mobilevitv2-0.5 ... 2.0.pt)"))


def _v1_based(model) -> bool:
    """v3 has v1 blocks (MultiHeadAttention, fusion) or v2 blocks (no fusion)."""
    return any(layer.name.endswith(".fusion.conv") for layer in model.layers)


register(Importer("cvnets", "mobilevit_v3", lambda model: V1_RULES if _v1_based(model) else V2_RULES,
                  reference=f"{V3}/tree/{MOBILEVITV3_COMMIT}",
                  notes="MobileViTv3 release checkpoint_ema_best.pt (cvnets naming)",
                  channel_order=lambda model: "BGR" if _v1_based(model) else "RGB"))


# DeepLabV3 segmenters (``cvnets/models/segmentation/enc_dec.py``,
# ``heads/deeplabv3.py``, ``modules/aspp_block.py`` at the commits above):
# the backbone under ``encoder.`` in the classifier's naming, the head under
# ``seg_head.``. v0.2 holds the classifier conv as ``seg_head.classifier``;
# v0.1 (Apple's v1 VOC files, the MobileViTv3-v1 VOC release) one level down,
# ``seg_head.classifier.classifier``, beside its dropout and upsampling.
SEGMENTATION_HEAD = [
    Rule(r"aspp\.convs\.([0-3])\.(conv|norm)", r"seg_head.aspp.aspp_layer.convs.\1.block.\2"),
    Rule(r"aspp\.convs\.4\.conv_1x1\.(conv|norm)", r"seg_head.aspp.aspp_layer.convs.4.aspp_pool.conv_1x1.block.\1"),
    Rule(r"aspp\.project\.(conv|norm)", r"seg_head.aspp.aspp_layer.project.block.\1"),
    Rule(r"classifier\.conv", "seg_head.classifier.block.conv"),
]
AUX_HEAD = "seg_head.aux_head."  # trained against layer 4 (v2's VOC config), unused at inference
V01_CLASSIFIER = "seg_head.classifier.classifier."


def encoder(rules: list[Rule]) -> list[Rule]:
    return [Rule(r.pattern, f"encoder.{r.key}", dense_as_conv=r.dense_as_conv) for r in rules]


def segmenter_tensors(tensors: dict) -> dict:
    """Both cvnets versions' classifier under one name; the auxiliary head left out."""
    return {key.replace(V01_CLASSIFIER, "seg_head.classifier.", 1): value for key, value in tensors.items()
            if not key.startswith(AUX_HEAD)}


def _segmenter(family: str, backbone: list[Rule], **importer) -> Importer:
    return register(Importer("cvnets", family, lambda model: encoder(backbone) + SEGMENTATION_HEAD,
                             head=("classifier.conv",), merged=segmenter_tensors, **importer))


_segmenter("deeplabv3_mobilevit_v1", V1_BACKBONE, reference=f"{CVNETS}/tree/{CVNETS_V1_COMMIT}",
           notes="ml-cvnets DeepLabV3 MobileViT v1 (deeplabv3_mobilevit_xxs/xs/s.pt)",
           channel_order=lambda model: "BGR")
# ml-cvnets v0.2 dilates the v2 blocks' depthwise 3x3 below output stride 32
# (MobileViTBlockv2's ``dilation``), which its VOC checkpoints were trained with.
_segmenter("deeplabv3_mobilevit_v2", V2_BACKBONE, reference=f"{CVNETS}/tree/{CVNETS_V2_COMMIT}",
           notes="ml-cvnets DeepLabV3 MobileViT v2 (deeplabv3-mobilevitv2-0.5 ... 2.0.pt)",
           options={"dilate_blocks": True})
# The MobileViTv3 VOC releases registered (XXS/XS/S) are v1-based: cvnets v0.1, BGR.
_segmenter("deeplabv3_mobilevit_v3", V1_BACKBONE, reference=f"{V3}/tree/{MOBILEVITV3_COMMIT}",
           notes="MobileViTv3 VOC release checkpoint_ema_best.pt (mobilevitv3_*_voc_*)",
           channel_order=lambda model: "BGR")
# The v2-based ones (mobilevitv3_voc_0_5_0, _1_0_0) are cvnets v0.2: RGB, v0.2's classifier name, and
# blocks dilated below output stride 32 as cvnets' v2 (MobileViTBlockv3 takes the layer's dilation).
_segmenter("deeplabv3_mobilevit_v3_v2based", V2_BACKBONE, reference=f"{V3}/tree/{MOBILEVITV3_COMMIT}",
           notes="MobileViTv3 VOC release checkpoint_ema_best.pt (mobilevitv3_voc_0_5_0, _1_0_0)",
           options={"dilate_blocks": True})


# --- SSDLite detectors (cvnets' SingleShotMaskDetector, cvnets/models/detection/ssd.py) ---------------
# The backbone sits under ``encoder.``; the extra levels and heads keep
# cvnets' module paths, but for the heads' last pointwise convolution, which
# edgevit computes as two (boxes, class logits): ``split_ssd_heads`` reads
# cvnets' one tensor as those two, under the names the rules give them.
SSD_HEAD = re.compile(r"(ssd_heads\.(\d+))\.loc_cls_layer\.(?:pw_conv\.)?block\.conv\.(weight|bias)")
# cvnets regresses (tx, ty, tw, th); edgevit's boxes are (ty, tx, th, tw)
YX_ORDER = (1, 0, 3, 2)

SSD_RULES = [
    Rule(r"(extra_layers\.os_\d+)\.(dw_conv|pw_conv)\.(conv|norm)", r"\1.\2.block.\3"),
    Rule(r"extra_layers\.global\.proj\.conv", "extra_layers.os_-1.1.block.conv"),
    Rule(r"(ssd_heads\.\d+)\.(proj_layer|loc_cls_layer\.dw_conv)\.(conv|norm)", r"\1.\2.block.\3"),
    Rule(r"(ssd_heads\.\d+)\.(box|class)_conv", r"\1.\2_conv"),
]


def split_ssd_heads(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each head's [anchors * (4 + classes)] output channels (per anchor: 4
    box values, then the class logits) as ``box_conv`` (anchors * 4, in
    (y, x, h, w) order) and ``class_conv`` (anchors * classes) tensors."""
    out = {}
    for key, value in tensors.items():
        m = SSD_HEAD.fullmatch(key)
        if m is None:
            out[key] = value
            continue
        head, level, leaf = m.groups()
        anchors = LEVELS[int(level)].anchors if int(level) < len(LEVELS) else 0
        if not anchors or value.shape[0] % anchors or value.shape[0] // anchors <= 4:
            out[key] = value  # not a head edgevit has: the import reports it as a tensor with no place
            continue
        per_anchor = value.reshape(anchors, value.shape[0] // anchors, *value.shape[1:])
        out[f"{head}.box_conv.{leaf}"] = per_anchor[:, YX_ORDER].reshape(anchors * 4, *value.shape[1:])
        out[f"{head}.class_conv.{leaf}"] = per_anchor[:, 4:].reshape(-1, *value.shape[1:])
    return out


def _ssd_rules(model) -> list[Rule]:
    return encoder(V1_BACKBONE if _v1_based(model) else V2_BACKBONE) + SSD_RULES


# The class count: the pooled level's class_conv rows over its anchors.
for family, notes in (("ssdlite_mobilevit_v1", "ml-cvnets v0.1 SSDLite MobileViT (ssd_mobilevit_*_320.pt)"),
                      ("ssdlite_mobilevit_v2", "ml-cvnets SSDLite MobileViTv2 (coco-ssd-mobilevitv2-*.pt)"),
                      ("ssdlite_mobilevit_v3", "MobileViTv3 release COCO checkpoint_ema_best.pt")):
    register(Importer("cvnets", family, _ssd_rules, reference=f"{CVNETS}/blob/main/cvnets/models/detection/ssd.py",
                      head=(f"ssd_heads.{len(LEVELS) - 1}.class_conv",), notes=notes, merged=split_ssd_heads,
                      head_classes=lambda value: int(value.shape[0]) // LEVELS[-1].anchors,
                      channel_order=lambda model: "BGR" if _v1_based(model) else "RGB"))
