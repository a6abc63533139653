"""Where a quantized file departs from its float twin: run both with every
intermediate tensor kept, compare the tensors they share in execution order,
and name the first layer whose output falls below a cosine threshold."""
from __future__ import annotations

import re
import warnings

import numpy as np

from edgevit.export.run_model import quantize
from edgevit.litert.interpreter import load_interpreter


def _layer_of(tensor_name: str) -> str:
    """The Keras layer path inside a converted tensor name
    (``model_1/blocks.3.attn/MatMul;...`` -> ``blocks.3.attn``)."""
    first = tensor_name.split(";")[0]
    parts = first.split("/")
    return parts[1] if len(parts) > 1 else parts[0]


def layerwise_comparison(float_content: bytes, quant_content: bytes, inputs: np.ndarray,
                         threshold: float = 0.98, quant_inputs: np.ndarray | None = None) -> dict:
    """Run a float and a quantized file of the same model with
    ``experimental_preserve_all_tensors`` and compare every tensor both
    graphs share (same name and shape), in execution order of the quantized
    graph. Returns the per-tensor cosines and the first layer below
    ``threshold`` (where int8 breaks first). ``quant_inputs``: the same
    images in the values the quantized file's input takes, where they differ
    (a file that takes the camera's bytes)."""
    def run(content, x):
        with warnings.catch_warnings():  # LiteRT warns that keeping every tensor is for debugging: it is
            warnings.simplefilter("ignore", UserWarning)
            interp = load_interpreter(content, preserve_all_tensors=True)
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
    for x, q in zip(inputs, inputs if quant_inputs is None else quant_inputs):
        ref, got = run(float_content, x[None]), run(quant_content, q[None])
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
