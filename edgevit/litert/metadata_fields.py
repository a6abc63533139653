"""Whether edgevit's metadata document is well formed: every field that an
app or edgevit computes with is there, of its type and in its range
(docs/model-metadata.md). A field of another type (``num_classes: "2"``,
``input: "uint8"``) or value (interpolation "evil", resize_size 0, a mean
of two values) would otherwise end in a traceback, or in a misleading
comparison with the graph, in whatever reads it."""
from __future__ import annotations

import json
import math

from edgevit.data.labels import label_problem
from edgevit.data.transforms import INTERPOLATIONS
from edgevit.errors import is_control
from edgevit.litert.metadata import CLASSIFICATION, DETECTION, DETECTION_OUTPUT_KINDS, IO_DTYPES, OUTPUT_KINDS, \
    PRECISIONS, SCHEMA, TAKES, TASKS

CHANNELS = 3  # RGB


def document_problems(doc: dict) -> list[str]:
    """Each field of ``doc`` that is missing, of another type or out of
    range, in a sentence (empty: the document is well formed)."""
    problems: list[str] = []

    def wrong(path: str, expected: str, value) -> None:
        problems.append(f"edgevit metadata's {path} is {_shown(value)}, not {expected}")

    if doc.get("schema") != SCHEMA:
        wrong("schema", repr(SCHEMA), doc.get("schema"))
    if not _whole(doc.get("schema_version"), 1):
        wrong("schema_version", "a version number", doc.get("schema_version"))
    for key in ("model", "family", "weights"):
        if not isinstance(doc.get(key), str) or any(map(is_control, doc[key])):
            wrong(key, "text without control characters", doc.get(key))
    if doc.get("task", CLASSIFICATION) not in TASKS:
        wrong("task", "one of " + ", ".join(TASKS), doc.get("task"))
    if doc.get("precision") not in PRECISIONS:
        wrong("precision", "one of " + ", ".join(PRECISIONS), doc.get("precision"))
    if not _whole(doc.get("num_classes"), 1):
        wrong("num_classes", "a whole number of classes", doc.get("num_classes"))
    labels = doc.get("labels")
    if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
        wrong("labels", "a list of texts", labels)
    else:
        bad = next(((i, label) for i, label in enumerate(labels) if label_problem(label)), None)
        if bad:
            problems.append(f"edgevit metadata's label {bad[0]} ({bad[1]!r}) cannot be a line of a labels file: "
                            f"{label_problem(bad[1])}")
    output_kinds = DETECTION_OUTPUT_KINDS if doc.get("task") == DETECTION else OUTPUT_KINDS
    for side, kinds, kind_key in (("input", TAKES, "takes"), ("output", output_kinds, "kind")):
        tensor = doc.get(side)
        if not isinstance(tensor, dict):
            wrong(side, "an object", tensor)
            continue
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not shape or not all(_whole(d, 1) for d in shape):
            wrong(f"{side}.shape", "a list of sizes", shape)
        if tensor.get("dtype") not in IO_DTYPES:
            wrong(f"{side}.dtype", "one of " + ", ".join(IO_DTYPES), tensor.get("dtype"))
        quantization = tensor.get("quantization")
        if tensor.get("dtype") == "float32" and quantization is not None:
            wrong(f"{side}.quantization", "null for a float32 tensor", quantization)
        elif tensor.get("dtype") in ("int8", "uint8") and not _quantization(quantization):
            wrong(f"{side}.quantization", "a positive scale and a whole zero point", quantization)
        if tensor.get(kind_key, TAKES[0] if side == "input" else None) not in kinds:
            wrong(f"{side}.{kind_key}", "one of " + ", ".join(kinds), tensor.get(kind_key))
    _check_preprocessing(doc.get("preprocessing"), wrong)
    return problems


def _check_preprocessing(pre, wrong) -> None:
    if not isinstance(pre, dict):
        wrong("preprocessing", "an object", pre)
        return
    for key in ("input_size", "resize_size"):
        if not _whole(pre.get(key), 1):
            wrong(f"preprocessing.{key}", "a positive whole number of pixels", pre.get(key))
    if pre.get("interpolation") not in INTERPOLATIONS:
        wrong("preprocessing.interpolation", "one of " + ", ".join(INTERPOLATIONS), pre.get("interpolation"))
    for key, lowest in (("mean", -math.inf), ("std", 0.0)):
        values = pre.get(key)
        if not isinstance(values, list) or len(values) != CHANNELS or \
                not all(_number(v) and v > lowest for v in values):
            wrong(f"preprocessing.{key}", f"{CHANNELS} {'positive ' if lowest == 0 else ''}numbers, one a channel",
                  values)


def _whole(value, lowest: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= lowest


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _quantization(value) -> bool:
    return isinstance(value, dict) and _number(value.get("scale")) and value["scale"] > 0 and \
        _whole(value.get("zero_point"), -(1 << 31))


def _shown(value) -> str:
    """A field's value as a message shows it: its JSON, cut short, and its
    kind where the JSON alone would not say."""
    if value is None:
        return "missing"
    text = json.dumps(value)
    text = text if len(text) <= 40 else text[:36] + " ..."
    return f"{text} (text)" if isinstance(value, str) else text
