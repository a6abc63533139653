"""timm state dicts (``.pth``, ``.bin``, ``.safetensors``) for the families
timm has. Naming follows timm's module paths (reference: pytorch-image-models
``timm/models/mobilevit.py`` and ``byobnet.py``, timm 1.0)."""
from __future__ import annotations

import re

from converters.common import Importer, Rule, pos_embed_transform, register


def stage(offset: int, template: str):
    """Key = ``template`` filled with the match groups, the first (a cvnets
    layer number) shifted by ``offset``, and BatchNorm ``norm`` -> ``bn``."""

    def key(m: re.Match) -> str:
        groups = ["bn" if g == "norm" else g for g in m.groups()]
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


# ViT / DeiT: edgevit's layer names are timm's module paths already.
def _vit_rules(model) -> list[Rule]:
    prefix = sum(1 for w in model.weights if w.path.startswith("prefix_tokens/"))
    return [
        Rule(r"prefix_tokens/(cls_token|dist_token)", r"\1", variable=True),
        Rule(r"pos_embed/pos_embed", "pos_embed", variable=True, transform=pos_embed_transform(prefix)),
        Rule(r"(blocks\.\d+\.attn)/(qkv|proj)", r"\1.\2"),
        Rule(r"([\w.]+)", r"\1"),
    ]


register(Importer("timm", "vit", _vit_rules, reference=TIMM, head=("head",),
                  notes="timm vit_*_patch16/32_224 (vision_transformer.py)"))
register(Importer("timm", "deit", _vit_rules, reference=TIMM, head=("head",),
                  notes="timm deit_*_patch16_224 and deit_*_distilled_patch16_224"))

TIMM_NAMES.update({
    "vit_tiny16": "vit_tiny_patch16_224", "vit_small16": "vit_small_patch16_224",
    "vit_base16": "vit_base_patch16_224", "vit_base32": "vit_base_patch32_224",
    "vit_large16": "vit_large_patch16_224",
    # the first variant of each family is the one the default tests check
    "deit_tiny_distilled": "deit_tiny_distilled_patch16_224", "deit_tiny": "deit_tiny_patch16_224",
    "deit_small": "deit_small_patch16_224", "deit_base": "deit_base_patch16_224",
    "deit_small_distilled": "deit_small_distilled_patch16_224",
    "deit_base_distilled": "deit_base_distilled_patch16_224",
})
