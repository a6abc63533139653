"""Which ops of a file LiteRT's XNNPACK delegate takes on this machine,
read from a real interpreter after delegation (not from a rule table).

Every op XNNPACK does not take runs on LiteRT's builtin kernels and splits
the graph: each split costs a hand-over of tensors between the two runtimes,
and int8 builtin kernels are far slower than XNNPACK's. The interpreter keeps
the original nodes and appends one node per delegated partition, whose
inputs and outputs are the tensors crossing its boundary; the ops inside a
partition are found by walking back from its outputs to its inputs.

XNNPACK's x86 kernels also differ by CPU (edgevit.litert.x86_levels): an
int8 MEAN over the innermost axes sums in 16-bit lanes where the CPU has no
AVX-512, and LiteRT 2.3's sums overflow past 4096 elements (SSE4, AVX) or
8192 (AVX2): :func:`means_wrong_on_older_x86` names those MEANs, which the
plan reports as warnings. edgevit's own graphs have none (a GroupNorm's mean
runs over the positions first); a QAT model saved before that has.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from edgevit.litert.flatbuffer import Graph, read
from edgevit.litert.interpreter import load_interpreter
from edgevit.native_output import native_output_captured


# XNNPACK declines an op it has no kernel for, or whose types or quantization
# its kernel does not take (an int8 ADD of operands with far-apart scales)
NOT_TAKEN = "XNNPACK did not take it (its types or quantization)"
# the most elements an int8 MEAN over the innermost axes sums right on every x86 kernel set (SSE4's)
SAFE_INNERMOST_MEAN = 4096
WRONG_ON_OLDER_X86 = (f"an int8 MEAN over more than {SAFE_INNERMOST_MEAN} innermost elements: x86 CPUs "
                      "without AVX-512 sum it in 16-bit lanes, which overflow in LiteRT 2.3 (right on AVX-512 "
                      "and Arm64)")


@dataclass(frozen=True)
class XnnpackPlan:
    ops: int
    partitions: int
    builtin_ops: dict     # op name -> count of the ops XNNPACK left to the builtin kernels
    wrong_on_older_x86: dict = field(default_factory=dict)  # op name -> count (means_wrong_on_older_x86)

    @property
    def whole_graph(self) -> bool:
        return self.partitions == 1 and not self.builtin_ops

    def summary(self) -> dict:
        """The form the export report stores (the delegate reports' keys)."""
        builtin = sum(self.builtin_ops.values())
        return {"ops": self.ops, "fallback_ops": builtin, "partitions": self.partitions,
                "ops_on_delegate_by_default": self.ops - builtin,
                "fallbacks": [{"op": name, "count": count, "reason": NOT_TAKEN}
                              for name, count in sorted(self.builtin_ops.items(), key=lambda kv: -kv[1])],
                "warnings": [{"op": name, "count": count, "reason": WRONG_ON_OLDER_X86}
                             for name, count in self.wrong_on_older_x86.items()]}


def xnnpack_plan(model_content: bytes, graph: Graph | None = None) -> XnnpackPlan:
    """``graph``: ``model_content`` already read, if the caller has it."""
    graph = read(model_content) if graph is None else graph
    with native_output_captured():
        interpreter = load_interpreter(model_content, num_threads=1, kernels="xnnpack")
        interpreter.allocate_tensors()
    delegated: set[int] = set()
    partitions = 0
    for node in range(len(graph.ops), interpreter._interpreter.NumNodes()):
        details = interpreter._get_op_details(node)
        partitions += 1
        boundary = {int(t) for t in details["inputs"]}
        pending = [int(t) for t in details["outputs"]]
        while pending:
            tensor = pending.pop()
            op = graph.producers.get(tensor)
            if tensor in boundary or op is None or op in delegated:
                continue
            delegated.add(op)
            pending.extend(t.index for t in graph.ops[op].inputs if t is not None)
    builtin = Counter(op.name for op in graph.ops if op.index not in delegated and op.index not in graph.folded_ops)
    wrong = Counter(graph.ops[i].name for i in means_wrong_on_older_x86(graph) if i in delegated)
    return XnnpackPlan(ops=len(graph.ops), partitions=partitions, builtin_ops=dict(builtin),
                       wrong_on_older_x86=dict(wrong))


def means_wrong_on_older_x86(graph: Graph) -> list[int]:
    """The int8 MEANs whose innermost run of reduced elements (axes of size
    1 left out, as XNNPACK leaves them) is longer than SAFE_INNERMOST_MEAN."""
    wrong = []
    for op in graph.ops:
        x, axes = op.input(0), op.input(1)
        if op.name != "MEAN" or x is None or x.dtype not in ("int8", "uint8") or axes is None or axes.data is None:
            continue
        reduced = {int(a) % x.rank for a in np.asarray(axes.data).ravel()}
        run = 1
        for axis in reversed(range(x.rank)):
            if x.shape[axis] == 1:
                continue
            if axis not in reduced:
                break
            run *= x.shape[axis]
        if run > SAFE_INNERMOST_MEAN:
            wrong.append(op.index)
    return wrong
