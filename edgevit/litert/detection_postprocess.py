"""A detector's raw file with TFLite's detection post-processing appended:
the custom op ``TFLite_Detection_PostProcess`` decodes the box regressions
against the anchors, keeps each anchor's best class and suppresses overlaps,
and outputs the four tensors TFLite object-detection clients read
(locations, classes, scores, number of detections), all float32.

The op's kernel takes uint8 or float32 box and score inputs (int8 fails when
it runs) and no delegate takes it: XNNPACK, the GPU and NNAPI leave it to
LiteRT's CPU kernel, after the delegated graph. The raw file's uint8 scores
feed it as they are. Its boxes go through a DEQUANTIZE to float32 first:
with uint8 boxes the kernel reads the anchors as uint8 too, and anchors on
a 1/255 grid would move a box's centre by up to 1/510 of the image; with
float32 boxes the anchors are a float32 constant, exact. The DEQUANTIZE and
the op are the file's only float ops.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.flatbuffer import add_opcode, add_tensor, opcode_names, read_model, schema_module, tensor_name, \
    write_model

POSTPROCESS_OP = "TFLite_Detection_PostProcess"
# What the delegate rules (`edgevit check`, the convert report) say of the op.
ON_THE_CPU = ("the detection post-processing: no delegate takes it, LiteRT's CPU kernel runs it after the delegated "
              "graph")
# What the four outputs are named, in the op's order: the names MediaPipe's
# ObjectDetector and the Task Library look them up by in the metadata.
OUTPUT_NAMES = ("location", "category", "score", "number of detections")


@dataclass(frozen=True)
class Suppression:
    """The op's options (cvnets evaluates its SSD detectors with a 0.5 IoU
    and a 0.01 score threshold; COCO's mAP counts 100 detections an image)."""
    max_detections: int = 100
    iou_threshold: float = 0.5
    score_threshold: float = 0.01


def with_postprocess(model_content: bytes, anchors: np.ndarray, scales: tuple[float, float, float, float],
                     suppression: Suppression) -> bytes:
    """``model_content`` (a raw detector: outputs boxes [1, A, 4] and scores
    [1, A, C], uint8) ending in the post-processing op; ``anchors``: [A, 4]
    (ycenter, xcenter, height, width) normalised; ``scales``: (y, x, h, w),
    the inverse of the box variances. Every column of the scores is a class
    (the background already left out), so the op's classes count from 0."""
    schema = schema_module()
    model = read_model(model_content)
    graph = model.subgraphs[0]
    if len(graph.outputs) != 2:
        raise EdgevitError(f"A raw detector has two outputs (boxes, scores); this file has {len(graph.outputs)}.")
    boxes, scores = (int(i) for i in graph.outputs)
    count, classes = graph.tensors[scores].shape[1:]
    if list(graph.tensors[boxes].shape) != [1, count, 4] or anchors.shape != (count, 4):
        raise EdgevitError(f"The boxes {list(graph.tensors[boxes].shape)} and the {anchors.shape[0]} anchors do not "
                           f"fit the scores {list(graph.tensors[scores].shape)}.")
    for index in (boxes, scores):
        if graph.tensors[index].type != schema.TensorType.UINT8:
            raise EdgevitError(f"The post-processing op takes uint8 scores; {tensor_name(graph.tensors[index])} is "
                               "not uint8.")
    float_boxes = add_tensor(model, graph, f"{tensor_name(graph.tensors[boxes])}/float", [1, count, 4],
                             schema.TensorType.FLOAT32)
    dequantize = schema.OperatorT()
    dequantize.opcodeIndex = add_opcode(model, opcode_names(model), "DEQUANTIZE")
    dequantize.inputs, dequantize.outputs = [boxes], [float_boxes]
    anchor_tensor = add_tensor(model, graph, "anchors", [count, 4], schema.TensorType.FLOAT32,
                               data=np.asarray(anchors, dtype="<f4"))
    most = suppression.max_detections
    outputs = [add_tensor(model, graph, name, shape, schema.TensorType.FLOAT32)
               for name, shape in zip(OUTPUT_NAMES, ([1, most, 4], [1, most], [1, most], [1]))]
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode, code.version = POSTPROCESS_OP, 1
    model.operatorCodes.append(code)
    op = schema.OperatorT()
    op.opcodeIndex = len(model.operatorCodes) - 1
    op.inputs, op.outputs = [float_boxes, scores, anchor_tensor], outputs
    op.customOptions = list(_options(int(classes), scales, suppression))
    op.customOptionsFormat = schema.CustomOptionsFormat.FLEXBUFFERS
    graph.operators = [*graph.operators, dequantize, op]
    graph.outputs = outputs
    for signature in model.signatureDefs or []:
        signature.outputs = []
        for name, index in zip(OUTPUT_NAMES, outputs):
            entry = schema.TensorMapT()
            entry.name, entry.tensorIndex = name, index
            signature.outputs.append(entry)
    return write_model(model, len(model_content) + anchors.size * 4 + 4096)


def _options(classes: int, scales, suppression: Suppression) -> bytes:
    """The op's flexbuffer map of options, as its kernel reads them (one
    class per detection, the fast class-agnostic suppression)."""
    from flatbuffers import flexbuffers

    y, x, h, w = (float(s) for s in scales)
    builder = flexbuffers.Builder()
    with builder.Map():
        builder.Int("max_detections", suppression.max_detections)
        builder.Int("max_classes_per_detection", 1)
        builder.Int("detections_per_class", suppression.max_detections)
        builder.Bool("use_regular_nms", False)
        builder.Float("nms_score_threshold", suppression.score_threshold)
        builder.Float("nms_iou_threshold", suppression.iou_threshold)
        builder.Int("num_classes", classes)
        builder.Float("y_scale", y)
        builder.Float("x_scale", x)
        builder.Float("h_scale", h)
        builder.Float("w_scale", w)
    return bytes(builder.Finish())


def postprocessing_ops(graph) -> list[int]:
    """The indices of a file's detection post-processing ops (``graph``: a
    :class:`~edgevit.litert.flatbuffer.Graph`): the custom op and the
    DEQUANTIZE of the boxes it reads; none in a raw detector."""
    found = []
    for op in graph.ops:
        if op.name != POSTPROCESS_OP:
            continue
        found.append(op.index)
        boxes = op.inputs[0].index
        if boxes in graph.producers and graph.ops[graph.producers[boxes]].name == "DEQUANTIZE":
            found.append(graph.producers[boxes])
    return sorted(found)


def raw_view(model_content: bytes) -> bytes:
    """A file with the post-processing op seen without it: its outputs the
    boxes and scores the op reads (the file itself when it has no such op)."""
    from edgevit.litert.flatbuffer import read

    graph = read(model_content)
    dropped = postprocessing_ops(graph)
    if not dropped:
        return model_content
    op = next(graph.ops[i] for i in dropped if graph.ops[i].name == POSTPROCESS_OP)
    boxes = op.inputs[0].index
    if boxes in graph.producers and graph.producers[boxes] in dropped:
        boxes = graph.ops[graph.producers[boxes]].inputs[0].index
    model = read_model(model_content)
    subgraph = model.subgraphs[0]
    subgraph.operators = [o for i, o in enumerate(subgraph.operators) if i not in dropped]
    subgraph.outputs = [boxes, op.inputs[1].index]
    model.signatureDefs = []
    return write_model(model, len(model_content))
