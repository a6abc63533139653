"""timm state dicts (``.pth``, ``.bin``, ``.safetensors``) for the families
timm has. Naming follows timm's module paths (reference: pytorch-image-models
``timm/models/mobilevit.py`` and ``byobnet.py``, timm 1.0)."""
from __future__ import annotations

import re

from converters.common import Importer, Rule, register


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
