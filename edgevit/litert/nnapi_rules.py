"""Which ops the NNAPI delegate would leave on the CPU, op by op, for an
Android API level.

Re-stated (facts learned from, not code copied) from google-ai-edge/LiteRT @
f6745779, the TF 2.21 era code: tflite/delegates/nnapi/nnapi_delegate.cc
``NNAPIDelegateKernel::Validate`` (ops, max versions, input dtypes, ranks,
Android feature levels) and nnapi_delegate_kernel.h (feature levels).
"""
from __future__ import annotations

from edgevit.litert.delegates import (
    DEFAULT_ANDROID_API,
    QUANT8,
    Check,
    Context,
    DelegateReport,
    delegate_report,
    first_reason,
    is_const_fp16_dequantize,
    no_limits,
)
from edgevit.litert.detection_postprocess import ON_THE_CPU, POSTPROCESS_OP
from edgevit.litert.flatbuffer import Graph, Op, read

NNAPI_DEFAULT_MAX_PARTITIONS = 3

# Android API level -> NNAPI runtime feature level the delegate compares with.
FL5, FL6, FL7, FL8 = 31, 1000006, 1000007, 1000008


def nnapi_feature_level(api: int) -> int:
    if api <= 30:
        return api
    if api <= 32:
        return FL5
    return {33: FL6, 34: FL7}.get(api, FL8)


def _in_type(op: Op, i: int = 0) -> str:
    t = op.input(i)
    return t.dtype if t is not None else "none"


def _types(op: Op, allowed, i: int = 0, what: str = "input") -> str | None:
    dt = _in_type(op, i)
    return None if dt in allowed else f"{what} type {dt} (supported: {', '.join(allowed)})"


def _min_level(ctx: Context, level: int) -> str | None:
    return None if ctx.feature_level >= level else f"needs {_level_name(level)}"


def _level_name(level: int) -> str:
    names = {28: "Android 9 (NNAPI 1.1)", 29: "Android 10 (NNAPI 1.2)", 30: "Android 11 (NNAPI 1.3)",
             FL5: "Android 12 (NNAPI feature level 5)", FL6: "Android 13 (NNAPI feature level 6)",
             FL7: "Android 14 (NNAPI feature level 7)", FL8: "Android 15 (NNAPI feature level 8)"}
    return names.get(level, f"NNAPI level {level}")


def _ranks_le4(op: Op, *idx) -> str | None:
    for i in idx:
        t = op.input(i)
        if t is not None and t.rank > 4:
            return f"{t.rank}-D input (rank <= 4)"
    return None


F32 = ("float32",)
FQ8 = ("float32", "int8", "uint8")
FQ8I32 = ("float32", "int8", "uint8", "int32")


def _nn_add_mul(op, ctx):
    allowed = FQ8I32 if ctx.feature_level >= 30 else FQ8
    return first_reason(_types(op, allowed), _ranks_le4(op, 0, 1))


def _nn_sub(op, ctx):
    dt, lvl = _in_type(op), ctx.feature_level
    ok = (lvl >= 28 and dt == "float32") or (lvl >= 29 and dt in QUANT8) or (lvl >= 30 and dt == "int32")
    return first_reason(None if ok else f"input type {dt} at {_level_name(lvl)}", _ranks_le4(op, 0, 1))


def _nn_conv(op, ctx):
    o = op.options
    return first_reason(None if len(op.inputs) == 3 and op.inputs[2] is not None else "Conv2D without bias",
                  _min_level(ctx, 29) if (o.get("dilationHFactor", 1) != 1 or o.get("dilationWFactor", 1) != 1)
                  else None,
                  _types(op, ("float32", "uint8")) if ctx.feature_level < 29 else None)


def _nn_depthwise(op, ctx):
    if ctx.feature_level < 29:
        o = op.options
        return first_reason(_types(op, ("float32", "uint8")),
                      "dilation before Android 10" if o.get("dilationHFactor", 1) != 1 or
                      o.get("dilationWFactor", 1) != 1 else None)
    return None


def _nn_fc(op, ctx):
    return first_reason("int16 output" if op.outputs[0].dtype == "int16" else None,
                  _min_level(ctx, 30) if op.options.get("keepNumDims") else None)


def _nn_softmax(op, ctx):
    r = op.input(0).rank
    return first_reason(_types(op, FQ8), None if op.outputs[0].dtype in FQ8 else f"{op.outputs[0].dtype} output",
                  None if r <= 4 else f"{r}-D input (rank <= 4)",
                  None if ctx.feature_level >= 29 or r in (2, 4) else "only 2-D/4-D input before Android 10")


