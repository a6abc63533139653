"""timm state dicts (``.pth``, ``.bin``, ``.safetensors``) for the families
timm has. Naming follows timm's module paths (reference: pytorch-image-models
``timm/models/mobilevit.py`` and ``byobnet.py``, timm 1.0)."""
from __future__ import annotations

import re

from collections.abc import Callable

from .layouts import pos_embed_transform, reshaped
from .registry import Importer, register
from .rules import Rule


def stage(offset: int, template: str, norm: str = "bn"):
    """Key = ``template`` filled with the match groups, the first (a cvnets
    layer number) shifted by ``offset``, and a ``norm`` group renamed
    (cvnets BatchNorm ``norm`` -> timm ``bn``)."""

    def key(m: re.Match) -> str:
        groups = [norm if g == "norm" else g for g in m.groups()]
        groups[0] = str(int(groups[0]) + offset)
        return template.format(*groups)

    return key

TIMM = "https://github.com/huggingface/pytorch-image-models"

# MobileViT v1 / v2: timm builds them with ByobNet ("stages.N.M" = cvnets
# "layer_{N+1}.M"), MobileNetV2 blocks are byobnet BottleneckBlocks.
_MOBILENET = [
    Rule(r"stem\.conv", "stem.conv"),
    Rule(r"stem\.norm", "stem.bn"),
    Rule(r"layer_(\d)\.(\d+)\.exp_1x1\.(conv|norm)", stage(-1, "stages.{0}.{1}.conv1_1x1.{2}")),
    Rule(r"layer_(\d)\.(\d+)\.conv_3x3\.(conv|norm)", stage(-1, "stages.{0}.{1}.conv2_kxk.{2}")),
    Rule(r"layer_(\d)\.(\d+)\.red_1x1\.(conv|norm)", stage(-1, "stages.{0}.{1}.conv3_1x1.{2}")),
    Rule(r"layer_(\d)\.1\.local_rep\.conv_3x3\.(conv|norm)", stage(-1, "stages.{0}.1.conv_kxk.{1}")),
    Rule(r"layer_(\d)\.1\.local_rep\.conv_1x1\.conv", stage(-1, "stages.{0}.1.conv_1x1")),
    Rule(r"layer_(\d)\.1\.global_rep\.(\d+)\.(norm1|norm2|mlp\.fc1|mlp\.fc2)",
         stage(-1, "stages.{0}.1.transformer.{1}.{2}")),
    Rule(r"layer_(\d)\.1\.global_rep\.(\d+)\.attn/(\w+)", stage(-1, "stages.{0}.1.transformer.{1}.attn.{2}")),
    Rule(r"layer_(\d)\.1\.global_rep\.\d+", stage(-1, "stages.{0}.1.norm")),
    Rule(r"layer_(\d)\.1\.conv_proj\.(conv|norm)", stage(-1, "stages.{0}.1.conv_proj.{1}")),
    Rule(r"layer_(\d)\.1\.fusion\.(conv|norm)", stage(-1, "stages.{0}.1.conv_fusion.{1}")),
    Rule(r"conv_1x1_exp\.conv", "final_conv.conv"),
    Rule(r"conv_1x1_exp\.norm", "final_conv.bn"),
    Rule(r"head\.fc", "head.fc"),
]


def _mobilevit_rules(dense_as_conv: bool) -> list[Rule]:
    """v2 keeps its attention and MLP projections as 1x1 convs."""
    return [Rule(r.pattern, r.key, dense_as_conv=dense_as_conv and "global_rep" in r.pattern
                 and ("attn" in r.pattern or "mlp" in r.pattern)) for r in _MOBILENET]


register(Importer("timm", "mobilevit_v1", lambda model: _mobilevit_rules(False), reference=TIMM,
                  notes="timm mobilevit_xxs / _xs / _s"))
