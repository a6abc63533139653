"""A rewrite of converted graphs that GPUs need: every runtime operand of an
elementwise op has the rank of the op's output, laid out with batch 1.

The TFLite converter leaves elementwise operands of lower rank than their
output: it reshapes ADD's second operand ``[1, ..., 1, C]`` to ``[C]``,
whether a constant or not, and flattens a FULLY_CONNECTED to ``[M, C]`` rows
that it then adds to a ``[1, M, C]`` tensor. XNNPACK broadcasts them right;
the GPU delegates lay a tensor out by its rank (rank 1 as a batch of C,
rank 2 as M batches of C channels: ``ExtractTensorShape`` in the GPU
delegate's model_builder_helper.cc), and LiteRT's GPU accelerator then
computes wrong answers (measured, tests/test_gpu_accelerator.py):

- a rank-1 runtime tensor and a constant ``[1, 1, C]`` are added in the wrong
  layout (ViT's class token before the first block: output cosine vs
  XNNPACK 0.3-0.8);
- in quantized files, the shader for two runtime operands of different rank
  does not compile and the op's output is never written (every later
  class-token residual, CrossViT's class-token adds), and a kernel that
  broadcasts over the batch axis does not build at all (CvT's token adds).

So each such operand becomes the tensor the converter reshaped it from when
that only dropped leading ones (the RESHAPE goes when nothing else reads
it), or a RESHAPE of a batch-1 tensor to the output's rank; a flattening
FULLY_CONNECTED keeps its leading dimensions instead. Each computes the same
values (leading ones broadcast back; a RESHAPE keeps its input's
quantization).
"""
from __future__ import annotations

import numpy as np

from edgevit.litert.flatbuffer import (holds_data, new_reshape, opcode_names, operator_links, read_model,
                                      write_model)

ELEMENTWISE = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE")


def restore_operand_ranks(model_content: bytes) -> bytes:
    """``model_content`` with every runtime elementwise operand at its
    output's rank (the file itself when nothing needed it)."""
    model = read_model(model_content)
    graphs = _Graphs(model)
    if not any(graphs.restore(graph) for graph in model.subgraphs or []):
        return model_content
    return write_model(model, len(model_content) + 1024)


class _Graphs:
    """Edits the subgraphs of one unpacked model (schema object API)."""

    def __init__(self, model):
        self.model = model
        self.op_names = opcode_names(model)

    def restore(self, graph) -> bool:
        tensors = graph.tensors or []
        producer, readers = operator_links(graph)
        operators, changed = [], False
        for op in graph.operators or []:
            name = self.op_names[op.opcodeIndex]
            if name == "FULLY_CONNECTED":
                reshape = self._keep_rows(graph, op, producer, readers)
                if reshape is not None:
                    operators.append(reshape)
                    changed = True
            elif name in ELEMENTWISE:
                rank = len(_shape(tensors[op.outputs[0]]))
                for slot, index in enumerate(op.inputs):
                    operand, made_by = tensors[index], producer.get(int(index))
                    if len(_shape(operand)) >= rank or self._is_constant(operand, made_by, tensors):
                        continue
                    target = [1] * (rank - len(_shape(operand))) + _shape(operand)
                    source = self._flattened_source(made_by, tensors)
                    origin = int(index) if source is None else source
                    if _shape(tensors[origin]) != target:
                        if _shape(tensors[origin])[:1] != [1]:
                            continue  # a RESHAPE out of the GPU's batch axis: not a fix
                        reshape = new_reshape(self.model, graph, self.op_names, origin, target)
                        operators.append(reshape)
                        origin = reshape.outputs[0]
                    op.inputs[slot] = origin
                    changed = True
            operators.append(op)
        if changed:
            read = {int(t) for op in operators for t in op.inputs if t >= 0} | {int(t) for t in graph.outputs}
            graph.operators = [op for op in operators if self.op_names[op.opcodeIndex] != "RESHAPE"
                               or any(int(t) in read for t in op.outputs)]
        return changed

    def _keep_rows(self, graph, fc, producer, readers):
        """A FULLY_CONNECTED that flattens its rows (output ``[M, C]``, which
        the GPU lays out as a batch of M) for elementwise ops of rank r gets
        an input of shape ``[1, .., 1, M, K]`` (a new RESHAPE, returned, from
        a tensor whose batch is 1) and keeps that shape in its output."""
        tensors = graph.tensors
        output = tensors[fc.outputs[0]]
        if fc.builtinOptions is None or fc.builtinOptions.keepNumDims or len(_shape(output)) != 2:
            return None
        users = readers.get(int(fc.outputs[0]), [])
        if not users or any(self.op_names[u.opcodeIndex] not in ELEMENTWISE for u in users):
            return None
        ranks = {len(_shape(tensors[u.outputs[0]])) for u in users}
        if len(ranks) != 1 or min(ranks) < 3:
            return None
        rows, width = _shape(output)
        depth = _shape(tensors[fc.inputs[0]])[-1]
        source = int(fc.inputs[0])
        flattened = self._flattened_source(producer.get(source), tensors)
        made_by = producer.get(source)
        if made_by is not None and self.op_names[made_by.opcodeIndex] == "RESHAPE" and \
                len(readers.get(source, [])) == 1:
            source = int(made_by.inputs[0]) if flattened is None else flattened
        shape = _shape(tensors[source])
        if not shape or shape[0] != 1 or int(np.prod(shape)) != rows * depth:
            return None
        rank = ranks.pop()
        reshape = new_reshape(self.model, graph, self.op_names, source, [1] * (rank - 2) + [rows, depth])
        fc.inputs[0] = reshape.outputs[0]
        fc.builtinOptions.keepNumDims = True
        output.shape = [1] * (rank - 2) + [rows, width]
        return reshape

    def _is_constant(self, tensor, made_by, tensors) -> bool:
        """A constant, or the float32 copy of float16 weights (which the GPU
        delegates fold into a constant)."""
        if made_by is not None and self.op_names[made_by.opcodeIndex] == "DEQUANTIZE":
            return self._is_constant(tensors[made_by.inputs[0]], None, tensors)
        return holds_data(self.model, tensor)

    def _flattened_source(self, reshape, tensors) -> int | None:
        """The input of ``reshape`` when it only dropped leading ones (and
        kept the quantization), else None."""
        if reshape is None or self.op_names[reshape.opcodeIndex] != "RESHAPE":
            return None
        source, flat = tensors[reshape.inputs[0]], tensors[reshape.outputs[0]]
        shape, flat_shape = _shape(source), _shape(flat)
        dropped = len(shape) - len(flat_shape)
        if dropped <= 0 or shape[dropped:] != flat_shape or any(d != 1 for d in shape[:dropped]):
            return None
        return int(reshape.inputs[0]) if _quantization(source) == _quantization(flat) else None


def _shape(tensor) -> list[int]:
    return [int(d) for d in tensor.shape] if tensor.shape is not None else []


def _quantization(tensor) -> tuple:
    q = tensor.quantization
    if q is None or q.scale is None:
        return ()
    return (tuple(float(s) for s in q.scale), tuple(int(z) for z in (q.zeroPoint if q.zeroPoint is not None else ())))
