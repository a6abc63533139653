"""Where a quantized file departs from its float twin: run both with every
intermediate tensor kept, compare the tensors they share in execution order,
and name the first layer whose output falls below a cosine threshold."""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import numpy as np

from edgevit.litert.interpreter import load_interpreter
from edgevit.litert.run_model import quantize


def _layer_of(tensor_name: str) -> str:
    """The Keras layer path inside a converted tensor name
    (``model_1/blocks.3.attn/MatMul;...`` -> ``blocks.3.attn``)."""
    first = tensor_name.split(";")[0]
    parts = first.split("/")
    return parts[1] if len(parts) > 1 else parts[0]


def layerwise_comparison(float_content: bytes, quant_content: bytes, inputs: np.ndarray,
                         threshold: float = 0.98, quant_inputs: np.ndarray | None = None,
                         on_image: Callable[[], None] = lambda: None) -> dict:
    """Run a float and a quantized file of the same model with
    ``experimental_preserve_all_tensors`` and compare every tensor both
    graphs share (same name and shape), in execution order of the quantized
    graph. Returns the per-tensor cosines and the first layer below
    ``threshold`` (where int8 breaks first). ``quant_inputs``: the same
    images in the values the quantized file's input takes, where they differ
    (a file that takes the camera's bytes). The tensors are read from the
    two interpreters one pair at a time, never all of them at once.
    ``on_image()`` after each image."""
    def cosine(a, b):
        a, b = a.ravel(), b.ravel()
        norm = np.linalg.norm(a) * np.linalg.norm(b)
        return float(a @ b / norm) if norm > 0 else (1.0 if not a.any() and not b.any() else 0.0)

    totals: dict[str, list] = {}
    for x, q in zip(inputs, inputs if quant_inputs is None else quant_inputs):
        ref, ref_order = _ran(float_content, x[None])
        got, got_order = _ran(quant_content, q[None])
        ref_details = {t["name"]: t for t in ref.get_tensor_details() if t["index"] in ref_order}
        for t in got.get_tensor_details():
            if t["index"] not in got_order or t["name"] not in ref_details:
                continue
            value = _activation(got, t)
            a = _activation(ref, ref_details[t["name"]])
            if value is None or a is None or a.shape != value.shape or value.size <= 1:
                continue
            # the worst token of a [1, N, C] tensor (a class token broken by
            # a shared scale hides in a whole-tensor cosine)
            per_token = (min(cosine(a[0, i], value[0, i]) for i in range(a.shape[1]))
                         if a.ndim == 3 and a.shape[-1] > 1 and a.shape[1] <= 1024 else cosine(a, value))
            entry = totals.setdefault(t["name"], [got_order[t["index"]], [], []])
            entry[1].append(cosine(a, value))
            entry[2].append(per_token)
        del ref, got  # each keeps every tensor of its graph
        on_image()
    rows = sorted((index, name, float(np.mean(c)), float(np.min(t))) for name, (index, c, t) in totals.items())
    layers = [{"tensor": name, "layer": _layer_of(name), "cosine": cos, "worst_token_cosine": tok}
              for _, name, cos, tok in rows
              if not re.search(r"(pos_embed|cls_token|dist_token|ReadVariableOp|Const)", name.split(";")[0])]
    first = next((row for row in layers if min(row["cosine"], row["worst_token_cosine"]) < threshold), None)
    return {"threshold": threshold, "first_below": first, "layers": layers}


def _ran(content: bytes, x: np.ndarray):
    """An interpreter that kept every tensor after running ``x``, and the
    position in execution order of the op that writes each tensor."""
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
    return interp, order


def _activation(interp, detail: dict) -> np.ndarray | None:
    """A tensor's values in float64 (dequantized), or None when it has none
    to compare: unreadable, per-channel quantized weights, not a number type."""
    try:
        value = interp.get_tensor(detail["index"])
    except ValueError:
        return None
    if value.dtype in (np.int8, np.int16, np.uint8) and detail["quantization_parameters"]["scales"].size:
        q = detail["quantization_parameters"]
        if q["scales"].size != 1:
            return None  # per-channel weights: not an activation
        return (value.astype(np.float64) - q["zero_points"][0]) * q["scales"][0]
    if value.dtype not in (np.float32, np.float16):
        return None
    return np.asarray(value, np.float64)