def _nn_reshape(op, ctx):
    allowed = FQ8 if ctx.feature_level < FL6 else FQ8I32
    return first_reason(_types(op, allowed), _ranks_le4(op, 0),
                  f"{op.outputs[0].rank}-D output (rank <= 4)" if op.outputs[0].rank > 4 else None,
                  "shape input not constant" if len(op.inputs) >= 2 and op.input(1) is not None
                  and not op.input(1).is_const else None)


def _nn_resize(op, ctx):
    o = op.options
    size = op.input(1)
    return first_reason(_min_level(ctx, 29) if op.name == "RESIZE_NEAREST_NEIGHBOR" else None,
                  None if op.input(0).rank == 4 else "input must be 4-D", _types(op, FQ8),
                  None if size is not None and size.is_const else "size input not constant",
                  "align_corners/half_pixel_centers need Android 11" if ctx.feature_level <= 29 and
                  (o.get("alignCorners") or o.get("halfPixelCenters")) else None)


def _nn_concat(op, ctx):
    return first_reason("fused activation" if op.options.get("fusedActivationFunction") else None,
                  _ranks_le4(op, 0), _types(op, ("float16", "float32", "uint8", "int8")))


def _nn_dequantize(op, ctx):
    t = op.input(0)
    if t.dtype == "float16" and not t.is_const:
        return _min_level(ctx, 30)
    return _types(op, ("uint8",) if ctx.feature_level < 29 else QUANT8)


def _nn_mean(op, ctx):
    return first_reason(_min_level(ctx, 28), _types(op, FQ8 if ctx.feature_level >= 29 else F32),
                  "scalar output" if op.outputs[0].rank == 0 else None, _ranks_le4(op, 0))


def _nn_sqdiff(op, ctx):
    lvl = ctx.feature_level
    allowed = FQ8I32 if lvl >= 30 else (("float32", "uint8") if lvl >= 29 else F32)
    return first_reason(_min_level(ctx, 28), _types(op, allowed), _ranks_le4(op, 0, 1))


def _nn_batch_matmul(op, ctx):
    a, b = op.input(0), op.input(1)
    broadcast = a.rank != b.rank or a.shape[:-2] != b.shape[:-2]
    return first_reason(_min_level(ctx, FL6), _types(op, ("float32", "int32", "int8")),
                  None if a.dtype == b.dtype else "mixed operand types (hybrid)",
                  None if 2 <= a.rank <= 4 else f"{a.rank}-D input (2-D to 4-D)",
                  "broadcast batch matmul" if broadcast else None)


def _nn_transpose(op, ctx):
    perm = op.input(1)
    return first_reason(_min_level(ctx, 28), None if perm is not None and perm.is_const else "permutation not constant")


def _nn_quantize(op, ctx):
    out = op.outputs[0].dtype
    return first_reason(_min_level(ctx, 29), None if _in_type(op) == "float32" or _in_type(op) in QUANT8 else
                  f"input type {_in_type(op)}",
                  None if out == "uint8" or (out == "int8" and ctx.feature_level >= 30) else f"{out} output")


def _nn(level: int = 0, types=None, check: Check | None = None) -> Check:
    def rule(op, ctx):
        return first_reason(_min_level(ctx, level) if level else None, _types(op, types) if types else None,
                      check(op, ctx) if check else None)
    return rule


def _nn_pool(op, ctx):
    o = op.options
    big = op.name == "AVERAGE_POOL_2D" and _in_type(op) in QUANT8 and not ctx.accelerator_specified and \
        o.get("filterHeight", 1) * o.get("filterWidth", 1) > 256
    return first_reason(_types(op, FQ8), "quantized pooling window > 256 without an accelerator name" if big else None)


def _nn_tanh(op, ctx):
    dt = _in_type(op)
    return None if dt == "float32" or (dt in QUANT8 and ctx.feature_level >= 29) else f"input type {dt}"


def _nn_rsqrt(op, ctx):
    if _in_type(op) in QUANT8 and ctx.feature_level < FL7:
        return f"quantized RSQRT needs {_level_name(FL7)}"
    return first_reason(_min_level(ctx, 29), _types(op, F32 if ctx.feature_level < FL7 else FQ8))


