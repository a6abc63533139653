"""Each int8 LayerNorm's ``RSQRT(variance + epsilon)`` as two 1x1
convolutions, so that no device needs a quantized RSQRT.

NNAPI takes a quantized RSQRT only from Android 14 (feature level 7), so
below it every LayerNorm sends the graph back to the CPU; XNNPACK has no int8
RSQRT and declines the int8 epsilon ADD (its constant's scale is ~1e-7 of the
variance's), so each LayerNorm splits the CPU graph too.

An op of one int8 input is a function on its 256 levels, and two int8
CONV_2D ops compute a piecewise-linear function of a level exactly in
integers: the first, with a fused ReLU and one output channel per knot
``t``, writes ``relu(q - t)`` (weight 1, so the level difference itself, on
the input's own scale); the second sums those with the slope changes as
integer weights and requantizes by ``1/STEPS``, so slopes are multiples of
``1/STEPS`` output levels per input level. The knots are fitted so that
every input level gives exactly the output level of ADD-then-RSQRT computed
in real numbers, each op rounding to its own grid, which is what a QAT model
trained on those grids computes (LiteRT's int8 RSQRT kernel approximates
it). On MobileViT's LayerNorms that takes 60-80 knots. Both convolutions are
int8 ops that NNAPI has taken since Android 10 and XNNPACK runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgevit.litert.flatbuffer import (add_opcode, add_tensor, constant_values, holds_data, new_reshape,
                                      opcode_names, operator_links, read_model, schema_module, tensor_name,
                                      write_model)

STEPS = 64          # slope resolution: 1/64 output level per input level
LEVELS = np.arange(-128, 128)


@dataclass(frozen=True)
class PiecewiseLinear:
    """``round(start + sum_k weights[k] * relu(q - knots[k]) / STEPS)``
    for an int8 level ``q``: ``start`` in units of 1/STEPS output levels,
    ``knots`` ascending (repeated where a slope change exceeds an int8
    weight)."""
    start: int
    knots: np.ndarray
    weights: np.ndarray

    def __call__(self, levels: np.ndarray) -> np.ndarray:
        ramps = np.maximum(np.asarray(levels)[:, None] - self.knots[None, :], 0)
        accumulated = self.start + ramps @ self.weights.astype(np.int64)
        return np.clip(np.floor(accumulated / STEPS + 0.5), -128, 127).astype(np.int64)


def fit(target: np.ndarray) -> PiecewiseLinear:
    """The piecewise-linear function that gives, on every int8 input level
    -128..127, the output level nearest to ``target`` (the exact output in
    output levels, +inf where it overflows): it stays within
    ``0.5 - 1/STEPS`` of that level, so either rounding of a midpoint agrees."""
    levels = np.clip(np.round(target), -128, 127)
    margin = 0.5 - 1 / STEPS
    lower = np.where(levels <= -128, -np.inf, levels - margin)
    upper = np.where(levels >= 127, np.inf, levels + margin)
    start = int(np.ceil(STEPS * lower[0])) if np.isfinite(lower[0]) else int(np.floor(STEPS * upper[0]))
    knots, slopes = [], []
    position, value = 0, start
    while position < len(target) - 1:
        low, high, end, slope = -np.inf, np.inf, position, 0
        for q in range(position + 1, len(target)):
            run = q - position
            low = max(low, np.ceil((STEPS * lower[q] - value) / run))
            high = min(high, np.floor((STEPS * upper[q] - value) / run))
            if low > high:
                break
            end = q
            slope = int(np.clip(0, low, high)) if np.isinf(low) or np.isinf(high) else int((low + high) // 2)
        if end == position:
            raise ValueError("no slope fits one level step")  # cannot happen: each step's interval is non-empty
        knots.append(position)
        slopes.append(slope)
        value += slope * (end - position)
        position = end
    changes = np.diff(np.array([0, *slopes]))
    chunked_knots, chunked_weights = [], []
    for knot, change in zip(knots, changes):
        while change != 0:
            piece = int(np.clip(change, -127, 127))
            chunked_knots.append(knot - 128)
            chunked_weights.append(piece)
            change -= piece
    return PiecewiseLinear(start, np.array(chunked_knots, dtype=np.int64), np.array(chunked_weights, dtype=np.int64))


def rsqrt_as_convolutions(model_content: bytes) -> bytes:
    """``model_content`` with every int8 RSQRT, and the constant ADD feeding
    only it, replaced by the two convolutions (the file itself when it has
    none)."""
    model = read_model(model_content)
    op_names = opcode_names(model)
    changed = False
    for graph in model.subgraphs or []:
        changed |= _RsqrtRewriter(model, graph, op_names).run()
    if not changed:
        return model_content
    return write_model(model, len(model_content) + 65536)


class _RsqrtRewriter:
    def __init__(self, model, graph, op_names):
        self.model, self.graph, self.op_names = model, graph, op_names
        self.schema = schema_module()
        self.producer, self.readers = operator_links(graph)

    def run(self) -> bool:
        int8 = self.schema.TensorType.INT8
        operators, removed, changed = [], set(), False
        for op in self.graph.operators or []:
            output = self.graph.tensors[op.outputs[0]]
            if self.op_names[op.opcodeIndex] != "RSQRT" or output.type != int8 or \
                    self.graph.tensors[op.inputs[0]].type != int8:
                operators.append(op)
                continue
            source, target = self._function(op)
            if source != int(op.inputs[0]):
                removed.add(id(self.producer[int(op.inputs[0])]))
            operators.extend(self._convolutions(source, int(op.outputs[0]), fit(target)))
            changed = True
        self.graph.operators = [op for op in operators if id(op) not in removed]
        return changed

    def _function(self, rsqrt) -> tuple[int, np.ndarray]:
        """The tensor the new ops read and, per level of it, the exact output
        (in output levels) of the RSQRT and the epsilon ADD folded into it."""
        tensors, index = self.graph.tensors, int(rsqrt.inputs[0])
        source, values = index, _dequantize(tensors[index], LEVELS)
        add = self.producer.get(index)
        if add is not None and self.op_names[add.opcodeIndex] == "ADD" and len(self.readers[index]) == 1 and \
                index not in {int(t) for t in self.graph.outputs} and not _fused(add):
            constants = [int(t) for t in add.inputs if self._constant(int(t))]
            runtime = [int(t) for t in add.inputs if not self._constant(int(t))]
            if len(constants) == 1 and len(runtime) == 1 and \
                    tensors[runtime[0]].type == tensors[constants[0]].type == tensors[index].type:
                epsilon = _dequantize(tensors[constants[0]], self._data(constants[0]))
                if epsilon.size == 1:
                    source = runtime[0]
                    summed = _dequantize(tensors[source], LEVELS) + float(epsilon[0])
                    values = _dequantize(tensors[index], _quantize(tensors[index], summed))
        with np.errstate(divide="ignore"):
            inverse_root = np.where(values > 0, 1.0 / np.sqrt(np.maximum(values, 1e-30)), np.inf)
        scale, zero_point = _params(tensors[int(rsqrt.outputs[0])])
        return source, inverse_root / scale + zero_point

    def _convolutions(self, source: int, output: int, function: PiecewiseLinear) -> list:
        """[RESHAPE,] CONV_2D (one ReLU ramp per knot), CONV_2D (their
        weighted sum), [RESHAPE] from tensor ``source`` to ``output``."""
        schema, graph, model = self.schema, self.graph, self.model
        knots, weights = function.knots, function.weights
        if len(knots) == 0:  # a constant function: one ramp with weight 0
            knots, weights = np.array([-128]), np.array([0])
        in_scale, in_zero = _params(graph.tensors[source])
        out_scale, out_zero = _params(graph.tensors[output])
        shape = [int(d) for d in graph.tensors[source].shape]
        grid = shape if len(shape) == 4 and shape[-1] == 1 else [1, 1, int(np.prod(shape)), 1]
        if len(shape) < 4 and shape[-1] == 1:
            grid = [1] * (4 - len(shape)) + shape
        name = tensor_name(graph.tensors[output])
        ops = []
        if grid != shape:
            ops.append(new_reshape(model, graph, self.op_names, source, grid))
            source = ops[-1].outputs[0]
        count = len(knots)
        int8, int32 = schema.TensorType.INT8, schema.TensorType.INT32
        ramps = add_tensor(model, graph, name + "/ramps", grid[:3] + [count], int8, _quantization([in_scale], [-128]))
        ramp_filter = add_tensor(model, graph, name + "/ramp_filter", [count, 1, 1, 1], int8,
                                 _quantization([1 / 127] * count, [0] * count), np.full(count, 127, np.int8))
        ramp_bias = add_tensor(model, graph, name + "/ramp_bias", [count], int32,
                               _quantization([in_scale / 127] * count, [0] * count),
                               (127 * (in_zero - knots)).astype("<i4"))
        ops.append(self._conv(source, ramp_filter, ramp_bias, ramps, schema.ActivationFunctionType.RELU))
        sum_scale = out_scale / (STEPS * in_scale)
        summed = output if grid == shape else add_tensor(model, graph, name + "/table", grid, int8,
                                                          _quantization([out_scale], [out_zero]))
        sum_filter = add_tensor(model, graph, name + "/slope_changes", [1, 1, 1, count], int8,
                                _quantization([sum_scale], [0]), weights.astype(np.int8))
        sum_bias = add_tensor(model, graph, name + "/start", [1], int32, _quantization([in_scale * sum_scale], [0]),
                              np.array([function.start - STEPS * out_zero], dtype="<i4"))
        ops.append(self._conv(ramps, sum_filter, sum_bias, summed, schema.ActivationFunctionType.NONE))
        if grid != shape:
            ops.append(new_reshape(model, graph, self.op_names, summed, shape, output=output))
        return ops

    def _conv(self, source: int, weights: int, bias: int, output: int, activation: int):
        schema = self.schema
        options = schema.Conv2DOptionsT()
        options.padding, options.strideW, options.strideH = schema.Padding.VALID, 1, 1
        options.dilationWFactor = options.dilationHFactor = 1
        options.fusedActivationFunction = activation
        op = schema.OperatorT()
        op.opcodeIndex = add_opcode(self.model, self.op_names, "CONV_2D", version=3)
        op.inputs, op.outputs = [source, weights, bias], [output]
        op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.Conv2DOptions, options
        return op

    def _constant(self, index: int) -> bool:
        return holds_data(self.model, self.graph.tensors[index])

    def _data(self, index: int) -> np.ndarray:
        return constant_values(self.model, self.graph.tensors[index]).astype(np.int64)


def _params(tensor) -> tuple[float, int]:
    q = tensor.quantization
    return float(q.scale[0]), int(q.zeroPoint[0])


def _dequantize(tensor, levels: np.ndarray) -> np.ndarray:
    scale, zero_point = _params(tensor)
    return scale * (np.asarray(levels, dtype=np.float64) - zero_point)


def _quantize(tensor, values: np.ndarray) -> np.ndarray:
    scale, zero_point = _params(tensor)
    return np.clip(np.round(values / scale) + zero_point, -128, 127)


def _fused(op) -> bool:
    options = op.builtinOptions
    return options is not None and getattr(options, "fusedActivationFunction", 0) != 0


def _quantization(scales: list[float], zero_points: list[int]):
    q = schema_module().QuantizationParametersT()
    q.scale, q.zeroPoint, q.quantizedDimension = list(scales), list(zero_points), 0
    return q
