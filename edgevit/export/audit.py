"""The audit stage of the export: what the converted graph contains, the
deployment rules it is held to, and what the phone delegates would take.

A full-integer precision that left a float op in the graph fails here, before
anything is packaged, validated or written; so does any graph with an op that
a GPU computes wrongly (gpu_rules.computed_wrongly): a file edgevit writes
gives the same answer on every delegate that takes it.
"""
from __future__ import annotations

from dataclasses import dataclass

from edgevit.errors import EdgevitError
from edgevit.export.convert import (CPU_FLOAT_OPS, INTEGER_PRECISIONS, epsilon_adds, ops_of_layers, score_arithmetic,
                                    short_kernel_stem)
from edgevit.export.graph import GraphSummary, describe
from edgevit.export.result import Check
from edgevit.litert import delegates as delegate_rules
from edgevit.litert.delegates import fallback_summary
from edgevit.litert.detection_postprocess import POSTPROCESS_OP, postprocessing_ops
from edgevit.litert.flatbuffer import read
from edgevit.litert.gpu_rules import computed_wrongly
from edgevit.litert.xnnpack import xnnpack_plan

MAX_RANK = 4


@dataclass
class Audit:
    summary: GraphSummary
    checks: list[Check]
    delegates: dict     # what the GPU / NNAPI delegates would leave on the CPU (the rules of `edgevit check`),
                        # and what XNNPACK leaves to LiteRT's builtin kernels here (measured)


def audit(model_content: bytes, precision: str, io_dtype: str, float_layers: tuple[str, ...] = ()) -> Audit:
    """Describe and check a converted file; raise when a full-integer precision
    left float ops in the graph (the detection post-processing op and the
    DEQUANTIZE of the boxes it reads aside: the op takes no int8, outputs
    float32 and runs on the CPU alone). ``float_layers``: the layers an
    int8_mixed file keeps in float (the model's ``mixed_float_layers``)."""
    graph = read(model_content)
    postprocessing = postprocessing_ops(graph)
    summary = describe(graph)
    dynamic = summary.dynamic_shape_ops()
    checks = [
        Check("static batch-1 shapes (no SHAPE/GATHER/PACK/REDUCE_PROD)", not dynamic,
              ", ".join(f"{k} x{v}" for k, v in dynamic.items()) or "none"),
        Check(f"max tensor rank <= {MAX_RANK}", summary.max_rank <= MAX_RANK,
              f"max rank {summary.max_rank}" + (f" ({summary.max_rank_tensor})" if summary.max_rank > MAX_RANK
                                                 else "")),  # the converter's tensor name locates a failure only
    ]
    wrong = computed_wrongly(graph)
    if wrong:
        detail = "; ".join(f"{g['op']} x{g['count']}: {g['reason']}" for g in fallback_summary(wrong)[:3])
        raise EdgevitError(f"The {precision} conversion has ops that a GPU computes wrongly ({detail}); no file "
                           "was written (docs/profiling.md, 'Delegate compatibility without a phone', says why).")
    checks.append(Check("no op a GPU computes wrongly (adjoint BATCH_MATMUL, operands the GPU lays out otherwise)",
                        True, "none"))
    if precision in INTEGER_PRECISIONS:
        floats = [op for op in summary.float_ops(allow_io_boundary=io_dtype == "float32")
                  if op.index not in postprocessing]
        detail = ", ".join(f"{op.name}#{op.index}" for op in floats[:10]) + (" ..." if len(floats) > 10 else "")
        if floats:
            raise EdgevitError(f"The {precision} conversion left float ops in the graph ({detail}); "
                               "no file was written.")
        checks.append(Check("every op integer (no float op, no inner QUANTIZE/DEQUANTIZE)"
                            + (", but the detection post-processing" if postprocessing else ""), True,
                            f"{POSTPROCESS_OP} and the DEQUANTIZE of its boxes in float, on the CPU"
                            if postprocessing else "none"))
    if precision == "int8_mixed":
        allowed = (*CPU_FLOAT_OPS, "QUANTIZE", "DEQUANTIZE")
        floats = summary.float_ops(allow_io_boundary=True)
        kept = {op.index for op in epsilon_adds(graph) + short_kernel_stem(graph) + score_arithmetic(graph)
                + ops_of_layers(graph, float_layers)}
        unexpected = [op for op in floats if op.name not in allowed and op.index not in kept]
        layers = f", {', '.join(float_layers)}" if float_layers else ""
        checks.append(Check(f"float only in {'/'.join(CPU_FLOAT_OPS)}, the LayerNorm epsilon ADD, the score "
                            f"arithmetic before a softmax, a short-kernel stem{layers} (and their (de)quantize)",
                            not unexpected,
                            ", ".join(f"{op.name}#{op.index}" for op in unexpected[:10])
                            or f"{sum(op.name in CPU_FLOAT_OPS for op in floats)} float ops"))
    delegates = delegate_rules.summary(delegate_rules.check(graph))
    delegates["xnnpack"] = xnnpack_plan(model_content, graph).summary()
    return Audit(summary, checks, delegates)

