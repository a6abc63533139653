"""What a converted .tflite file contains: ops, dtypes, ranks and arithmetic.

Reads the graph through the LiteRT interpreter (no allocation or invocation),
so it describes exactly what the runtime will execute.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

# Ops that only appear when a graph was traced with a dynamic batch dimension.
DYNAMIC_SHAPE_OPS = ("SHAPE", "GATHER", "PACK", "REDUCE_PROD")
FLOAT_DTYPES = (np.float32, np.float16)


def load_interpreter(model_content: bytes, num_threads: int = 1, reference_kernels: bool = False):
    """A LiteRT interpreter (``tflite_runtime`` where only that is installed)."""
    try:
        from ai_edge_litert import interpreter as litert
    except ImportError:  # device-style installs ship only tflite_runtime
        from tflite_runtime import interpreter as litert
    kwargs = {"model_content": model_content, "num_threads": num_threads}
    if reference_kernels:
        kwargs["experimental_op_resolver_type"] = litert.OpResolverType.BUILTIN_REF
    return litert.Interpreter(**kwargs)


@dataclass
class OpInfo:
    index: int
    name: str
    input_dtypes: list[str]
    output_dtypes: list[str]
    macs: int = 0


@dataclass
class GraphSummary:
    ops: list[OpInfo]
    max_rank: int
    max_rank_tensor: str
    input: dict
    output: dict
    op_histogram: dict = field(init=False)

    def __post_init__(self):
        self.op_histogram = dict(Counter(op.name for op in self.ops).most_common())

    @property
    def macs(self) -> int:
        return sum(op.macs for op in self.ops)

    def float_ops(self, allow_io_boundary: bool = False) -> list[OpInfo]:
        """Ops that read or write a float tensor. With ``allow_io_boundary``
        the QUANTIZE of a float model input and the DEQUANTIZE of a float model
        output are accepted: they sit at the edge, not inside the graph."""
        found = []
        for op in self.ops:
            dtypes = set(op.input_dtypes) | set(op.output_dtypes)
            if not dtypes & {"float32", "float16"}:
                continue
            if allow_io_boundary and (
                    (op.name == "QUANTIZE" and op.index == self.input["consumer"])
                    or (op.name == "DEQUANTIZE" and op.index == self.output["producer"])):
                continue
            found.append(op)
        return found

    def dynamic_shape_ops(self) -> dict:
        return {name: n for name, n in self.op_histogram.items() if name in DYNAMIC_SHAPE_OPS}


def _dtype_name(dtype) -> str:
    return np.dtype(dtype).name


def _quantization(detail) -> dict | None:
    scale, zero_point = detail["quantization"]
    if scale == 0.0:
        return None
    return {"scale": float(scale), "zero_point": int(zero_point)}


def _op_macs(name: str, inputs: list, outputs: list) -> int:
    """Multiply-accumulates of one op from its static tensor shapes."""
    if not outputs or any(t is None for t in inputs[:2]):
        return 0
    out = outputs[0]["shape"]
    if name == "CONV_2D":
        _, kh, kw, cin = inputs[1]["shape"]
        return int(np.prod(out) * kh * kw * cin)
    if name == "DEPTHWISE_CONV_2D":
        _, kh, kw, _ = inputs[1]["shape"]
        return int(np.prod(out) * kh * kw)
    if name == "FULLY_CONNECTED":
        return int(np.prod(out) * inputs[1]["shape"][-1])
    if name == "BATCH_MATMUL":
        a = inputs[0]["shape"]
        k = a[-1] if a[-2] == out[-2] else a[-2]
        return int(np.prod(out) * k)
    return 0


def describe(model_content: bytes) -> GraphSummary:
    interp = load_interpreter(model_content)
    tensors = {t["index"]: t for t in interp.get_tensor_details()}
    ops = []
    for op in interp._get_ops_details():
        ins = [tensors.get(int(i)) for i in op["inputs"] if int(i) >= 0]
        outs = [tensors[int(i)] for i in op["outputs"]]
        ops.append(OpInfo(
            index=int(op["index"]), name=op["op_name"],
            input_dtypes=[_dtype_name(t["dtype"]) for t in ins if t is not None],
            output_dtypes=[_dtype_name(t["dtype"]) for t in outs],
            macs=_op_macs(op["op_name"], ins, outs)))
    deepest = max(tensors.values(), key=lambda t: len(t["shape"]))
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    consumer = next((op["index"] for op in interp._get_ops_details() if inp["index"] in op["inputs"]), -1)
    producer = next((op["index"] for op in interp._get_ops_details() if out["index"] in op["outputs"]), -1)
    return GraphSummary(
        ops=ops, max_rank=len(deepest["shape"]), max_rank_tensor=deepest["name"],
        input={"shape": inp["shape"].tolist(), "dtype": _dtype_name(inp["dtype"]),
               "quantization": _quantization(inp), "consumer": int(consumer)},
        output={"shape": out["shape"].tolist(), "dtype": _dtype_name(out["dtype"]),
                "quantization": _quantization(out), "producer": int(producer)},
    )
