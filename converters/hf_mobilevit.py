"""Hugging Face ``MobileViTForSemanticSegmentation`` and
``MobileViTV2ForSemanticSegmentation`` checkpoints (``model.safetensors`` or
``pytorch_model.bin``): apple/deeplabv3-mobilevit-{xx-small,x-small,small},
apple/mobilevitv2-1.0-voc-deeplabv3 and their fine-tuned descendants.

Naming follows transformers' ``models/mobilevit/modeling_mobilevit.py`` and
``models/mobilevitv2/modeling_mobilevitv2.py`` (transformers 5.x; unchanged
since the ports, 4.21 and 4.28): ``mobilevit[v2].conv_stem``,
``encoder.layer.N`` (``layer.I`` in the MobileNet stages; ``downsampling_layer``,
``conv_kxk``, ``conv_1x1``, ``transformer.layer.I``, ``layernorm``,
``conv_projection`` and v1's ``fusion`` in the MobileViT stages) and
``segmentation_head`` (``aspp.convs.0-4``, ``aspp.project``, ``classifier``).
A ``MobileViTConvLayer`` holds ``convolution`` and ``normalization``.

v1 projects query, key and value separately; edgevit's attention has one
``qkv`` projection ordered (q|k|v), so the importer reads the three as one
tensor (``merged``). The v1 releases were trained on BGR images (ml-cvnets
v0.1 read them with OpenCV; transformers' image processor flips the
channels): their stem takes RGB after import. ml-cvnets v0.2, which trained
the v2 release, reads images with PIL: RGB.
"""
from __future__ import annotations

import re

import numpy as np

from .registry import Importer, register
from .rules import Rule

TRANSFORMERS = "https://github.com/huggingface/transformers (models/mobilevit, models/mobilevitv2)"
CONV = {"conv": "convolution", "norm": "normalization"}
INVERTED_RESIDUAL = {"exp_1x1": "expand_1x1", "conv_3x3": "conv_3x3", "red_1x1": "reduce_1x1"}
QKV = re.compile(r"(.*\.attention\.attention)\.(query|key|value)\.(weight|bias)")


def _rules(model_prefix: str, transformer_rules: list[tuple[str, str, bool]], block_rules: list[Rule]) -> list[Rule]:
    def stage(m) -> str:
        return f"{model_prefix}.encoder.layer.{int(m.group(1)) - 1}."

    def transformer(m) -> str:
        return stage(m) + f"transformer.layer.{m.group(2)}."

    rules = [
        Rule(r"stem\.(conv|norm)", lambda m: f"{model_prefix}.conv_stem.{CONV[m.group(1)]}"),
        Rule(r"layer_([12])\.(\d+)\.(exp_1x1|conv_3x3|red_1x1)\.(conv|norm)",
             lambda m: stage(m) + f"layer.{m.group(2)}.{INVERTED_RESIDUAL[m.group(3)]}.{CONV[m.group(4)]}"),
        Rule(r"layer_([345])\.0\.(exp_1x1|conv_3x3|red_1x1)\.(conv|norm)",
             lambda m: stage(m) + f"downsampling_layer.{INVERTED_RESIDUAL[m.group(2)]}.{CONV[m.group(3)]}"),
        Rule(r"layer_([345])\.1\.local_rep\.conv_3x3\.(conv|norm)",
             lambda m: stage(m) + f"conv_kxk.{CONV[m.group(2)]}"),
        Rule(r"layer_([345])\.1\.local_rep\.conv_1x1\.conv", lambda m: stage(m) + "conv_1x1.convolution"),
    ]
    for keras_name, hf_name, as_conv in transformer_rules:
        rules.append(Rule(rf"layer_([345])\.1\.global_rep\.(\d+)\.{keras_name}",
                          lambda m, hf_name=hf_name: transformer(m) + hf_name, dense_as_conv=as_conv))
    return rules + [
        Rule(r"layer_([345])\.1\.global_rep\.\d+", lambda m: stage(m) + "layernorm"),  # the closing norm
        Rule(r"layer_([345])\.1\.conv_proj\.(conv|norm)", lambda m: stage(m) + f"conv_projection.{CONV[m.group(2)]}"),
        *block_rules,
        Rule(r"aspp\.convs\.(\d)\.(conv|norm)",
             lambda m: f"segmentation_head.aspp.convs.{m.group(1)}.{CONV[m.group(2)]}"),
        Rule(r"aspp\.convs\.4\.conv_1x1\.(conv|norm)",
             lambda m: f"segmentation_head.aspp.convs.4.conv_1x1.{CONV[m.group(1)]}"),
        Rule(r"aspp\.project\.(conv|norm)", lambda m: f"segmentation_head.aspp.project.{CONV[m.group(1)]}"),
        Rule(r"classifier\.conv", "segmentation_head.classifier.convolution"),
    ]


