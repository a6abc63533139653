"""The metadata document that travels with every exported model
(format: docs/model-metadata.md): built here, embedded in the flatbuffer under
METADATA_NAME and read back (also written as sidecars by the export).

Embedding and reading use the schema bindings LiteRT ships, not TensorFlow,
so whatever reads the file (the Android bundle, `edgevit eval`, `bench`)
does not pay TensorFlow's import.
"""
from __future__ import annotations

import json

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.flatbuffer import read_model, schema_module, write_model

METADATA_NAME = "edgevit_metadata"
SCHEMA = "edgevit-model-metadata"
SCHEMA_VERSION = 1


def build_metadata(*, model_name: str, family: str, precision: str, weights: str,
                   labels: list[str], labels_file: str, graph_input: dict, graph_output: dict,
                   preprocessing: dict, quantization_ranges: str | None = None) -> dict:
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
        "quantization_ranges": quantization_ranges,
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
    schema = schema_module()
    model = read_model(model_content)
    data = np.frombuffer(json.dumps(metadata).encode("utf-8"), dtype=np.uint8)
    entry = _entry(model)
    if entry is None:
        model.buffers = [*(model.buffers or []), schema.BufferT()]
        entry = schema.MetadataT()
        entry.name = METADATA_NAME
        entry.buffer = len(model.buffers) - 1
        model.metadata = [*(model.metadata or []), entry]
    model.buffers[entry.buffer].data = data
    return write_model(model, len(model_content) + len(data) + 1024)


def read_embedded(model_content: bytes) -> dict | None:
    """The embedded metadata document; None when the file has none."""
    model = read_model(model_content)
    entry = _entry(model)
    if entry is None:
        return None
    try:
        return json.loads(bytes(model.buffers[entry.buffer].data).decode("utf-8"))
    except (IndexError, TypeError, ValueError) as err:
        raise EdgevitError(f"The embedded {METADATA_NAME} entry is not a readable JSON document ({err}).") from None


def _entry(model):
    for entry in model.metadata or []:
        name = entry.name.decode() if isinstance(entry.name, bytes) else entry.name
        if name == METADATA_NAME:
            return entry
    return None
