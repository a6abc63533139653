"""A full-integer file's input turned into the camera's RGB bytes.

The clients app developers load classifiers with (MediaPipe Tasks, the TFLite
Task Library) feed an integer image input the bytes as they are: they take
uint8 (or float32) inputs, refuse int8 ones, and normalise only float inputs.
So a uint8 file takes pixels 0-255 and normalises them itself:

- where the model's normalisation is one scale and an integer zero point
  (the same mean and std on every channel, 255 * mean whole: MobileViT's
  pixels in [0, 1]), the uint8 input carries it as its quantization and one
  QUANTIZE requantizes the bytes to the int8 input the graph was converted
  with;
- otherwise (ImageNet's per-channel mean and std, or a mean of 0.5) the bytes
  are requantized to int8 as they are (scale 1, zero point -128) and a 1x1
  depthwise convolution computes ``(pixel / 255 - mean) / std`` per channel
  into that int8 input: weights of 127 steps each (exact), the bias rounded
  to a 1/127 of a weight step.
"""
from __future__ import annotations

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.flatbuffer import add_opcode, add_tensor, opcode_names, read_model, schema_module, tensor_name, \
    write_model

# int8 weights symmetric over [-127, 127]: each channel's weight is the top step
WEIGHT_STEPS = 127


def single_scale(mean, std) -> tuple[float, int] | None:
    """(scale, zero point) of a uint8 input whose real values are the
    normalised pixels; None when the normalisation is not one."""
    if len(set(mean)) != 1 or len(set(std)) != 1:
        return None
    zero_point = 255.0 * mean[0]
    if abs(zero_point - round(zero_point)) > 1e-6 or not 0 <= round(zero_point) <= 255:
        return None
    return 1.0 / (255.0 * std[0]), int(round(zero_point))


def take_rgb_bytes(model_content: bytes, mean, std) -> bytes:
    """``model_content`` (an int8-input file whose input is the normalised
    image) with a uint8 input that takes the image's bytes instead."""
    schema = schema_module()
    model = read_model(model_content)
    graph = model.subgraphs[0]
    image = int(graph.inputs[0])
    normalised = graph.tensors[image]
    if normalised.type != schema.TensorType.INT8 or len(normalised.shape) != 4 or normalised.shape[-1] != len(mean):
        raise EdgevitError(f"Only an int8 image input [1, H, W, {len(mean)}] can take the camera's bytes "
                           f"(this one is {list(normalised.shape)}).")
    op_names = opcode_names(model)
    name = tensor_name(normalised)
    normalised.name = f"{name}/normalised"
    quantization = single_scale(mean, std)
    pixels = add_tensor(model, graph, name, list(normalised.shape), schema.TensorType.UINT8,
                        _per_tensor(*(quantization or (1.0, 0))))
    if quantization is not None:
        ops = [_op(model, op_names, "QUANTIZE", [pixels], [image])]
    else:
        shifted = add_tensor(model, graph, f"{name}/int8", list(normalised.shape), schema.TensorType.INT8,
                             _per_tensor(1.0, -128))
        ops = [_op(model, op_names, "QUANTIZE", [pixels], [shifted]),
               _normalisation(model, graph, op_names, shifted, image, mean, std)]
    graph.operators = ops + list(graph.operators)
    graph.inputs = [pixels]
    for signature in model.signatureDefs or []:
        for entry in signature.inputs or []:
            if entry.tensorIndex == image:
                entry.tensorIndex = pixels
    return write_model(model, len(model_content) + 4096)


def _normalisation(model, graph, op_names, source: int, target: int, mean, std):
    """DEPTHWISE_CONV_2D 1x1 from the bytes (scale 1) to ``target``:
    ``pixel / (255 std) - mean / std`` per channel."""
    schema = schema_module()
    weights = np.asarray([1.0 / (255.0 * s) for s in std])
    weight_scales = weights / WEIGHT_STEPS
    bias = np.round(np.asarray([-m / s for m, s in zip(mean, std)]) / weight_scales).astype("<i4")
    channels = len(mean)
    kernel = add_tensor(model, graph, f"{tensor_name(graph.tensors[source])}/normalise_weights", [1, 1, 1, channels],
                        schema.TensorType.INT8, _per_channel(weight_scales, axis=3),
                        data=np.full(channels, WEIGHT_STEPS, dtype=np.int8))
    offsets = add_tensor(model, graph, f"{tensor_name(graph.tensors[source])}/normalise_bias", [channels],
                         schema.TensorType.INT32, _per_channel(weight_scales, axis=0), data=bias)
    options = schema.DepthwiseConv2DOptionsT()
    options.padding, options.strideW, options.strideH, options.depthMultiplier = schema.Padding.VALID, 1, 1, 1
    options.dilationWFactor = options.dilationHFactor = 1
    op = _op(model, op_names, "DEPTHWISE_CONV_2D", [source, kernel, offsets], [target], version=3)
    op.builtinOptionsType, op.builtinOptions = schema.BuiltinOptions.DepthwiseConv2DOptions, options
    return op


def _op(model, op_names, name: str, inputs: list[int], outputs: list[int], version: int = 2):
    op = schema_module().OperatorT()
    op.opcodeIndex = add_opcode(model, op_names, name, version)
    op.inputs, op.outputs = inputs, outputs
    return op


def _per_tensor(scale: float, zero_point: int):
    q = schema_module().QuantizationParametersT()
    q.scale, q.zeroPoint = [float(scale)], [int(zero_point)]
    return q


def _per_channel(scales: np.ndarray, axis: int):
    q = schema_module().QuantizationParametersT()
    q.scale, q.zeroPoint, q.quantizedDimension = [float(s) for s in scales], [0] * len(scales), axis
    return q