register(Importer("timm", "mobilevit_v2", lambda model: _mobilevit_rules(True), reference=TIMM,
                  notes="timm mobilevitv2_050 ... _200 (LinearSelfAttention and MLP as 1x1 convs)"))

# edgevit variant -> timm model name (tests build the reference with it)
TIMM_NAMES = {
    "mobilevit_v1_xxs": "mobilevit_xxs", "mobilevit_v1_xs": "mobilevit_xs", "mobilevit_v1_s": "mobilevit_s",
    **{f"mobilevit_v2_{w}": f"mobilevitv2_{w}" for w in ("050", "075", "100", "125", "150", "175", "200")},
}


# The ViT-like families: edgevit's layer names are timm's module paths
# (``blocks.3.attn/qkv`` = ``blocks.3.attn.qkv``); tokens and position
# embeddings are variables of their own layers.
def _mirror_rules(*extra: Rule) -> Callable:
    def rules(model) -> list[Rule]:
        return [
            *extra,
            Rule(r"prefix_tokens/(\w+)", r"\1", variable=True),
            Rule(r"(cls_token\w*)/\w+", r"\1", variable=True),
            Rule(r"(pos_embed\w*)/pos_embed", r"\1", variable=True, transform=pos_embed_transform()),
            Rule(r"([\w.]+)/(\w+)", r"\1.\2"),
            Rule(r"([\w.]+)", r"\1"),
        ]
    return rules


_TIMM_FAMILIES = {
    "vit": ("head",), "deit": ("head",), "convit": ("head",), "pit": ("head",),
    "crossvit": ("head.0", "head.1"), "mlp_mixer": ("head",),
}
for _family, _head in _TIMM_FAMILIES.items():
    register(Importer("timm", _family, _mirror_rules(), reference=TIMM, head=_head))
# ResMLP: Affine norms (alpha, beta as [1, 1, C]) and LayerScale vectors without ".weight"
register(Importer("timm", "resmlp", _mirror_rules(
    Rule(r"([\w.]+)/(alpha|beta)", r"\1.\2", variable=True, transform=reshaped),
    Rule(r"(blocks\.\d+\.ls\d)/gamma", r"\1", variable=True)), reference=TIMM, head=("head",)))

TIMM_NAMES.update({
    "vit_tiny16": "vit_tiny_patch16_224", "vit_small16": "vit_small_patch16_224",
    "vit_base16": "vit_base_patch16_224", "vit_base32": "vit_base_patch32_224",
    "vit_large16": "vit_large_patch16_224",
    # the first variant of each family is the one the default tests check
    "deit_tiny_distilled": "deit_tiny_distilled_patch16_224", "deit_tiny": "deit_tiny_patch16_224",
    "deit_small": "deit_small_patch16_224", "deit_base": "deit_base_patch16_224",
    "deit_small_distilled": "deit_small_distilled_patch16_224",
    "deit_base_distilled": "deit_base_distilled_patch16_224",
    "convit_tiny": "convit_tiny", "convit_small": "convit_small", "convit_base": "convit_base",
    "pit_ti": "pit_ti_224", "pit_xs": "pit_xs_224", "pit_s": "pit_s_224", "pit_b": "pit_b_224",
    "mixer_s16": "mixer_s16_224", "mixer_b16": "mixer_b16_224",
    "resmlp_12": "resmlp_12_224", "resmlp_24": "resmlp_24_224", "resmlp_36": "resmlp_36_224",
    "crossvit_tiny": "crossvit_tiny_240", "crossvit_9": "crossvit_9_240", "crossvit_small": "crossvit_small_240",
    "crossvit_15": "crossvit_15_240", "crossvit_18": "crossvit_18_240", "crossvit_base": "crossvit_base_240",
})

# PVT v2: edgevit's layer names are timm's module paths, no position embedding
register(Importer("timm", "pvt_v2", _mirror_rules(), reference=TIMM, head=("head",)))
TIMM_NAMES.update({f"pvt_v2_{v}": f"pvt_v2_{v}" for v in ("b0", "b1", "b2", "b2_li", "b3", "b4", "b5")})