def _nn_slice(op, ctx):
    return first_reason(_min_level(ctx, 29), _types(op, FQ8I32), _types(op, ("int32",), 1, "begin"),
                  _types(op, ("int32",), 2, "size"))


def _nn_pad(op, ctx):
    return first_reason(_min_level(ctx, 28), _types(op, FQ8),
                  _min_level(ctx, 29) if len(op.inputs) == 3 else None,
                  _types(op, F32) if ctx.feature_level < 29 else None)


def _nn_split(op, ctx):
    axis = op.input(0)
    return first_reason(_min_level(ctx, 29), _types(op, FQ8I32 if ctx.feature_level >= 30 else
                                          ("float32", "uint8", "int32"), 1),
                  None if axis is not None and axis.is_const and axis.dtype == "int32" else "axis not constant int32")


def _nn_gather(op, ctx):
    pos = op.input(1)
    return first_reason(_min_level(ctx, 29), _types(op, ("float32", "float16", "int32", "uint8", "int8")),
                  None if pos.dtype == "int32" else "positions must be int32",
                  None if pos.rank else "0-D positions")


def _nn_pack(op, ctx):
    if ctx.feature_level >= FL6:
        return first_reason(_min_level(ctx, 30), _types(op, ("int32", "float32", "int8", "uint8")))
    axis = op.options.get("axis", 0)
    return first_reason(_min_level(ctx, 30), _types(op, ("float32", "int8")),
                  "axis is the last dimension" if axis in (-1, op.input(0).rank) else None)


def _nn_unpack(op, ctx):
    r, axis = op.input(0).rank, op.options.get("axis", 0)
    return first_reason(_min_level(ctx, 30), _types(op, FQ8), None if 1 < r <= 4 else f"{r}-D input (2-D to 4-D)",
                  "axis is the last dimension" if axis in (-1, r - 1) else None)


def _nn_max_min(op, ctx):
    for t in op.inputs[:2]:
        if t is not None and t.rank == 0 and not t.is_const:
            return "scalar operand not constant"
    return first_reason(_min_level(ctx, 29), _types(op, FQ8I32))


def _nn_cast(op, ctx):
    allowed = FQ8I32 if ctx.feature_level >= 30 else ("float32", "int32", "uint8")
    return first_reason(_min_level(ctx, 29), _types(op, allowed),
                  None if op.outputs[0].dtype in allowed else f"{op.outputs[0].dtype} output")


def _nn_reduce_minmax(op, ctx):
    return first_reason(_min_level(ctx, 29), _types(op, FQ8), "scalar input" if op.input(0).rank == 0 else None)


def _nn_sum(op, ctx):
    return first_reason(_min_level(ctx, 29), "scalar output" if op.outputs[0].rank == 0 else None, _types(op, F32))


