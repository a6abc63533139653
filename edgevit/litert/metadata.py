"""The metadata document that travels with every exported model
(format: docs/model-metadata.md): built here, embedded in the flatbuffer under
METADATA_NAME and read back (also written as sidecars by the export). The
standard TFLite metadata that app developers' clients read is built from the
same document (``edgevit.litert.standard_metadata``), and :func:`embed` writes
both.

Embedding and reading use the schema bindings LiteRT ships, not TensorFlow,
so whatever reads the file (the Android bundle, `edgevit eval`, `bench`)
does not pay TensorFlow's import.
"""
from __future__ import annotations

import json

from edgevit.errors import EdgevitError
from edgevit.litert.flatbuffer import metadata_entry, with_metadata
# the tasks its documents name (the registry's), for the modules reading documents
from edgevit.registry import CLASSIFICATION as CLASSIFICATION
from edgevit.registry import DETECTION as DETECTION
from edgevit.registry import SEGMENTATION as SEGMENTATION
from edgevit.registry import TASKS as TASKS

METADATA_NAME = "edgevit_metadata"
SCHEMA = "edgevit-model-metadata"
SCHEMA_VERSION = 1
# What a file's image input takes (input.takes): the normalised image; the
# camera's bytes (uint8), or pixels in [0, 1] (float), which the file normalises
TAKES_NORMALISED, TAKES_RGB_BYTES, TAKES_RGB_UNIT = "normalised", "rgb_bytes", "rgb_unit"
TAKES = (TAKES_NORMALISED, TAKES_RGB_BYTES, TAKES_RGB_UNIT)
PRECISIONS = ("fp32", "fp16", "dynamic", "int8", "int8_mixed", "int16x8")
# precisions whose files compute in integers (their activations are quantized)
QUANTIZED_PRECISIONS = ("int8", "int8_mixed", "int16x8")
# the types of a file's input and output tensors
IO_DTYPES = ("float32", "int8", "uint8")
# what a file outputs: class probabilities (a softmax in the file) or raw logits
OUTPUT_KINDS = ("probabilities", "logits")
# what a detector file's first output is: the SSD box regressions of every
# anchor (the raw form, its scores beside them) or the boxes the detection
# post-processing op kept (the NMS form)
BOX_ENCODINGS, DETECTION_BOXES = "box_encodings", "detection_boxes"
DETECTION_OUTPUT_KINDS = (BOX_ENCODINGS, DETECTION_BOXES)


def build_metadata(*, model_name: str, family: str, precision: str, weights: str,
                   labels: list[str], labels_file: str, graph_input: dict, graph_output: dict,
                   preprocessing: dict, quantization_ranges: str | None = None, output_kind: str = "logits",
                   input_takes: str = TAKES_NORMALISED, licence: str | None = None,
                   task: str = CLASSIFICATION, detection: dict | None = None) -> dict:
    """``output_kind``: one of OUTPUT_KINDS, or of DETECTION_OUTPUT_KINDS for a
    detector; ``input_takes``: one of the TAKES_* values; ``task``: one of
    TASKS; ``detection``: a detector's block (its form, every output, the
    box coding), None for other tasks."""
    from edgevit import __version__

    image = {"shape": graph_input["shape"], "layout": "NHWC", "dtype": graph_input["dtype"],
             "quantization": graph_input["quantization"],
             "takes": input_takes}
    scores = {"shape": graph_output["shape"], "dtype": graph_output["dtype"],
              "quantization": graph_output["quantization"], "kind": output_kind}

    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "edgevit_version": __version__,
        "model": model_name,
        "family": family,
        **({} if task == CLASSIFICATION else {"task": task}),
        "precision": precision,
        "quantization_ranges": quantization_ranges,
        "weights": weights,
        "licence": licence,
        "num_classes": len(labels),
        "labels": labels,
        "labels_file": labels_file,
        "input": image,
        "output": scores,
        "preprocessing": preprocessing,
        **({"detection": detection} if detection is not None else {}),
    }


def preprocessing_of(metadata: dict):
    """The preprocessing recipe of a metadata document checked against its
    file (``edgevit.litert.metadata_check``), as the registry holds one."""
    from edgevit.registry import Preprocessing

    pre = metadata["preprocessing"]
    return Preprocessing(pre["input_size"], pre["resize_size"], pre["interpolation"], tuple(pre["mean"]),
                         tuple(pre["std"]))


def task_of(metadata: dict | None) -> str:
    return (metadata or {}).get("task") or CLASSIFICATION


def takes_of(metadata: dict | None) -> str:
    return ((metadata or {}).get("input") or {}).get("takes") or TAKES_NORMALISED


def embed(model_content: bytes, metadata: dict, labels: list[str], anchors=None) -> bytes:
    """``model_content`` with ``metadata`` under METADATA_NAME and the
    standard TFLite metadata built from it, ``labels`` packed as its labels
    file (replacing earlier entries); ``anchors``: a raw detector's [A, 4]
    (ycenter, xcenter, height, width), which MediaPipe reads from the
    standard entry."""
    from edgevit.litert.standard_metadata import LABELS_FILE, populate, standard_metadata

    return populate(embed_edgevit(model_content, metadata), standard_metadata(metadata, anchors),
                    {LABELS_FILE: ("\n".join(labels) + "\n").encode("utf-8")})


def embed_edgevit(model_content: bytes, metadata: dict) -> bytes:
    """``model_content`` with ``metadata`` stored under METADATA_NAME
    (replacing an earlier edgevit entry); files packed in the model stay."""
    from edgevit.litert.packed_files import packed_files
    from edgevit.litert.standard_metadata import with_files

    data = json.dumps(metadata).encode("utf-8")
    return with_files(with_metadata(model_content, METADATA_NAME, data), packed_files(model_content))


def read_embedded(model_content: bytes) -> dict | None:
    """The embedded metadata document; None when the file has none."""
    data = metadata_entry(model_content, METADATA_NAME)
    if data is None:
        return None
    try:
        document = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise EdgevitError(f"The embedded {METADATA_NAME} entry is not a readable JSON document (it nests too "
                           "deeply).") from None
    except ValueError as err:
        raise EdgevitError(f"The embedded {METADATA_NAME} entry is not a readable JSON document ({err}).") from None
    if not isinstance(document, dict):
        raise EdgevitError(f"The embedded {METADATA_NAME} entry is a JSON {type(document).__name__}, not the "
                           "object edgevit writes.")
    return document