# The official whai362/PVT release checkpoints number stages from 1 and keep
# the depthwise conv in a wrapper: ``patch_embed1..4`` (the stem, then each
# stage's downsampling), ``block{s}.{i}``, ``norm{s}``, ``mlp.dwconv.dwconv``
# (timm's checkpoint_filter_fn maps them to timm's names the same way).
_PVT_OFFICIAL = (
    Rule(r"patch_embed\.(proj|norm)", r"patch_embed1.\1"),
    Rule(r"stages\.(\d)\.downsample\.(proj|norm)", stage(1, "patch_embed{0}.{1}", norm="norm")),
    Rule(r"stages\.(\d)\.blocks\.(\d+)\.mlp\.dwconv", stage(1, "block{0}.{1}.mlp.dwconv.dwconv", norm="norm")),
    Rule(r"stages\.(\d)\.blocks\.(\d+)\.(.+)", stage(1, "block{0}.{1}.{2}", norm="norm")),
    Rule(r"stages\.(\d)\.norm", stage(1, "norm{0}", norm="norm")),
)
register(Importer("official", "pvt_v2", _mirror_rules(*_PVT_OFFICIAL), head=("head",),
                  reference="https://github.com/whai362/PVT (classification/pvt_v2.py)",
                  notes="official release checkpoints (patch_embed1..4, block1..4, norm1..4)"))

# Swin v1 / v2: edgevit's names are timm's (``head`` is timm's ``head.fc``).
_SWIN = (Rule(r"head", "head.fc"), Rule(r"([\w.]+)/(cpb_mlp\.\d)", r"\1.\2"))
for _family in ("swin", "swinv2"):
    register(Importer("timm", _family, _mirror_rules(*_SWIN), reference=TIMM, head=("head",)))

# The official Swin-Transformer releases (``{"model": state_dict}``) merge
# patches at the end of a stage, timm at the start of the next (timm's
# checkpoint_filter_fn renames them), and name the classifier ``head``.
SWIN_OFFICIAL = "https://github.com/microsoft/Swin-Transformer"
_SWIN_OFFICIAL_DOWNSAMPLE = Rule(r"layers\.(\d+)\.downsample\.(norm|reduction)",
                                 lambda m: f"layers.{int(m.group(1)) - 1}.downsample.{m.group(2)}")
for _family in ("swin", "swinv2"):
    register(Importer("official", _family, _mirror_rules(_SWIN_OFFICIAL_DOWNSAMPLE, Rule(r"head", "head"), _SWIN[1]),
                      reference=SWIN_OFFICIAL, head=("head",),
                      notes="official release checkpoints (downsample at the end of a stage)"))

TIMM_NAMES.update({
    "swin_tiny": "swin_tiny_patch4_window7_224", "swin_small": "swin_small_patch4_window7_224",
    "swin_base": "swin_base_patch4_window7_224", "swin_large": "swin_large_patch4_window7_224",
    "swin_base_384": "swin_base_patch4_window12_384", "swin_large_384": "swin_large_patch4_window12_384",
    "swinv2_tiny": "swinv2_tiny_window8_256", "swinv2_small": "swinv2_small_window8_256",
    "swinv2_base": "swinv2_base_window8_256", "swinv2_tiny_w16": "swinv2_tiny_window16_256",
    "swinv2_small_w16": "swinv2_small_window16_256", "swinv2_base_w16": "swinv2_base_window16_256",
    "swinv2_base_w12_192": "swinv2_base_window12_192", "swinv2_large_w12_192": "swinv2_large_window12_192",
    "swinv2_base_w12to16": "swinv2_base_window12to16_192to256",
    "swinv2_large_w12to16": "swinv2_large_window12to16_192to256",
    "swinv2_base_w12to24": "swinv2_base_window12to24_192to384",
    "swinv2_large_w12to24": "swinv2_large_window12to24_192to384",
})
