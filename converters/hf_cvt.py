"""Hugging Face ``CvtForImageClassification`` checkpoints (``microsoft/cvt-13``,
``microsoft/cvt-21``: ``pytorch_model.bin`` or ``model.safetensors``).

Naming follows transformers' ``models/cvt/modeling_cvt.py`` (transformers
5.x; unchanged since CvT was added in 4.18): ``cvt.encoder.stages.S`` holds
the convolutional token embedding, the class token (last stage) and
``layers.L`` with separately projected query/key/value after depthwise
conv + BatchNorm projections; ``layernorm`` and ``classifier`` on top.
"""
from __future__ import annotations

from .registry import Importer, register
from .rules import Rule

TRANSFORMERS = "https://github.com/huggingface/transformers (models/cvt/modeling_cvt.py)"
QKV = {"q": "query", "k": "key", "v": "value"}


def _layer(m) -> str:
    return f"cvt.encoder.stages.{m.group(1)}.layers.{m.group(2)}."


RULES = [
    Rule(r"stage(\d)\.patch_embed\.proj", r"cvt.encoder.stages.\1.embedding.convolution_embeddings.projection"),
    Rule(r"stage(\d)\.patch_embed\.norm", r"cvt.encoder.stages.\1.embedding.convolution_embeddings.normalization"),
    Rule(r"stage(\d)\.cls_token/cls_token", r"cvt.encoder.stages.\1.cls_token", variable=True),
    Rule(r"stage(\d)\.blocks\.(\d+)\.norm1", lambda m: _layer(m) + "layernorm_before"),
    Rule(r"stage(\d)\.blocks\.(\d+)\.norm2", lambda m: _layer(m) + "layernorm_after"),
    Rule(r"stage(\d)\.blocks\.(\d+)\.attn\.conv_proj_([qkv])\.(conv|norm)",
         lambda m: _layer(m) + f"attention.attention.convolution_projection_{QKV[m.group(3)]}.convolution_projection."
         + ("convolution" if m.group(4) == "conv" else "normalization")),
    Rule(r"stage(\d)\.blocks\.(\d+)\.attn\.proj_([qkv])",
         lambda m: _layer(m) + f"attention.attention.projection_{QKV[m.group(3)]}"),
    Rule(r"stage(\d)\.blocks\.(\d+)\.attn\.proj", lambda m: _layer(m) + "attention.output.dense"),
    Rule(r"stage(\d)\.blocks\.(\d+)\.mlp\.fc1", lambda m: _layer(m) + "intermediate.dense"),
    Rule(r"stage(\d)\.blocks\.(\d+)\.mlp\.fc2", lambda m: _layer(m) + "output.dense"),
    Rule(r"norm", "layernorm"),
    Rule(r"head", "classifier"),
]

register(Importer("huggingface", "cvt", lambda model: RULES, reference=TRANSFORMERS, head=("head",),
                  notes="CvtForImageClassification (microsoft/cvt-13, microsoft/cvt-21)"))

# edgevit variant -> transformers CvtConfig arguments (the tests build the reference with them)
HF_CONFIGS = {
    "cvt_13": dict(depth=[1, 2, 10]),
    "cvt_21": dict(depth=[1, 4, 16]),
}
