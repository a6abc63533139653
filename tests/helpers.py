"""Test helpers shared by the family tests: fast parameter counting, export
with the validation report, the deployment rules, and the per-layer
float-vs-int8 comparison that names the first layer where int8 breaks."""
from __future__ import annotations

import contextlib
import re

import numpy as np

import edgevit
from edgevit.export.pipeline import ExportOptions, export
from edgevit.registry import get_spec

FORBIDDEN_OPS = {"SHAPE", "GATHER", "GATHER_ND", "PACK", "REDUCE_PROD", "SQUARED_DIFFERENCE", "NEG", "ERF"}
# Random-init weights give small, noise-like logits: the worst case for
# quantization (trained weights do better).
COSINE_FLOOR = {"fp32": 0.9999, "fp16": 0.999, "dynamic": 0.98, "int16x8": 0.97, "int8_mixed": 0.9, "int8": 0.85}


@contextlib.contextmanager
def zero_initialisers():
    """Build models with all-zero weights: counting parameters of the large
    variants then costs the graph construction only, not random sampling."""
    import keras
    from keras import ops

    classes = (keras.initializers.TruncatedNormal, keras.initializers.RandomNormal,
               keras.initializers.VarianceScaling, keras.initializers.GlorotUniform,
               keras.initializers.RandomUniform)
    saved = {cls: cls.__call__ for cls in classes}

    def _zeros(self, shape, dtype=None):
        return ops.zeros(shape, dtype=dtype or "float32")

    try:
        for cls in classes:
            cls.__call__ = _zeros
        yield
    finally:
        for cls, call in saved.items():
            cls.__call__ = call


def export_variant(tmp_path, name, precision, size, *, num_classes=10, calib_samples=16,
                   validation_samples=8, model=None):
    spec = get_spec(name)
    model = model or edgevit.create_model(name, num_classes=num_classes, input_size=size)
    opts = ExportOptions(precision=precision, output=str(tmp_path / f"{name}_{precision}.tflite"),
                         calib_samples=calib_samples, validation_samples=validation_samples,
                         recalibrate_batchnorm=any(l.__class__.__name__ == "BatchNormalization"
                                                   for l in model.layers))
    return export(model, spec, opts)


def assert_deployable(report):
    failed = [c for c in report["checks"] if not c["passed"]]
    assert not failed, failed
    assert report["max_rank"] <= 4
    assert not FORBIDDEN_OPS & set(report["op_histogram"]), report["op_histogram"]
    assert report["io"]["input"]["shape"] == [1, report["input_size"], report["input_size"], 3]


def _layer_of(tensor_name: str) -> str:
    """The Keras layer path inside a converted tensor name
    (``model_1/blocks.3.attn/MatMul;...`` -> ``blocks.3.attn``)."""
    first = tensor_name.split(";")[0]
    parts = first.split("/")
    return parts[1] if len(parts) > 1 else parts[0]


def layerwise_comparison(float_content: bytes, quant_content: bytes, inputs: np.ndarray,
                         threshold: float = 0.98) -> dict:
    """Run a float and a quantized file of the same model with
    ``experimental_preserve_all_tensors`` and compare every tensor both
    graphs share (same name and shape), in execution order of the quantized
    graph. Returns the per-tensor cosines and the first layer below
    ``threshold`` (where int8 breaks first)."""
    from edgevit.export.graph import load_interpreter  # noqa: F401  (litert import path)
    from edgevit.export.run_model import dequantize, quantize

    try:
        from ai_edge_litert import interpreter as litert
    except ImportError:
        from tflite_runtime import interpreter as litert

    def run(content, x):
        interp = litert.Interpreter(model_content=content, experimental_preserve_all_tensors=True)
        interp.allocate_tensors()
        inp = interp.get_input_details()[0]
        interp.set_tensor(inp["index"], quantize(x, inp).astype(inp["dtype"]))
        interp.invoke()
        order = {}
        for position, op in enumerate(interp._get_ops_details()):
            for out in op["outputs"]:
                order.setdefault(int(out), position)
        values = {}
        for t in interp.get_tensor_details():
            if t["index"] not in order:
                continue
            try:
                value = interp.get_tensor(t["index"])
            except ValueError:
                continue
            if value.dtype in (np.int8, np.int16, np.uint8) and t["quantization_parameters"]["scales"].size:
                q = t["quantization_parameters"]
                scale = q["scales"] if q["scales"].size == 1 else None
                if scale is None:
                    continue  # per-channel weights: not an activation
                value = (value.astype(np.float64) - q["zero_points"][0]) * scale[0]
            elif value.dtype not in (np.float32, np.float16):
                continue
            values[t["name"]] = (order[t["index"]], np.asarray(value, np.float64))
        return values

    def cosine(a, b):
        a, b = a.ravel(), b.ravel()
        norm = np.linalg.norm(a) * np.linalg.norm(b)
        return float(a @ b / norm) if norm > 0 else (1.0 if not a.any() and not b.any() else 0.0)

    totals: dict[str, list] = {}
    for x in inputs:
        ref, got = run(float_content, x[None]), run(quant_content, x[None])
        for name, (index, value) in got.items():
            if name in ref and ref[name][1].shape == value.shape and value.size > 1:
                a = ref[name][1]
                # the worst token of a [1, N, C] tensor (a class token broken by
                # a shared scale hides in a whole-tensor cosine)
                per_token = (min(cosine(a[0, i], value[0, i]) for i in range(a.shape[1]))
                             if a.ndim == 3 and a.shape[-1] > 1 and a.shape[1] <= 1024 else cosine(a, value))
                entry = totals.setdefault(name, [index, [], []])
                entry[1].append(cosine(a, value))
                entry[2].append(per_token)
    rows = sorted((index, name, float(np.mean(c)), float(np.min(t))) for name, (index, c, t) in totals.items())
    layers = [{"tensor": name, "layer": _layer_of(name), "cosine": cos, "worst_token_cosine": tok}
              for _, name, cos, tok in rows
              if not re.search(r"(pos_embed|cls_token|dist_token|ReadVariableOp|Const)", name.split(";")[0])]
    first = next((row for row in layers if min(row["cosine"], row["worst_token_cosine"]) < threshold), None)
    return {"threshold": threshold, "first_below": first, "layers": layers}
