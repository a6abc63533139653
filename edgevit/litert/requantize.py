"""The int8 grid XNNPACK needs to run attention, chosen after calibration.

XNNPACK takes an int8 BATCH_MATMUL only when its second operand has zero
point 0, like a weight (measured on LiteRT 2.3: in a calibrated
mobilevit_v1_xs the two matmuls whose keys happened to get zero point 0 ran
in XNNPACK, the other sixteen on LiteRT's builtin kernels, each splitting the
graph). Calibration gives keys and values whatever zero point their range
asks for, so each such operand gets the symmetric grid that covers its range:
scale ``max(|lo|, |hi|) / 127``, zero point 0, at most one bit coarser.

An operand's quantization is shared by every tensor that scale-keeping ops
(RESHAPE, TRANSPOSE, SPLIT, ...) link it to, back to the op that computes
it (the attention's FULLY_CONNECTED); all of them change together, and the
kernels that read or write them derive their requantization multipliers
from the tensors' parameters when the interpreter prepares them. Operands
that reach a graph input or output, a constant, or an op with a fixed
output grid (SOFTMAX, LOGISTIC, ...) are left as they are.
"""
from __future__ import annotations

from edgevit.litert.flatbuffer import (holds_data, opcode_names, operator_links, read_model, schema_module,
                                      write_model)

SCALE_KEEPING = ("RESHAPE", "TRANSPOSE", "SPLIT", "SPLIT_V", "SQUEEZE", "EXPAND_DIMS", "SLICE", "STRIDED_SLICE")
FIXED_OUTPUT_GRID = ("SOFTMAX", "LOGISTIC", "TANH", "L2_NORMALIZATION", "LOG_SOFTMAX")


def xnnpack_int8_grids(model_content: bytes) -> bytes:
    """``model_content`` with the second operand of every int8 BATCH_MATMUL
    on a zero-point-0 grid (the file itself when nothing needed it)."""
    model = read_model(model_content)
    op_names, int8 = opcode_names(model), schema_module().TensorType.INT8
    changed = False
    for graph in model.subgraphs or []:
        changed |= _Requantizer(model, graph, op_names, int8).run()
    if not changed:
        return model_content
    return write_model(model, len(model_content) + 1024)


class _Requantizer:
    def __init__(self, model, graph, op_names, int8):
        self.model, self.graph, self.op_names, self.int8 = model, graph, op_names, int8
        self.producer, self.readers = operator_links(graph)
        self.boundary = {int(t) for t in graph.inputs} | {int(t) for t in graph.outputs}

    def run(self) -> bool:
        changed = False
        for op in self.graph.operators or []:
            if self.op_names[op.opcodeIndex] != "BATCH_MATMUL" or len(op.inputs) < 2:
                continue
            operand = self.graph.tensors[op.inputs[1]]
            params = _params(operand) if operand.type == self.int8 else None
            if params is not None and params[1] != 0:
                scale, zero_point = params
                magnitude = max((128 + zero_point) * scale, (127 - zero_point) * scale)
                changed |= self._set(int(op.inputs[1]), (magnitude / 127.0, 0))
        return changed

    def _set(self, index: int, params: tuple[float, int]) -> bool:
        group = self._linked(index)
        if group is None:
            return False
        for member in group:
            quantization = self.graph.tensors[member].quantization
            quantization.scale, quantization.zeroPoint = [params[0]], [params[1]]
            quantization.min = quantization.max = None
        return True

    def _linked(self, start: int) -> set[int] | None:
        """The tensors sharing ``start``'s quantization through scale-keeping
        ops; None when one of them cannot change."""
        params = _params(self.graph.tensors[start])
        group, pending = set(), [start]
        while pending:
            index = pending.pop()
            if index in group:
                continue
            tensor = self.graph.tensors[index]
            if index in self.boundary or holds_data(self.model, tensor) or _params(tensor) != params:
                return None
            group.add(index)
            made_by = self.producer.get(index)
            if made_by is not None:
                kind = self.op_names[made_by.opcodeIndex]
                if kind in FIXED_OUTPUT_GRID:
                    return None
                if kind in SCALE_KEEPING:
                    pending.append(int(made_by.inputs[_data_slot(kind)]))
                    pending.extend(int(t) for t in made_by.outputs)
            for reader in self.readers.get(index, []):
                kind = self.op_names[reader.opcodeIndex]
                if kind in SCALE_KEEPING and int(reader.inputs[_data_slot(kind)]) == index:
                    pending.extend(int(t) for t in reader.outputs)
        return group


def _data_slot(kind: str) -> int:
    return 1 if kind == "SPLIT" else 0   # SPLIT takes (axis, tensor)


def _params(tensor) -> tuple[float, int] | None:
    q = tensor.quantization
    if q is None or q.scale is None or len(q.scale) != 1:
        return None
    return float(q.scale[0]), int(q.zeroPoint[0]) if q.zeroPoint is not None and len(q.zeroPoint) else 0
