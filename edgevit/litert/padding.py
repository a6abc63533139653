"""An image stem's explicit padding folded into its strided convolution.

PyTorch pads a strided convolution on every side; TFLite's SAME padding at
stride 2 pads only bottom/right on even inputs, so the converted graph keeps a PAD
before a VALID CONV_2D. LiteRT 1.4's XNNPACK (the Arm64 runtime of the
Android demo) folds such a PAD into the convolution only when the padded
int8 tensor's zero point is 0; an image input's is not, and the PAD then
runs on its own at a cost set by its pixel count, not its bytes. Measured
with Cortex-A76 kernels (``edgevit bench --arm a76``) on a 256x256x3 int8
image: PAD 5.6 M instructions, the 3x3 stride-2 stem convolution after it
2.2 M.

A convolution with one more kernel row and column, both zero, under SAME
padding reads exactly the pixels the PAD + VALID pair reads (SAME then pads
the same rows first), and the zero taps add nothing: the outputs are
bit-identical and the 4x4 stem costs 3.4 M. It pays where the added taps
cost less than the PAD: on few input channels (the PAD's cost per pixel
does not grow with the filters, the added taps' does; a 4x4 depthwise
kernel even falls back to XNNPACK's 25-tap kernel) and a kernel that grows
little. CvT's 7x7 stride-4 stem on 224x224: 11.9 M -> 9.1 M as an 8x8; a
PVT-like one padded by 3 would need a 10x10: 12.0 M -> 13.9 M, kept.
LiteRT 2.x's XNNPACK folds the PAD at any zero point, where a folded stem
costs its added MACs (x86, LiteRT 2.3: 190 vs 125 microseconds for the
MobileViT stem, 1 thread).
"""
from __future__ import annotations

import numpy as np

from edgevit.litert.flatbuffer import (constant_values, holds_data, opcode_names, operator_links, read_model,
                                      schema_module, write_model)

# image stems: RGB or grey inputs (and RGBA)
MAX_STEM_CHANNELS = 4
# Cortex-A76 kernels of LiteRT 1.4 on image stems (the counts above): an int8
# PAD costs about 85 instructions per padded pixel, a strided convolution's
# added taps one instruction per 4.5 multiply-accumulates.
PAD_INSTRUCTIONS_PER_PIXEL = 85
STEM_MACS_PER_INSTRUCTION = 4.5


def fold_stem_padding(model_content: bytes) -> bytes:
    """``model_content`` with each int8 PAD (zero point not 0) before a VALID
    CONV_2D on at most :data:`MAX_STEM_CHANNELS` channels folded into a SAME
    convolution where that costs fewer instructions (the file itself when
    there is none)."""
    model = read_model(model_content)
    op_names = opcode_names(model)
    folded = [_fold_into_convolutions(model, graph, op_names) for graph in model.subgraphs or []]
    return write_model(model, len(model_content) + 4096) if any(folded) else model_content


def same_kernel_size(size: int, before: int, after: int, kernel: int, stride: int) -> int | None:
    """The kernel size that, with SAME padding over ``size`` inputs at
    ``stride``, pads ``before`` first and gives as many outputs as a VALID
    ``kernel`` over the input padded by ``before`` / ``after`` (its extra
    taps last); None when none does within one stride."""
    outputs = (size + before + after - kernel) // stride + 1
    if outputs != -(-size // stride):
        return None
    for extended in range(kernel, kernel + stride + 1):
        if max((outputs - 1) * stride + extended - size, 0) // 2 == before:
            return extended
    return None


def _fold_into_convolutions(model, graph, op_names: list[str]) -> bool:
    schema = schema_module()
    _, readers = operator_links(graph)
    buffer_users: dict[int, int] = {}
    for tensor in graph.tensors or []:
        buffer_users[tensor.buffer] = buffer_users.get(tensor.buffer, 0) + 1
    removed = []
    for pad in graph.operators or []:
        if op_names[pad.opcodeIndex] != "PAD":
            continue
        fold = _stem_convolution(model, graph, pad, readers, buffer_users, op_names)
        if fold is None:
            continue
        conv, sizes = fold
        weights = graph.tensors[conv.inputs[1]]
        kernel = [int(d) for d in weights.shape]
        extended = np.zeros((kernel[0], *sizes, kernel[3]), np.int8)
        extended[:, :kernel[1], :kernel[2], :] = constant_values(model, weights).reshape(kernel)
        model.buffers[weights.buffer].data = extended.view(np.uint8).ravel()
        weights.shape = list(extended.shape)
        conv.builtinOptions.padding = schema.Padding.SAME
        conv.inputs[0] = pad.inputs[0]
        removed.append(pad)
    graph.operators = [op for op in graph.operators or [] if all(op is not pad for pad in removed)]
    return bool(removed)


def _stem_convolution(model, graph, pad, readers, buffer_users, op_names: list[str]):
    """(the CONV_2D, its SAME kernel height and width) when ``pad`` is an
    int8 image stem's spatial PAD that only that convolution reads (VALID,
    undilated, int8 weights of its own); else None."""
    schema, tensors = schema_module(), graph.tensors
    padded, source = int(pad.outputs[0]), tensors[pad.inputs[0]]
    users = readers.get(padded, [])
    if len(users) != 1 or padded in graph.outputs or not holds_data(model, tensors[pad.inputs[1]]):
        return None
    conv = users[0]
    options = conv.builtinOptions
    if op_names[conv.opcodeIndex] != "CONV_2D" or int(conv.inputs[0]) != padded or \
            options.padding != schema.Padding.VALID or (options.dilationHFactor, options.dilationWFactor) != (1, 1):
        return None
    if not _int8_off_zero(source) or source.shape is None or len(source.shape) != 4 or \
            source.shape[3] > MAX_STEM_CHANNELS:
        return None
    weights = tensors[conv.inputs[1]]
    if weights.type != schema.TensorType.INT8 or len(readers.get(int(conv.inputs[1]), [])) != 1 or \
            model.buffers[weights.buffer].data is None or buffer_users[weights.buffer] != 1:
        return None
    paddings = constant_values(model, tensors[pad.inputs[1]]).reshape(4, 2)
    if paddings[0].any() or paddings[3].any():
        return None
    sizes = [same_kernel_size(int(source.shape[1 + axis]), int(paddings[1 + axis][0]), int(paddings[1 + axis][1]),
                              int(weights.shape[1 + axis]), stride)
             for axis, stride in enumerate((options.strideH, options.strideW))]
    if None in sizes:
        return None
    filters, height, width, channels = (int(d) for d in weights.shape)
    outputs = int(np.prod([int(d) for d in tensors[conv.outputs[0]].shape[1:3]]))
    added_macs = outputs * filters * channels * (sizes[0] * sizes[1] - height * width)
    padded_pixels = int(np.prod([int(d) for d in tensors[padded].shape[1:3]]))
    if added_macs / STEM_MACS_PER_INSTRUCTION >= PAD_INSTRUCTIONS_PER_PIXEL * padded_pixels:
        return None
    return conv, sizes


def _int8_off_zero(tensor) -> bool:
    """An int8 tensor whose zero point is not 0: the PAD XNNPACK 1.4 keeps."""
    q = tensor.quantization
    return tensor.type == schema_module().TensorType.INT8 and q is not None and q.zeroPoint is not None and \
        len(q.zeroPoint) == 1 and int(q.zeroPoint[0]) != 0

