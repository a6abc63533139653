"""The metadata document that travels with every exported model
(format: docs/model-metadata.md): embedded in the flatbuffer and as sidecars."""
from __future__ import annotations

import json

METADATA_NAME = "edgevit_metadata"
SCHEMA = "edgevit-model-metadata"
SCHEMA_VERSION = 1


def build_metadata(*, model_name: str, family: str, precision: str, weights: str,
                   labels: list[str], labels_file: str, graph_input: dict, graph_output: dict,
                   preprocessing: dict) -> dict:
    from edgevit import __version__

    def tensor(d: dict) -> dict:
        return {"shape": d["shape"], "layout": "NHWC", "dtype": d["dtype"],
                "quantization": d["quantization"]} if len(d["shape"]) == 4 else \
               {"shape": d["shape"], "dtype": d["dtype"], "quantization": d["quantization"],
                "kind": "logits"}

    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "edgevit_version": __version__,
        "model": model_name,
        "family": family,
        "precision": precision,
        "weights": weights,
        "num_classes": len(labels),
        "labels": labels,
        "labels_file": labels_file,
        "input": tensor(graph_input),
        "output": tensor(graph_output),
        "preprocessing": preprocessing,
    }


def embed(model_content: bytes, metadata: dict) -> bytes:
    """Return ``model_content`` with ``metadata`` stored under METADATA_NAME
    (replacing an earlier edgevit entry)."""
    from tensorflow.lite.tools import flatbuffer_utils
    from tensorflow.lite.python import schema_py_generated as schema

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_content))
    buffer = schema.BufferT()
    buffer.data = list(json.dumps(metadata).encode("utf-8"))
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = METADATA_NAME
    entry.buffer = len(model.buffers) - 1
    model.metadata = [m for m in (model.metadata or []) if _name(m) != METADATA_NAME] + [entry]
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def read_embedded(model_content: bytes) -> dict | None:
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(model_content))
    for entry in model.metadata or []:
        if _name(entry) == METADATA_NAME:
            return json.loads(bytes(model.buffers[entry.buffer].data).decode("utf-8"))
    return None


def _name(entry) -> str:
    name = entry.name
    return name.decode() if isinstance(name, bytes) else name
