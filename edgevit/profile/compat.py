"""Which ops of a .tflite file the GPU and NNAPI delegates would take, without
a phone.

`tf.lite.experimental.Analyzer(gpu_compatibility=True)` calls every model
compatible in TF 2.21 (its checks were removed upstream), so the rules are
re-stated here from the delegates' own support checks. Sources (facts
learned from, not code copied): google-ai-edge/LiteRT @ f6745779 (2026-08-21,
the TF 2.21 era code):

* GPU: tflite/delegates/gpu/common/model_builder.cc (the op -> parser table,
  max op versions, ``IsAllAllowedTensors``: no tensor of rank >= 5, runtime
  tensors float32/float16, plus int8/uint8 with the default
  ``gpu_experimental_enable_quant``) and tflite/tools/versioning/
  gpu_compatibility.cc (per-op parameter limits);
* NNAPI: tflite/delegates/nnapi/nnapi_delegate.cc
  ``NNAPIDelegateKernel::Validate`` (ops, max versions, input dtypes, ranks,
  Android feature levels) and nnapi_delegate_kernel.h (feature levels);
* partitions: tflite/graph_info.cc (greedy grouping of supported ops into
  independent subsets), delegates/gpu/delegate_options.cc (an app's GPU
  delegate takes only the largest partition by default) and nnapi_delegate.h
  (NNAPI takes the 3 largest); `benchmark_model` takes all of them
  (``--max_delegated_partitions=0``).

Custom and Flex ops count as CPU ops for both delegates (except the GPU's own
custom ops). Not modelled: driver-specific limits (an NNAPI driver may still
refuse an op the delegate accepts; a GPU may lack OpenCL/OpenGL).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

from edgevit.profile.flatbuffer import Graph, Op, read

FLOATS = ("float32", "float16")
QUANT8 = ("int8", "uint8")
ACTIVATIONS_GPU_OK = (0, 1, 2, 3, 4, 6)   # NONE, RELU, RELU_N1_TO_1, RELU6, TANH, SIGMOID (not SIGN_BIT=5)
GPU_DEFAULT_MAX_PARTITIONS = 1
NNAPI_DEFAULT_MAX_PARTITIONS = 3

# Android API level -> NNAPI runtime feature level the delegate compares with.
FL5, FL6, FL7, FL8 = 31, 1000006, 1000007, 1000008
DEFAULT_ANDROID_API = 33


def nnapi_feature_level(api: int) -> int:
    if api <= 30:
        return api
    if api <= 32:
        return FL5
    return {33: FL6, 34: FL7}.get(api, FL8)


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


# ---------------------------------------------------------------- helpers
def _need(op: Op, runtime_inputs: int, outputs: int, const_inputs: int | None = None) -> str | None:
    rt = len(op.runtime_inputs)
    if rt != runtime_inputs:
        return f"needs {runtime_inputs} runtime input(s), has {rt}"
    if const_inputs is not None and len(op.const_inputs) != const_inputs:
        return f"needs {const_inputs} constant input(s), has {len(op.const_inputs)}"
    if len(op.outputs) != outputs:
        return f"needs {outputs} output(s), has {len(op.outputs)}"
    return None


def _activation(op: Op) -> str | None:
    act = op.options.get("fusedActivationFunction", 0) or 0
    return None if act in ACTIVATIONS_GPU_OK else "fused SIGN_BIT activation"


def _first(*checks):
    for c in checks:
        if c:
            return c
    return None


# ---------------------------------------------------------------- GPU rules
def _gpu_broadcast(op: Op) -> str | None:
    if len(op.inputs) != 2 or op.inputs[0] is None or op.inputs[1] is None:
        return f"{op.name} needs two input tensors"
    a, b = op.inputs[0].shape, op.inputs[1].shape
    if len(a) > 1 and len(b) > 1 and len(a) != len(b):
        long_, short = (a, b) if len(a) >= len(b) else (b, a)
        ok = (len(long_) == 4 and len(short) == 3 and long_[0] == 1) or \
             (len(long_) == 4 and len(short) == 2 and long_[0] == 1 and short == (1, 1)) or \
             (len(long_) == 4 and len(short) == 2 and long_[0] == short[0] and long_[3] == short[1])
        if not ok:
            return f"broadcast {list(a)} with {list(b)} is not supported"
    return None


def _gpu_conv(op: Op, ctx) -> str | None:
    rt = len(op.runtime_inputs)
    if rt not in (1, 2) or len(op.outputs) != 1:
        return "needs 1 or 2 runtime inputs and 1 output"
    o = op.options
    if min(o.get("strideH", 1), o.get("strideW", 1)) <= 0:
        return "stride <= 0"
    if min(o.get("dilationHFactor", 1), o.get("dilationWFactor", 1)) <= 0:
        return "dilation <= 0"
    return _activation(op)


def _gpu_depthwise(op: Op, ctx) -> str | None:
    err = _gpu_conv(op, ctx)
    if err:
        return err
    inp, flt, out = op.input(0), op.input(1), op.outputs[0]
    if inp.rank != 4 or flt.rank != 4 or out.rank != 4:
        return "input, filter and output must be 4-D"
    mult = op.options.get("depthMultiplier", 1) or 1
    if flt.shape[3] != out.shape[3]:
        return "filter channels != output channels"
    if out.shape[3] != inp.shape[3] * mult:
        return "output channels != input channels x depth_multiplier"
    return None


def _gpu_pool(op: Op, ctx) -> str | None:
    o = op.options
    return _first(_need(op, 1, 1),
                  "filter size <= 0" if min(o.get("filterHeight", 1), o.get("filterWidth", 1)) <= 0 else None,
                  "stride <= 0" if min(o.get("strideH", 1), o.get("strideW", 1)) <= 0 else None,
                  _activation(op))


def _gpu_fully_connected(op: Op, ctx) -> str | None:
    o = op.options
    if o.get("weightsFormat", 0):
        return "shuffled weights format is not supported"
    if len(op.runtime_inputs) > 2:
        return "more than 2 runtime inputs"
    if op.input(0) is None or op.input(0).is_const:
        return "constant input"
    if o.get("keepNumDims") and op.input(0).rank != op.outputs[0].rank:
        return "keep_num_dims with input rank != output rank"
    return None


def _gpu_axes_const(op: Op, ctx) -> str | None:
    err = _need(op, 1, 1, const_inputs=1)
    if err:
        return err
    axes = op.input(1)
    if axes is None or not axes.is_const:
        return "axes must be constant"
    if axes.dtype != "int32":
        return f"axes must be int32, not {axes.dtype}"
    return None


def _gpu_elementwise1(op: Op, ctx) -> str | None:
    return _need(op, 1, 1, const_inputs=0)


def _gpu_elementwise2(op: Op, ctx) -> str | None:
    if _need(op, 2, 1, 0) and _need(op, 1, 1, 1):
        return "needs 1 or 2 operands"
    if op.name in ("GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "EQUAL", "NOT_EQUAL"):
        users = ctx.graph.consumers.get(op.outputs[0].index, [])
        if len(users) != 1 or ctx.graph.ops[users[0]].name not in ("CAST", "SELECT", "SELECT_V2") \
                or ctx.graph.ops[users[0]].outputs[0].dtype not in FLOATS:
            return "comparison whose result does not feed one CAST/SELECT to float"
    return _activation(op)


def _gpu_add(op: Op, ctx) -> str | None:
    return _first(_gpu_broadcast(op), _activation(op))


def _gpu_mul(op: Op, ctx) -> str | None:
    if len(op.inputs) != 2:
        return "MUL needs two input tensors"
    return _first(_gpu_broadcast(op) if op.inputs[0].rank != op.inputs[1].rank else None, _activation(op))


def _gpu_batch_matmul(op: Op, ctx) -> str | None:
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        return "needs 2 inputs and 1 output"
    if len(op.runtime_inputs) == 1 and op.const_inputs and op.const_inputs[0].rank != 2:
        return "a constant operand must be 2-D"
    if not op.runtime_inputs:
        return "both operands constant"
    return None


def _gpu_cast(op: Op, ctx) -> str | None:
    src, dst = op.input(0).dtype, op.outputs[0].dtype
    if (src == "bool" and dst in FLOATS) or (src in FLOATS and dst == "bool") or \
            (src in ("float32", "int32") and dst in ("float32", "int32")):
        return None
    return f"cast {src} -> {dst}"


def _gpu_softmax(op: Op, ctx) -> str | None:
    beta = op.options.get("beta", 1.0)
    return None if beta == 1.0 else f"beta {beta} != 1"


def _gpu_block(op: Op, ctx) -> str | None:
    size = op.options.get("blockSize", 0)
    return _first(_need(op, 1, 1), None if size > 1 else f"block_size {size} must be > 1")


def _gpu_slice(op: Op, ctx) -> str | None:
    if len(op.inputs) < 3:
        return "needs 3 inputs"
    r = op.input(0).rank
    return None if r in (3, 4) else f"{r}-D input (3-D or 4-D only)"


def _gpu_strided_slice(op: Op, ctx) -> str | None:
    o = op.options
    for mask, label in (("ellipsisMask", "ellipsis_mask"), ("newAxisMask", "new_axis_mask"),
                        ("shrinkAxisMask", "shrink_axis_mask")):
        if o.get(mask):
            return f"{label} is not supported"
    if len(op.inputs) < 4:
        return "needs 4 inputs"
    r = op.input(0).rank
    return None if r in (3, 4) else f"{r}-D input (3-D or 4-D only)"


def _gpu_pad(op: Op, ctx) -> str | None:
    if op.name == "MIRROR_PAD" and op.options.get("mode", 0) != 0:
        return "only REFLECT mirror padding"
    err = _need(op, 1, 1)
    if err:
        return err
    pads = op.input(1)
    if pads is None or pads.rank != 2 or pads.shape[0] not in (3, 4) or pads.shape[1] != 2:
        return "paddings must be a 4x2 or 3x2 tensor"
    return None


def _gpu_resize_bilinear(op: Op, ctx) -> str | None:
    o = op.options
    return _first(_need(op, 1, 1), "align_corners with half_pixel_centers"
                  if o.get("alignCorners") and o.get("halfPixelCenters") else None)


def _gpu_gather(op: Op, ctx) -> str | None:
    if _need(op, 2, 1, 0) and _need(op, 1, 1, 1):
        return "needs 1 or 2 operands"
    idx = op.input(1)
    return _first(None if idx.rank == 1 else "indices must be 1-D",
                  None if idx.dtype == "int32" else "indices must be int32")


def _gpu_dequantize(op: Op, ctx) -> str | None:
    if len(op.inputs) != 1 or len(op.outputs) != 1:
        return "needs 1 input and 1 output"
    return "int16 input" if op.input(0).dtype == "int16" else None


def _gpu_cumsum(op: Op, ctx) -> str | None:
    a, axis = op.input(0), op.input(1)
    if a.dtype not in FLOATS or op.outputs[0].dtype != a.dtype or axis is None or \
            axis.dtype != "int32" or not axis.is_const:
        return "float input/output and a constant int32 axis only"
    return None


def _ok(op: Op, ctx) -> str | None:
    return None


def _gpu_one_runtime(op: Op, ctx) -> str | None:
    return _need(op, 1, 1)


def _gpu_transpose(op: Op, ctx) -> str | None:
    err = _need(op, 1, 1)
    if err:
        return err
    perm = op.input(1)
    if perm is not None and perm.shape and perm.shape[0] not in (2, 3, 4):
        return f"permutation of {perm.shape[0]} axes (2 to 4 only)"
    return None


# op -> (max version, check). Ops absent here run on CPU.
GPU_RULES: dict[str, tuple[int, Check]] = {
    "ADD": (2, _gpu_add), "ADD_N": (2, lambda op, c: None if len(op.inputs) == 2 else "ADD_N with != 2 inputs"),
    "AVERAGE_POOL_2D": (2, _gpu_pool), "MAX_POOL_2D": (2, _gpu_pool),
    "BATCH_MATMUL": (99, _gpu_batch_matmul), "CAST": (99, _gpu_cast), "CONCATENATION": (2, _ok),
    "CONV_2D": (6, _gpu_conv), "DEPTHWISE_CONV_2D": (6, _gpu_depthwise), "CUMSUM": (1, _gpu_cumsum),
    "DENSIFY": (1, _ok), "DEPTH_TO_SPACE": (99, _gpu_block), "SPACE_TO_DEPTH": (2, _gpu_block),
    "DEQUANTIZE": (3, _gpu_dequantize), "QUANTIZE": (2, _gpu_one_runtime),
    "FULLY_CONNECTED": (9, _gpu_fully_connected), "GATHER": (1, _gpu_gather),
    "HARD_SWISH": (99, _gpu_one_runtime), "LSTM": (4, _ok), "ONE_HOT": (1, _ok), "PACK": (99, _ok),
    "UNPACK": (99, _ok), "PRELU": (1, _ok), "PAD": (2, _gpu_pad), "PADV2": (2, _gpu_pad),
    "MIRROR_PAD": (2, _gpu_pad), "MEAN": (99, _gpu_axes_const), "SUM": (99, _gpu_axes_const),
    "REDUCE_MAX": (99, _gpu_axes_const), "REDUCE_MIN": (99, _gpu_axes_const),
    "REDUCE_PROD": (99, _gpu_axes_const),
    "RELU": (2, _ok), "RELU6": (2, _ok), "RELU_0_TO_1": (2, _ok), "RELU_N1_TO_1": (2, _ok),
    "LEAKY_RELU": (2, _ok), "RESHAPE": (1, _gpu_one_runtime),
    "RESIZE_BILINEAR": (3, _gpu_resize_bilinear), "RESIZE_NEAREST_NEIGHBOR": (3, _gpu_one_runtime),
    "SELECT": (1, _ok), "SELECT_V2": (1, _ok), "SLICE": (2, _gpu_slice), "SOFTMAX": (2, _gpu_softmax),
    "SPLIT": (99, _ok), "SPLIT_V": (99, _ok), "STRIDED_SLICE": (4, _gpu_strided_slice),
    "TILE": (99, _gpu_one_runtime), "TRANSPOSE": (4, _gpu_transpose), "TRANSPOSE_CONV": (3, _gpu_conv),
    "MUL": (3, _gpu_mul),
    **{name: (2, _gpu_elementwise1) for name in (
        "ABS", "COS", "ELU", "EXP", "FLOOR", "GELU", "LOG", "LOGISTIC", "NEG", "RSQRT", "SIGN", "SIN",
        "SQRT", "SQUARE", "TANH")},
    **{name: (2, _gpu_elementwise2) for name in (
        "DIV", "EQUAL", "FLOOR_DIV", "FLOOR_MOD", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL",
        "LOGICAL_AND", "MAXIMUM", "MINIMUM", "NOT_EQUAL", "POW", "SQUARED_DIFFERENCE", "SUB")},
}
GPU_CUSTOM_OPS = ("Convolution2DTransposeBias", "MaxPoolingWithArgmax2D", "MaxUnpooling2D", "Resampler")


def _is_const_fp16_dequantize(op: Op) -> bool:
    """fp16 weights: both delegates fold these into their constants."""
    t = op.input(0) if op.inputs else None
    return op.name == "DEQUANTIZE" and t is not None and t.is_const and t.dtype == "float16"


def gpu_warning(op: Op) -> str | None:
    """Ops the GPU delegate takes although its kernel ignores a parameter."""
    if op.name == "BATCH_MATMUL" and (op.options.get("adjX") or op.options.get("adjY")):
        flags = "/".join(f for f, k in (("adj_x", "adjX"), ("adj_y", "adjY")) if op.options.get(k))
        return (f"{flags}=true: the GPU delegate reads no adjoint flag (model_builder.cc), so the delegated "
                "op may compute A*B instead of A*B^T; compare GPU and CPU outputs on the phone")
    return None


def gpu_reason(op: Op, ctx: Context) -> str | None:
    """Why the GPU delegate would leave ``op`` on the CPU (None: it takes it)."""
    if _is_const_fp16_dequantize(op):
        return None
    if op.custom:
        return None if op.name in GPU_CUSTOM_OPS else f"custom op {op.name} is not supported"
    rule = GPU_RULES.get(op.name)
    if rule is None:
        return f"{op.name} is not supported by the GPU delegate"
    max_version, check = rule
    for t in [*op.inputs, *op.outputs]:
        if t is not None and t.rank >= 5:
            return f"{t.rank}-D tensor {t.name or t.index} (GPU handles rank <= 4)"
    if op.version > max_version:
        return f"op version {op.version} (GPU takes <= {max_version})"
    allowed_in, allowed_out = {*FLOATS, *QUANT8}, {*FLOATS, *QUANT8}
    if op.name in ("GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL", "EQUAL", "NOT_EQUAL"):
        allowed_out.add("bool")
    if op.name == "CAST":
        allowed_in |= {"bool", "int32"}
        allowed_out |= {"int32", "bool"}
    if op.name in ("ONE_HOT", "GATHER"):
        allowed_in.add("int32")
    if op.name in ("SELECT", "SELECT_V2"):
        allowed_in.add("bool")
    if op.name == "LOGICAL_AND":
        allowed_in.add("bool")
        allowed_out.add("bool")
    for t in op.runtime_inputs:
        if t.dtype not in allowed_in:
            return f"{t.dtype} input tensor"
    for t in op.outputs:
        if not t.is_const and t.dtype not in allowed_out:
            return f"{t.dtype} output tensor"
    return check(op, ctx)


# ---------------------------------------------------------------- NNAPI rules
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
    return _first(_types(op, allowed), _ranks_le4(op, 0, 1))


def _nn_sub(op, ctx):
    dt, lvl = _in_type(op), ctx.feature_level
    ok = (lvl >= 28 and dt == "float32") or (lvl >= 29 and dt in QUANT8) or (lvl >= 30 and dt == "int32")
    return _first(None if ok else f"input type {dt} at {_level_name(lvl)}", _ranks_le4(op, 0, 1))


def _nn_conv(op, ctx):
    o = op.options
    return _first(None if len(op.inputs) == 3 and op.inputs[2] is not None else "Conv2D without bias",
                  _min_level(ctx, 29) if (o.get("dilationHFactor", 1) != 1 or o.get("dilationWFactor", 1) != 1)
                  else None,
                  _types(op, ("float32", "uint8")) if ctx.feature_level < 29 else None)


def _nn_depthwise(op, ctx):
    if ctx.feature_level < 29:
        o = op.options
        return _first(_types(op, ("float32", "uint8")),
                      "dilation before Android 10" if o.get("dilationHFactor", 1) != 1 or
                      o.get("dilationWFactor", 1) != 1 else None)
    return None


def _nn_fc(op, ctx):
    return _first("int16 output" if op.outputs[0].dtype == "int16" else None,
                  _min_level(ctx, 30) if op.options.get("keepNumDims") else None)


def _nn_softmax(op, ctx):
    r = op.input(0).rank
    return _first(_types(op, FQ8), None if op.outputs[0].dtype in FQ8 else f"{op.outputs[0].dtype} output",
                  None if r <= 4 else f"{r}-D input (rank <= 4)",
                  None if ctx.feature_level >= 29 or r in (2, 4) else "only 2-D/4-D input before Android 10")


def _nn_reshape(op, ctx):
    allowed = FQ8 if ctx.feature_level < FL6 else FQ8I32
    return _first(_types(op, allowed), _ranks_le4(op, 0),
                  f"{op.outputs[0].rank}-D output (rank <= 4)" if op.outputs[0].rank > 4 else None,
                  "shape input not constant" if len(op.inputs) >= 2 and op.input(1) is not None
                  and not op.input(1).is_const else None)


def _nn_resize(op, ctx):
    o = op.options
    size = op.input(1)
    return _first(_min_level(ctx, 29) if op.name == "RESIZE_NEAREST_NEIGHBOR" else None,
                  None if op.input(0).rank == 4 else "input must be 4-D", _types(op, FQ8),
                  None if size is not None and size.is_const else "size input not constant",
                  "align_corners/half_pixel_centers need Android 11" if ctx.feature_level <= 29 and
                  (o.get("alignCorners") or o.get("halfPixelCenters")) else None)


def _nn_concat(op, ctx):
    return _first("fused activation" if op.options.get("fusedActivationFunction") else None,
                  _ranks_le4(op, 0), _types(op, ("float16", "float32", "uint8", "int8")))


def _nn_dequantize(op, ctx):
    t = op.input(0)
    if t.dtype == "float16" and not t.is_const:
        return _min_level(ctx, 30)
    return _types(op, ("uint8",) if ctx.feature_level < 29 else QUANT8)


def _nn_mean(op, ctx):
    return _first(_min_level(ctx, 28), _types(op, FQ8 if ctx.feature_level >= 29 else F32),
                  "scalar output" if op.outputs[0].rank == 0 else None, _ranks_le4(op, 0))


def _nn_sqdiff(op, ctx):
    lvl = ctx.feature_level
    allowed = FQ8I32 if lvl >= 30 else (("float32", "uint8") if lvl >= 29 else F32)
    return _first(_min_level(ctx, 28), _types(op, allowed), _ranks_le4(op, 0, 1))


def _nn_batch_matmul(op, ctx):
    a, b = op.input(0), op.input(1)
    broadcast = a.rank != b.rank or a.shape[:-2] != b.shape[:-2]
    return _first(_min_level(ctx, FL6), _types(op, ("float32", "int32", "int8")),
                  None if a.dtype == b.dtype else "mixed operand types (hybrid)",
                  None if 2 <= a.rank <= 4 else f"{a.rank}-D input (2-D to 4-D)",
                  "broadcast batch matmul" if broadcast else None)


def _nn_transpose(op, ctx):
    perm = op.input(1)
    return _first(_min_level(ctx, 28), None if perm is not None and perm.is_const else "permutation not constant")


def _nn_quantize(op, ctx):
    out = op.outputs[0].dtype
    return _first(_min_level(ctx, 29), None if _in_type(op) == "float32" or _in_type(op) in QUANT8 else
                  f"input type {_in_type(op)}",
                  None if out == "uint8" or (out == "int8" and ctx.feature_level >= 30) else f"{out} output")


def _nn(level: int = 0, types=None, check: Check | None = None) -> Check:
    def rule(op, ctx):
        return _first(_min_level(ctx, level) if level else None, _types(op, types) if types else None,
                      check(op, ctx) if check else None)
    return rule


def _nn_pool(op, ctx):
    o = op.options
    big = op.name == "AVERAGE_POOL_2D" and _in_type(op) in QUANT8 and not ctx.accelerator_specified and \
        o.get("filterHeight", 1) * o.get("filterWidth", 1) > 256
    return _first(_types(op, FQ8), "quantized pooling window > 256 without an accelerator name" if big else None)


def _nn_tanh(op, ctx):
    dt = _in_type(op)
    return None if dt == "float32" or (dt in QUANT8 and ctx.feature_level >= 29) else f"input type {dt}"


def _nn_rsqrt(op, ctx):
    if _in_type(op) in QUANT8 and ctx.feature_level < FL7:
        return f"quantized RSQRT needs {_level_name(FL7)}"
    return _first(_min_level(ctx, 29), _types(op, F32 if ctx.feature_level < FL7 else FQ8))


def _nn_slice(op, ctx):
    return _first(_min_level(ctx, 29), _types(op, FQ8I32), _types(op, ("int32",), 1, "begin"),
                  _types(op, ("int32",), 2, "size"))


def _nn_pad(op, ctx):
    return _first(_min_level(ctx, 28), _types(op, FQ8),
                  _min_level(ctx, 29) if len(op.inputs) == 3 else None,
                  _types(op, F32) if ctx.feature_level < 29 else None)


def _nn_split(op, ctx):
    axis = op.input(0)
    return _first(_min_level(ctx, 29), _types(op, FQ8I32 if ctx.feature_level >= 30 else
                                          ("float32", "uint8", "int32"), 1),
                  None if axis is not None and axis.is_const and axis.dtype == "int32" else "axis not constant int32")


def _nn_gather(op, ctx):
    pos = op.input(1)
    return _first(_min_level(ctx, 29), _types(op, ("float32", "float16", "int32", "uint8", "int8")),
                  None if pos.dtype == "int32" else "positions must be int32",
                  None if pos.rank else "0-D positions")


def _nn_pack(op, ctx):
    if ctx.feature_level >= FL6:
        return _first(_min_level(ctx, 30), _types(op, ("int32", "float32", "int8", "uint8")))
    axis = op.options.get("axis", 0)
    return _first(_min_level(ctx, 30), _types(op, ("float32", "int8")),
                  "axis is the last dimension" if axis in (-1, op.input(0).rank) else None)


def _nn_unpack(op, ctx):
    r, axis = op.input(0).rank, op.options.get("axis", 0)
    return _first(_min_level(ctx, 30), _types(op, FQ8), None if 1 < r <= 4 else f"{r}-D input (2-D to 4-D)",
                  "axis is the last dimension" if axis in (-1, r - 1) else None)


def _nn_max_min(op, ctx):
    for t in op.inputs[:2]:
        if t is not None and t.rank == 0 and not t.is_const:
            return "scalar operand not constant"
    return _first(_min_level(ctx, 29), _types(op, FQ8I32))


def _nn_cast(op, ctx):
    allowed = FQ8I32 if ctx.feature_level >= 30 else ("float32", "int32", "uint8")
    return _first(_min_level(ctx, 29), _types(op, allowed),
                  None if op.outputs[0].dtype in allowed else f"{op.outputs[0].dtype} output")


def _nn_reduce_minmax(op, ctx):
    return _first(_min_level(ctx, 29), _types(op, FQ8), "scalar input" if op.input(0).rank == 0 else None)


def _nn_sum(op, ctx):
    return _first(_min_level(ctx, 29), "scalar output" if op.outputs[0].rank == 0 else None, _types(op, F32))


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
    "FLOOR": (1, _ok), "RELU": (2, _nn(types=FQ8)), "RELU_N1_TO_1": (2, _nn(types=FQ8)),
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
    if _is_const_fp16_dequantize(op):
        return None
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


def _report(graph: Graph, delegate: str, reason_fn, ctx: Context, default_max: int, note: str,
            android_api: int | None = None, warning_fn=None) -> DelegateReport:
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


def check_gpu(graph_or_content) -> DelegateReport:
    graph = graph_or_content if isinstance(graph_or_content, Graph) else read(graph_or_content)
    return _report(graph, "gpu", gpu_reason, Context(graph), GPU_DEFAULT_MAX_PARTITIONS,
                   "an app's GPU delegate with default options takes only the largest partition; "
                   "benchmark_model takes all", warning_fn=gpu_warning)


def check_nnapi(graph_or_content, android_api: int = DEFAULT_ANDROID_API,
                accelerator_specified: bool = False) -> DelegateReport:
    graph = graph_or_content if isinstance(graph_or_content, Graph) else read(graph_or_content)
    ctx = Context(graph, nnapi_feature_level(android_api), accelerator_specified)
    return _report(graph, "nnapi", nnapi_reason, ctx, NNAPI_DEFAULT_MAX_PARTITIONS,
                   f"rules for Android API {android_api}; the device's NNAPI driver may still refuse ops",
                   android_api=android_api)


def check(model_content: bytes, gpu: bool = True, nnapi: bool = True, android_api: int = DEFAULT_ANDROID_API,
          nnapi_accelerator_specified: bool = False) -> dict[str, DelegateReport]:
    graph = read(model_content)
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
