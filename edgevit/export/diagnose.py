"""Where a quantized file departs from its float twin: run both with every
intermediate tensor kept, compare the tensors they share in execution order,
and name the first layer whose output falls below a cosine threshold."""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import numpy as np

from edgevit.litert.flatbuffer import read, read_model, write_model
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
        got, got_order = _ran(quant_content, q[None])
        quantized = {t["name"]: t for t in got.get_tensor_details() if t["index"] in got_order}
        for ref, ref_details in _float_shares(float_content, x[None], set(quantized)):
            for name, ref_detail in ref_details.items():
                t = quantized[name]
                value = _activation(got, t)
                a = _activation(ref, ref_detail)
                if value is None or a is None or a.shape != value.shape or value.size <= 1:
                    continue
                # the worst token of a [1, N, C] tensor (a class token broken by
                # a shared scale hides in a whole-tensor cosine)
                per_token = (min(cosine(a[0, i], value[0, i]) for i in range(a.shape[1]))
                             if a.ndim == 3 and a.shape[-1] > 1 and a.shape[1] <= 1024 else cosine(a, value))
                entry = totals.setdefault(name, [got_order[t["index"]], [], []])
                entry[1].append(cosine(a, value))
                entry[2].append(per_token)
            del ref  # before the next share's interpreter
        del got  # it keeps every tensor of its graph
        on_image()
    rows = sorted((index, name, float(np.mean(c)), float(np.min(t))) for name, (index, c, t) in totals.items())
    layers = [{"tensor": name, "layer": _layer_of(name), "cosine": cos, "worst_token_cosine": tok}
              for _, name, cos, tok in rows
              if not re.search(r"(pos_embed|cls_token|dist_token|ReadVariableOp|Const)", name.split(";")[0])]
    first = next((row for row in layers if min(row["cosine"], row["worst_token_cosine"]) < threshold), None)
    return {"threshold": threshold, "first_below": first, "layers": layers}


# The float file's tensors are read a share at a time, from its graph made to output that share (an interpreter
# keeps its outputs and reuses the rest of its memory), not from one interpreter keeping every tensor: the fp32
# tensors are four times the int8 ones (ssdlite_mobilevit_v1_xs at 320 px: 0.38 GB against 0.10 GB), and both
# files' at once took the diagnosis to 1.6x the plain converter's peak (docs/benchmarks.md).
FLOAT_SHARE_BYTES = 48_000_000


def _float_shares(content: bytes, x: np.ndarray, names: set[str]):
    """(an interpreter that ran ``x``, {name: tensor detail}) for each share
    of the float file's op outputs named in ``names``, together at most
    FLOAT_SHARE_BYTES (a larger tensor alone)."""
    graph = read(content)
    shares, size = [[]], 0
    for tensor in graph.tensors:
        if tensor.index not in graph.producers or tensor.name not in names:
            continue
        nbytes = int(np.prod(tensor.shape)) * np.dtype(tensor.dtype).itemsize
        if shares[-1] and size + nbytes > FLOAT_SHARE_BYTES:
            shares.append([])
            size = 0
        shares[-1].append(tensor.index)
        size += nbytes
    model = read_model(content)
    for share in (s for s in shares if s):
        model.subgraphs[0].outputs = share
        interp = load_interpreter(write_model(model, len(content) + 4096))
        interp.allocate_tensors()
        inp = interp.get_input_details()[0]
        interp.set_tensor(inp["index"], quantize(x, inp).astype(inp["dtype"]))
        interp.invoke()
        wanted = set(share)
        yield interp, {t["name"]: t for t in interp.get_tensor_details() if t["index"] in wanted}


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