# op -> (max version, check). Ops absent here (e.g. GELU, SQUARE, CUMSUM,
# BROADCAST_TO) run on CPU under NNAPI.
NNAPI_RULES: dict[str, tuple[int, Check]] = {
    "ADD": (2, _nn_add_mul), "MUL": (2, _nn_add_mul), "SUB": (3, _nn_sub),
    "DIV": (1, _nn(28, F32, lambda op, c: _ranks_le4(op, 0, 1))),
    "AVERAGE_POOL_2D": (2, _nn_pool), "MAX_POOL_2D": (2, _nn_pool),
    "CONV_2D": (5, _nn_conv), "DEPTHWISE_CONV_2D": (3, _nn_depthwise), "FULLY_CONNECTED": (5, _nn_fc),
    "HARD_SWISH": (99, _nn(types=FQ8)), "SOFTMAX": (2, _nn_softmax), "RESHAPE": (1, _nn_reshape),
    "RESIZE_BILINEAR": (3, _nn_resize), "RESIZE_NEAREST_NEIGHBOR": (3, _nn_resize),
    "SQUEEZE": (1, _nn(28)), "CONCATENATION": (2, _nn_concat), "DEQUANTIZE": (2, _nn_dequantize),
    "FLOOR": (1, no_limits), "RELU": (2, _nn(types=FQ8)), "RELU_N1_TO_1": (2, _nn(types=FQ8)),
    "RELU6": (2, _nn(types=FQ8)), "LOGISTIC": (2, _nn(types=FQ8)), "TANH": (2, _nn_tanh),
    "PAD": (2, _nn_pad), "PADV2": (2, _nn_pad),
    "SPACE_TO_BATCH_ND": (2, _nn(28)), "BATCH_TO_SPACE_ND": (2, _nn(28)),
    "STRIDED_SLICE": (2, _nn(28, FQ8)), "TRANSPOSE": (2, _nn_transpose),
    "ABS": (1, _nn(29, F32)), "EXP": (1, _nn(29, F32)), "LOG": (1, _nn(29, F32)), "POW": (1, _nn(29, F32)),
    "RSQRT": (2, _nn_rsqrt), "SLICE": (2, _nn_slice), "SIN": (1, _nn(29, F32)), "COS": (1, _nn(29, F32)),
    "SQRT": (1, _nn(29, F32)), "TRANSPOSE_CONV": (4, _nn(29)),
    "SPACE_TO_DEPTH": (2, _nn(types=FQ8)), "DEPTH_TO_SPACE": (99, _nn(types=FQ8)),
    "MEAN": (2, _nn_mean), "MAXIMUM": (3, _nn_max_min), "MINIMUM": (3, _nn_max_min),
    "CAST": (1, _nn_cast), "LEAKY_RELU": (1, _nn(29, FQ8)), "PRELU": (1, _nn(29, FQ8)),
    "TILE": (1, _nn(29, FQ8I32)), "LOGICAL_AND": (1, _nn(29, ("bool",))), "LOGICAL_OR": (1, _nn(29, ("bool",))),
    "LOGICAL_NOT": (1, _nn(29, ("bool",))),
    **{name: (2, _nn(29, ("float32", "uint8", "int8", "bool", "int32"))) for name in (
        "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL")},
    "NEG": (2, _nn(29, ("float32", "int32"))), "TOPK_V2": (2, _nn(29, FQ8I32)),
    "SELECT": (2, _nn(29)), "GATHER": (2, _nn_gather), "EXPAND_DIMS": (1, _nn(29)),
    "SPLIT": (3, _nn_split), "SPLIT_V": (2, _nn(30, FQ8I32)), "LOG_SOFTMAX": (1, _nn(29, F32)),
    "QUANTIZE": (2, _nn_quantize), "REDUCE_ANY": (2, _nn(29)), "REDUCE_MIN": (2, _nn_reduce_minmax),
    "REDUCE_MAX": (2, _nn_reduce_minmax), "REDUCE_PROD": (1, _nn_sum), "SUM": (1, _nn_sum),
    "ELU": (1, _nn(30, F32)), "FILL": (1, _nn(30)), "PACK": (2, _nn_pack), "UNPACK": (2, _nn_unpack),
    "SQUARED_DIFFERENCE": (2, _nn_sqdiff), "BATCH_MATMUL": (2, _nn_batch_matmul),
    "MIRROR_PAD": (2, _nn(FL7, FQ8I32)), "REVERSE_V2": (3, _nn(FL7, FQ8I32)),
    "ARG_MAX": (2, _nn(29, ("float16", "float32", "int32", "uint8", "int8"))),
    "ARG_MIN": (2, _nn(29, ("float16", "float32", "int32", "uint8", "int8"))),
    "L2_NORMALIZATION": (2, lambda op, c: "fused activation" if op.options.get("fusedActivationFunction")
                         else None),
}


def nnapi_reason(op: Op, ctx: Context) -> str | None:
    """Why the NNAPI delegate would leave ``op`` on the CPU (None: it takes it)."""
    if is_const_fp16_dequantize(op):
        return None
    if op.name == POSTPROCESS_OP:
        return ON_THE_CPU
    if op.custom:
        return f"custom op {op.name} is not supported"
    rule = NNAPI_RULES.get(op.name)
    if rule is None:
        return f"{op.name} is not supported by the NNAPI delegate"
    max_version, check = rule
    if op.name == "MUL" and ctx.accelerator_specified:
        max_version = 3
    if op.version > max_version:
        return f"op version {op.version} (NNAPI takes <= {max_version})"
    return check(op, ctx)


def check_nnapi(graph_or_content, android_api: int = DEFAULT_ANDROID_API,
                accelerator_specified: bool = False) -> DelegateReport:
    graph = graph_or_content if isinstance(graph_or_content, Graph) else read(graph_or_content)
    ctx = Context(graph, nnapi_feature_level(android_api), accelerator_specified)
    return delegate_report(graph, "nnapi", nnapi_reason, ctx, NNAPI_DEFAULT_MAX_PARTITIONS,
                           f"rules for Android API {android_api}; the device's NNAPI driver may still refuse ops",
                           android_api=android_api)
