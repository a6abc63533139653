"""A file that outputs probabilities, seen with its logits as the output.

Probabilities say little when two kernel sets or a file and its Keras model
are compared: an int8 softmax writes 256 steps, so over 1000 classes of
near-equal logits most probabilities are 0 on both sides. The comparisons
of kernel sets (the GPU and Arm64 runs) and the logit figures of the
validation read the softmax's input, the logits, from the same file without
its closing softmax and output cast. The softmax is left out rather than
kept unread because LiteRT 2.3's reference kernels abort (SIGABRT, no
message) on the closing int8 SOFTMAX of a 1000-class mobilevit_v3_xxs file;
the validation compares the file's own probabilities on XNNPACK.
"""
from __future__ import annotations

import contextlib
from pathlib import Path

from edgevit.litert.detection_postprocess import raw_view
from edgevit.litert.flatbuffer import Graph, read, read_model, write_model
from edgevit.writing import temporary_folder

# ops a converter puts between the softmax and the file's output
IO_CASTS = ("QUANTIZE", "DEQUANTIZE")


def closing_softmax(graph: Graph) -> tuple[int, list[int]] | None:
    """(the tensor a file's output softmax reads, the indices of the ops
    from that softmax to the output); None when the output is not a
    softmax's."""
    index, ops = graph.outputs[0], []
    while index in graph.producers:
        op = graph.ops[graph.producers[index]]
        ops.append(op.index)
        if op.name == "SOFTMAX":
            return op.inputs[0].index, ops
        if op.name not in IO_CASTS:
            return None
        index = op.inputs[0].index
    return None


def outputs_probabilities(content: bytes) -> bool:
    return closing_softmax(read(content)) is not None


def logits_view(content: bytes) -> bytes | None:
    """``content`` without its closing softmax, the softmax's input its
    output; a detector's without its detection post-processing op, the raw
    boxes and scores it reads its outputs (what its detections are decoded
    from, compared as they are: a kernel's rounding can reorder detections).
    None when the file ends in neither."""
    raw = raw_view(content)
    if raw is not content:
        return raw
    closing = closing_softmax(read(content))
    if closing is None:
        return None
    logits, ops = closing
    model = read_model(content)
    graph = model.subgraphs[0]
    output = int(graph.outputs[0])
    graph.operators = [op for i, op in enumerate(graph.operators) if i not in ops]
    graph.outputs = [logits]
    for signature in model.signatureDefs or []:
        for entry in signature.outputs or []:
            if entry.tensorIndex == output:
                entry.tensorIndex = logits
    return write_model(model, len(content) + 1024)


@contextlib.contextmanager
def logits_file(path: str | Path):
    """The path of ``path``'s logits view (a temporary file), or ``path``
    itself when the file outputs logits already."""
    view = logits_view(Path(path).read_bytes())
    if view is None:
        yield Path(path)
        return
    with temporary_folder("edgevit-logits-") as tmp:
        out = tmp / Path(path).name
        out.write_bytes(view)
        yield out
