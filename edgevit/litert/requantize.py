"""int8 grids chosen after calibration: the one XNNPACK needs to run
attention, and a fine one for a mean that is multiplied back into a sum.

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

import numpy as np

from edgevit.litert.flatbuffer import (constant_values, holds_data, opcode_names, operator_links, read_model,
                                      schema_module, write_model)

# a constant added to masked attention scores is at or below this
MASK_FLOOR = -50.0
SCALE_KEEPING = ("RESHAPE", "TRANSPOSE", "SPLIT", "SPLIT_V", "SQUEEZE", "EXPAND_DIMS", "SLICE", "STRIDED_SLICE")
FIXED_OUTPUT_GRID = ("SOFTMAX", "LOGISTIC", "TANH", "L2_NORMALIZATION", "LOG_SOFTMAX")


def calibrated_int8_grids(model_content: bytes) -> bytes:
    """``model_content`` with :func:`xnnpack_int8_grids`,
    :func:`sum_mean_grids` and :func:`masked_softmax_grids` applied (the
    file itself when none changed it)."""
    return masked_softmax_grids(sum_mean_grids(xnnpack_int8_grids(model_content)))


def masked_softmax_grids(model_content: bytes) -> bytes:
    """``model_content`` with each masked softmax's scores on a grid of the
    unmasked scores' range.

    A mask (Swin's shifted windows) multiplies the scores by a 0/1 constant
    and adds a 0/-100 one before the SOFTMAX. Calibration gives the sum the
    range down to -100, steps of ~0.4 where the scores need ~0.02. Here the
    product keeps the scores' own grid (a product by 0 or 1 is exact on
    it), and the sum gets :func:`edgevit.layers.attention.masked_scores_range`
    of that grid's range: masked pairs saturate at its bottom, far enough
    below every unmasked score to weigh nothing after the softmax.
    """
    return _requantized(model_content, _MaskedScores)


def sum_mean_grids(model_content: bytes) -> bytes:
    """``model_content`` with each int8 MEAN that only feeds a MUL by a
    constant ``c > 1`` (a sum over tokens written as a mean times their
    count, for MEAN's int8 kernels) on the MUL output's grid divided by
    ``c``.

    The converter gives a MEAN its input's grid. A weighted sum's terms span
    far more than their mean (up to N times for N tokens), so the mean lands
    on a handful of levels, which the MUL then stretches over its whole
    range: MobileViT v2's context vectors used 5 to 15 levels. The MUL also
    needs a rescale >= 1, which makes the converter stamp every MUL of the
    file version 3, and the NNAPI delegate takes MUL only up to version 2.
    """
    model = read_model(model_content)
    op_names, int8 = opcode_names(model), schema_module().TensorType.INT8
    changed = False
    for graph in model.subgraphs or []:
        producer, readers = operator_links(graph)
        for op in graph.operators or []:
            mean = graph.tensors[op.outputs[0]]
            users = readers.get(int(op.outputs[0]), [])
            if op_names[op.opcodeIndex] != "MEAN" or mean.type != int8 or len(users) != 1 or \
                    op_names[users[0].opcodeIndex] != "MUL":
                continue
            mul = users[0]
            factor = [graph.tensors[t] for t in mul.inputs if int(t) != int(op.outputs[0])]
            product = graph.tensors[mul.outputs[0]]
            if len(factor) != 1 or not holds_data(model, factor[0]) or _params(factor[0]) is None or \
                    _params(product) is None or len(model.buffers[factor[0].buffer].data) != 1:
                continue
            scale, zero_point = _params(factor[0])
            level = constant_values(model, factor[0])[0]
            constant = scale * (int(level) - zero_point)
            if constant <= 1:
                continue
            product_scale, product_zero_point = _params(product)
            mean.quantization.scale, mean.quantization.zeroPoint = [product_scale / constant], [product_zero_point]
            changed = True
    if not changed:
        return model_content
    # the converter stamped MUL version 3 for the rescale >= 1 these MULs had
    for code, name in zip(model.operatorCodes, op_names):
        if name == "MUL" and code.version == 3 and not _needs_rescale_above_one(model, op_names):
            code.version = 2
    return write_model(model, len(model_content) + 1024)


def _needs_rescale_above_one(model, op_names) -> bool:
    for graph in model.subgraphs or []:
        for op in graph.operators or []:
            if op_names[op.opcodeIndex] != "MUL":
                continue
            params = [_params(graph.tensors[t]) for t in [*op.inputs[:2], op.outputs[0]]]
            if any(p is None for p in params):
                continue
            if params[0][0] * params[1][0] / params[2][0] >= 1.0:
                return True
    return False


def xnnpack_int8_grids(model_content: bytes) -> bytes:
    """``model_content`` with the second operand of every int8 BATCH_MATMUL
    on a zero-point-0 grid (the file itself when nothing needed it)."""
    return _requantized(model_content, _Requantizer)


def _requantized(model_content: bytes, requantizer: type) -> bytes:
    """``model_content`` with ``requantizer`` run over each subgraph (the
    file itself when it changed nothing)."""
    model = read_model(model_content)
    op_names, int8 = opcode_names(model), schema_module().TensorType.INT8
    changed = False
    for graph in model.subgraphs or []:
        changed |= requantizer(model, graph, op_names, int8).run()
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


class _MaskedScores(_Requantizer):
    def run(self) -> bool:
        # the rule QAT trains masked scores on (imported here: edgevit.layers loads Keras, which the
        # command line imports only once its early checks have passed)
        from edgevit.layers.attention import masked_scores_range

        changed = False
        for op in self.graph.operators or []:
            if self.op_names[op.opcodeIndex] != "SOFTMAX":
                continue
            add = self._through_scale_keeping(int(op.inputs[0]))
            kept = self._runtime_operand(add, "ADD", {0.0, MASK_FLOOR})
            mul = self.producer.get(kept) if kept is not None else None
            scores = self._runtime_operand(mul, "MUL", {0.0, 1.0})
            params = _params(self.graph.tensors[scores]) if scores is not None else None
            if params is None or self.graph.tensors[scores].type != self.int8:
                continue
            scale, zero_point = params
            keys = int(self.graph.tensors[op.inputs[0]].shape[-1])
            lo, hi = masked_scores_range(scale * (-128 - zero_point), scale * (127 - zero_point), keys)
            changed |= self._set(kept, params)
            changed |= self._set(int(add.outputs[0]), _grid(lo, hi))
        return changed

    def _through_scale_keeping(self, index: int):
        op = self.producer.get(index)
        while op is not None and self.op_names[op.opcodeIndex] in SCALE_KEEPING:
            op = self.producer.get(int(op.inputs[_data_slot(self.op_names[op.opcodeIndex])]))
        return op

    def _runtime_operand(self, op, kind: str, values: set[float]) -> int | None:
        """``op``'s runtime operand when ``op`` is a ``kind`` of it and a
        constant holding just ``values`` (those below MASK_FLOOR counting as
        MASK_FLOOR), else None."""
        if op is None or self.op_names[op.opcodeIndex] != kind or len(op.inputs) != 2:
            return None
        constants = [int(t) for t in op.inputs if self._constant(int(t))]
        if len(constants) != 1 or not self._holds_only(constants[0], values):
            return None
        return next(int(t) for t in op.inputs if int(t) != constants[0])

    def _constant(self, index: int) -> bool:
        return holds_data(self.model, self.graph.tensors[index])

    def _holds_only(self, index: int, values: set[float]) -> bool:
        tensor = self.graph.tensors[index]
        params = _params(tensor)
        if tensor.type != self.int8 or params is None:
            return False
        levels = np.unique(constant_values(self.model, tensor))
        real = {MASK_FLOOR if v <= MASK_FLOOR else round(float(v), 4)
                for v in params[0] * (levels.astype(np.int64) - params[1])}
        return bool(real) and real <= values and len(real) == len(values)


def _grid(lo: float, hi: float) -> tuple[float, int]:
    """[scale, zero point] of the int8 range [lo, hi] (zero included)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = (hi - lo) / 255.0
    return scale, int(np.clip(round(-128.0 - lo / scale), -128, 127))
