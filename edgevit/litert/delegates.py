"""What the GPU and NNAPI delegate rules share: the report types, the
partitioning of a graph into delegated subsets, and `check()` over both
delegates (the rules behind `edgevit check` and the convert report).

`tf.lite.experimental.Analyzer(gpu_compatibility=True)` calls every model
compatible in TF 2.21 (its checks were removed upstream), so the rules are
re-stated from the delegates' own support checks (gpu_rules, nnapi_rules).
Sources (facts learned from, not code copied): google-ai-edge/LiteRT @
f6745779 (2026-08-21, the TF 2.21 era code). Partitions:
tflite/graph_info.cc (greedy grouping of supported ops into independent
subsets), delegates/gpu/delegate_options.cc (an app's GPU delegate takes only
the largest partition by default) and nnapi_delegate.h (NNAPI takes the 3
largest); `benchmark_model` takes all of them (``--max_delegated_partitions=0``).

Custom and Flex ops count as CPU ops for both delegates (except the GPU's own
custom ops). Not modelled: driver-specific limits (an NNAPI driver may still
refuse an op the delegate accepts; a GPU may lack OpenCL/OpenGL).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from edgevit.litert.flatbuffer import Graph, Op, read

QUANT8 = ("int8", "uint8")
DEFAULT_ANDROID_API = 33

Check = Callable[[Op, "Context"], "str | None"]


@dataclass
class Context:
    graph: Graph
    feature_level: int = 0
    accelerator_specified: bool = False


@dataclass
class Fallback:
    index: int
    op: str
    reason: str


@dataclass
class DelegateReport:
    delegate: str
    ops: int
    supported_ops: int
    fallbacks: list[Fallback]
    partitions: int                 # delegated partitions (all taken by benchmark_model)
    partition_sizes: list[int]
    default_max_partitions: int     # what an app's delegate with default options takes
    note: str = ""
    android_api: int | None = None
    # Ops the delegate takes but may compute wrongly: verify on the phone.
    warnings: list[Fallback] = field(default_factory=list)

    @property
    def ops_on_delegate_by_default(self) -> int:
        return sum(sorted(self.partition_sizes, reverse=True)[:self.default_max_partitions])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fallback_ops"] = len(self.fallbacks)
        d["warning_summary"] = fallback_summary(self.warnings)
        d["ops_on_delegate_by_default"] = self.ops_on_delegate_by_default
        d["fallback_summary"] = fallback_summary(self.fallbacks)
        return d


def fallback_summary(fallbacks: list[Fallback]) -> list[dict]:
    """Fallbacks grouped by (op, reason), most frequent first."""
    groups: dict[tuple, list[int]] = {}
    for f in fallbacks:
        groups.setdefault((f.op, f.reason), []).append(f.index)
    return [{"op": op, "reason": reason, "count": len(ix), "op_indices": ix}
            for (op, reason), ix in sorted(groups.items(), key=lambda kv: -len(kv[1]))]


# ---------------------------------------------------------------- helpers shared by the rule tables
def first_reason(*checks):
    for c in checks:
        if c:
            return c
    return None


def no_limits(op: Op, ctx) -> str | None:
    """The rule of an op the delegate takes whatever its parameters."""
    return None


def is_const_fp16_dequantize(op: Op) -> bool:
    """fp16 weights: both delegates fold these into their constants."""
    t = op.input(0) if op.inputs else None
    return op.name == "DEQUANTIZE" and t is not None and t.is_const and t.dtype == "float16"


# ---------------------------------------------------------------- partitions
def partition(graph: Graph, supported: list[bool]) -> list[list[int]]:
    """Group ops into the subsets TFLite forms before delegation: repeatedly
    take every ready op of the same kind (supported / not) as the first ready
    op, greedily, until all are placed. Returns the supported subsets.
    Folded fp16-weight DEQUANTIZE ops take no part (their outputs are constants)."""
    n = len(graph.ops)
    folded = getattr(graph, "folded_ops", set())
    produced = {t for t, op in graph.producers.items() if op not in folded}  # tensors written at run time
    ready_tensors: set[int] = set()
    placed = [i in folded for i in range(n)]
    subsets: list[tuple[bool, list[int]]] = []
    while not all(placed):
        kind, members = None, []
        progress = True
        while progress:
            progress = False
            for i, op in enumerate(graph.ops):
                if placed[i]:
                    continue
                if any(t is not None and t.index in produced and t.index not in ready_tensors for t in op.inputs):
                    continue
                if kind is None:
                    kind = supported[i]
                if supported[i] != kind:
                    continue
                placed[i] = True
                members.append(i)
                ready_tensors.update(t.index for t in op.outputs)
                progress = True
        if not members:  # a cycle or dangling input: stop rather than loop
            break
        subsets.append((kind, members))
    return [members for kind, members in subsets if kind]


def delegate_report(graph: Graph, delegate: str, reason_fn, ctx: Context, default_max: int, note: str,
                    android_api: int | None = None, warning_fn=None) -> DelegateReport:
    """What one delegate takes of ``graph``: ``reason_fn(op, ctx)`` says why an
    op stays on the CPU (None: the delegate takes it)."""
    reasons = [reason_fn(op, ctx) for op in graph.ops]
    supported = [r is None for r in reasons]
    parts = partition(graph, supported)
    # fp16 weight DEQUANTIZE ops are folded into constants: not counted anywhere.
    parts_sizes = [len(p) for p in parts]
    fallbacks = [Fallback(op.index, op.name, r) for op, r in zip(graph.ops, reasons) if r is not None]
    counted = len(graph.ops) - len(graph.folded_ops)
    warnings = [Fallback(op.index, op.name, w) for op, ok in zip(graph.ops, supported) if ok and warning_fn
                for w in [warning_fn(op)] if w]
    return DelegateReport(delegate=delegate, ops=counted, supported_ops=counted - len(fallbacks),
                          fallbacks=fallbacks, partitions=len(parts_sizes), partition_sizes=parts_sizes,
                          default_max_partitions=default_max, note=note, android_api=android_api,
                          warnings=warnings)


def check(model: bytes | Graph, gpu: bool = True, nnapi: bool = True, android_api: int = DEFAULT_ANDROID_API,
          nnapi_accelerator_specified: bool = False) -> dict[str, DelegateReport]:
    # The rule modules build on the types above, so this module imports them only when it runs them.
    from edgevit.litert.gpu_rules import check_gpu
    from edgevit.litert.nnapi_rules import check_nnapi

    graph = model if isinstance(model, Graph) else read(model)
    out = {}
    if gpu:
        out["gpu"] = check_gpu(graph)
    if nnapi:
        out["nnapi"] = check_nnapi(graph, android_api, nnapi_accelerator_specified)
    return out


def summary(reports: dict[str, DelegateReport]) -> dict:
    """The compact form stored in `edgevit convert` reports."""
    return {name: {"ops": r.ops, "fallback_ops": len(r.fallbacks), "partitions": r.partitions,
                   "ops_on_delegate_by_default": r.ops_on_delegate_by_default,
                   "fallbacks": fallback_summary(r.fallbacks),
                   "warnings": fallback_summary(r.warnings),
                   **({"android_api": r.android_api} if r.android_api else {})}
            for name, r in reports.items()}
