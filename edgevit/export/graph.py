"""What a converted .tflite file contains: ops, dtypes, ranks and arithmetic,
read through the one flatbuffer reader (``edgevit.litert.flatbuffer``): the
operators in execution order, as the interpreter would run them before any
delegate takes a part of the graph.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from edgevit.litert.flatbuffer import Graph, Tensor, read

# Ops that only appear when a graph was traced with a dynamic batch dimension.
DYNAMIC_SHAPE_OPS = ("SHAPE", "GATHER", "PACK", "REDUCE_PROD")


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
    output: dict                      # the first output: a detector has more (``outputs``)
    outputs: list[dict] = field(default_factory=list)   # every output, in order
    output_producers: tuple[int, ...] = ()              # the op writing each output (-1: none)
    op_histogram: dict = field(init=False)

    def __post_init__(self):
        self.op_histogram = dict(Counter(op.name for op in self.ops).most_common())

    @property
    def macs(self) -> int:
        return sum(op.macs for op in self.ops)

    def float_ops(self, allow_io_boundary: bool = False) -> list[OpInfo]:
        """Ops that read or write a float tensor. With ``allow_io_boundary``
        the QUANTIZE of a float model input and the DEQUANTIZE of each float
        model output (a detector has two) are accepted: they sit at the edge,
        not inside the graph."""
        found = []
        for op in self.ops:
            dtypes = set(op.input_dtypes) | set(op.output_dtypes)
            if not dtypes & {"float32", "float16"}:
                continue
            if allow_io_boundary and (
                    (op.name == "QUANTIZE" and op.index == self.input["consumer"])
                    or (op.name == "DEQUANTIZE" and op.index in self.output_producers)):
                continue
            found.append(op)
        return found

    def dynamic_shape_ops(self) -> dict:
        return {name: n for name, n in self.op_histogram.items() if name in DYNAMIC_SHAPE_OPS}


def _quantization(tensor: Tensor) -> dict | None:
    if not tensor.scale:
        return None
    return {"scale": float(tensor.scale), "zero_point": int(tensor.zero_point)}


def _op_macs(name: str, inputs: list[Tensor], outputs: list[Tensor]) -> int:
    """Multiply-accumulates of one op from its static tensor shapes."""
    if not outputs or len(inputs) < 2:
        return 0
    out = outputs[0].shape
    if name == "CONV_2D":
        _, kh, kw, cin = inputs[1].shape
        return int(np.prod(out) * kh * kw * cin)
    if name == "DEPTHWISE_CONV_2D":
        _, kh, kw, _ = inputs[1].shape
        return int(np.prod(out) * kh * kw)
    if name == "FULLY_CONNECTED":
        return int(np.prod(out) * inputs[1].shape[-1])
    if name == "BATCH_MATMUL":
        a = inputs[0].shape
        k = a[-1] if a[-2] == out[-2] else a[-2]
        return int(np.prod(out) * k)
    return 0


def describe(model: bytes | Graph) -> GraphSummary:
    """Summary of a .tflite file's main graph (or of a graph already read)."""
    graph = model if isinstance(model, Graph) else read(model)
    ops = []
    for op in graph.ops:
        ins = [t for t in op.inputs if t is not None]
        ops.append(OpInfo(index=op.index, name=op.name, input_dtypes=[t.dtype for t in ins],
                          output_dtypes=[t.dtype for t in op.outputs], macs=_op_macs(op.name, ins, op.outputs)))
    deepest = max(graph.tensors, key=lambda t: t.rank)
    inp, out = graph.tensors[graph.inputs[0]], graph.tensors[graph.outputs[0]]
    consumer = graph.consumers.get(inp.index, [-1])[0]
    producer = graph.producers.get(out.index, -1)
    return GraphSummary(
        ops=ops, max_rank=deepest.rank, max_rank_tensor=deepest.name,
        input={"shape": list(inp.shape), "dtype": inp.dtype, "quantization": _quantization(inp),
               "consumer": consumer},
        output={"shape": list(out.shape), "dtype": out.dtype, "quantization": _quantization(out),
                "producer": producer},
        outputs=[{"name": t.name, "shape": list(t.shape), "dtype": t.dtype, "quantization": _quantization(t)}
                 for t in (graph.tensors[index] for index in graph.outputs)],
        output_producers=tuple(graph.producers.get(index, -1) for index in graph.outputs),
    )