V1_RULES = _rules("mobilevit", [
    ("norm1", "layernorm_before", False), ("attn/qkv", "attention.attention.qkv", False),
    ("attn/proj", "attention.output.dense", False), ("norm2", "layernorm_after", False),
    ("mlp\\.fc1", "intermediate.dense", False), ("mlp\\.fc2", "output.dense", False),
], [Rule(r"layer_([345])\.1\.fusion\.(conv|norm)",
         lambda m: f"mobilevit.encoder.layer.{int(m.group(1)) - 1}.fusion.{CONV[m.group(2)]}")])

V2_RULES = _rules("mobilevitv2", [
    ("norm1", "layernorm_before", False), ("attn/qkv_proj", "attention.qkv_proj.convolution", True),
    ("attn/out_proj", "attention.out_proj.convolution", True), ("norm2", "layernorm_after", False),
    ("mlp\\.fc1", "ffn.conv1.convolution", True), ("mlp\\.fc2", "ffn.conv2.convolution", True),
], [])


def fuse_qkv(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """v1's ``query``/``key``/``value`` weights and biases as one ``qkv``
    tensor each, stacked along the output axis in that order."""
    out, parts = {}, {}
    for key, value in tensors.items():
        m = QKV.fullmatch(key)
        if m is None:
            out[key] = value
        else:
            parts.setdefault((m.group(1), m.group(3)), {})[m.group(2)] = value
    for (module, leaf), qkv in parts.items():
        if len(qkv) == 3:
            out[f"{module}.qkv.{leaf}"] = np.concatenate([qkv["query"], qkv["key"], qkv["value"]], axis=0)
        else:  # incomplete: left under its own names, which the import then reports
            out.update({f"{module}.{part}.{leaf}": value for part, value in qkv.items()})
    return out


HEAD = ("classifier.conv",)
register(Importer("huggingface", "deeplabv3_mobilevit_v1", lambda model: V1_RULES, reference=TRANSFORMERS, head=HEAD,
                  notes="MobileViTForSemanticSegmentation (apple/deeplabv3-mobilevit-*)",
                  channel_order=lambda model: "BGR", merged=fuse_qkv))
register(Importer("huggingface", "deeplabv3_mobilevit_v2", lambda model: V2_RULES, reference=TRANSFORMERS, head=HEAD,
                  notes="MobileViTV2ForSemanticSegmentation (apple/mobilevitv2-1.0-voc-deeplabv3)"))

# edgevit variant -> transformers config arguments (the tests build the reference with them)
HF_CONFIGS = {
    "deeplabv3_mobilevit_v1_xxs": ("MobileViTConfig", dict(hidden_sizes=[64, 80, 96], expand_ratio=2.0,
                                                           neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320])),
    "deeplabv3_mobilevit_v1_xs": ("MobileViTConfig", dict(hidden_sizes=[96, 120, 144],
                                                          neck_hidden_sizes=[16, 32, 48, 64, 80, 96, 384])),
    "deeplabv3_mobilevit_v1_s": ("MobileViTConfig", dict(hidden_sizes=[144, 192, 240],
                                                         neck_hidden_sizes=[16, 32, 64, 96, 128, 160, 640])),
    **{f"deeplabv3_mobilevit_v2_{w}": ("MobileViTV2Config", dict(width_multiplier=int(w) / 100))
       for w in ("050", "075", "100", "125", "150", "175", "200")},
}


def transformers_reference(name: str, num_labels: int = 21, output_stride: int = 16, atrous_rates=None):
    """transformers' segmenter of the same architecture as edgevit's ``name``
    (randomly initialised, eval mode): what the parity tests compare against
    and the benchmarks' PyTorch route converts. Needs torch and transformers."""
    import transformers

    from edgevit.models.deeplabv3 import CONFIGS

    config_class, kwargs = HF_CONFIGS[name]
    cfg = CONFIGS[name]
    config = getattr(transformers, config_class)(num_labels=num_labels, output_stride=output_stride,
                                                 aspp_out_channels=cfg.aspp_channels,
                                                 atrous_rates=list(atrous_rates or cfg.atrous_rates), **kwargs)
    model_class = {"MobileViTConfig": transformers.MobileViTForSemanticSegmentation,
                   "MobileViTV2Config": transformers.MobileViTV2ForSemanticSegmentation}[config_class]
    return model_class(config).eval()
