"""Which ops the GPU delegate would leave on the CPU, op by op.

Re-stated (facts learned from, not code copied) from google-ai-edge/LiteRT @
f6745779, the TF 2.21 era code: tflite/delegates/gpu/common/model_builder.cc
(the op -> parser table, max op versions, ``IsAllAllowedTensors``: no tensor
of rank >= 5, runtime tensors float32/float16, plus int8/uint8 with the
default ``gpu_experimental_enable_quant``) and
tflite/tools/versioning/gpu_compatibility.cc (per-op parameter limits).
"""
from __future__ import annotations

import numpy as np

from edgevit.litert.delegates import (
    QUANT8,
    Check,
    Context,
    DelegateReport,
    Fallback,
    delegate_report,
    first_reason,
    is_const_fp16_dequantize,
    no_limits,
)
from edgevit.litert.detection_postprocess import ON_THE_CPU, POSTPROCESS_OP
from edgevit.litert.flatbuffer import Graph, Op, read

FLOATS = ("float32", "float16")
ACTIVATIONS_GPU_OK = (0, 1, 2, 3, 4, 6)   # NONE, RELU, RELU_N1_TO_1, RELU6, TANH, SIGMOID (not SIGN_BIT=5)
GPU_DEFAULT_MAX_PARTITIONS = 1


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
    return first_reason(_need(op, 1, 1),
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
    return first_reason(_gpu_broadcast(op), _activation(op))


def _gpu_mul(op: Op, ctx) -> str | None:
    if len(op.inputs) != 2:
        return "MUL needs two input tensors"
    return first_reason(_gpu_broadcast(op) if op.inputs[0].rank != op.inputs[1].rank else None, _activation(op))


def _gpu_batch_matmul(op: Op, ctx) -> str | None:
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        return "needs 2 inputs and 1 output"
    if op.runtime_inputs and op.input(0).is_const:
        return "the first operand is a constant (only the second may be)"
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
    return first_reason(_need(op, 1, 1), None if size > 1 else f"block_size {size} must be > 1")


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
    return first_reason(_need(op, 1, 1), "align_corners with half_pixel_centers"
                  if o.get("alignCorners") and o.get("halfPixelCenters") else None)


def _gpu_gather(op: Op, ctx) -> str | None:
    if _need(op, 2, 1, 0) and _need(op, 1, 1, 1):
        return "needs 1 or 2 operands"
    idx = op.input(1)
    return first_reason(None if idx.rank == 1 else "indices must be 1-D",
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
    "BATCH_MATMUL": (99, _gpu_batch_matmul), "CAST": (99, _gpu_cast), "CONCATENATION": (2, no_limits),
    "CONV_2D": (6, _gpu_conv), "DEPTHWISE_CONV_2D": (6, _gpu_depthwise), "CUMSUM": (1, _gpu_cumsum),
    "DENSIFY": (1, no_limits), "DEPTH_TO_SPACE": (99, _gpu_block), "SPACE_TO_DEPTH": (2, _gpu_block),
    "DEQUANTIZE": (3, _gpu_dequantize), "QUANTIZE": (2, _gpu_one_runtime),
    "FULLY_CONNECTED": (9, _gpu_fully_connected), "GATHER": (1, _gpu_gather),
    "HARD_SWISH": (99, _gpu_one_runtime), "LSTM": (4, no_limits), "ONE_HOT": (1, no_limits), "PACK": (99, no_limits),
    "UNPACK": (99, no_limits), "PRELU": (1, no_limits), "PAD": (2, _gpu_pad), "PADV2": (2, _gpu_pad),
    "MIRROR_PAD": (2, _gpu_pad), "MEAN": (99, _gpu_axes_const), "SUM": (99, _gpu_axes_const),
    "REDUCE_MAX": (99, _gpu_axes_const), "REDUCE_MIN": (99, _gpu_axes_const),
    "REDUCE_PROD": (99, _gpu_axes_const),
    "RELU": (2, no_limits), "RELU6": (2, no_limits), "RELU_0_TO_1": (2, no_limits), "RELU_N1_TO_1": (2, no_limits),
    "LEAKY_RELU": (2, no_limits), "RESHAPE": (1, _gpu_one_runtime),
    "RESIZE_BILINEAR": (3, _gpu_resize_bilinear), "RESIZE_NEAREST_NEIGHBOR": (3, _gpu_one_runtime),
    "SELECT": (1, no_limits), "SELECT_V2": (1, no_limits), "SLICE": (2, _gpu_slice), "SOFTMAX": (2, _gpu_softmax),
    "SPLIT": (99, no_limits), "SPLIT_V": (99, no_limits), "STRIDED_SLICE": (4, _gpu_strided_slice),
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


# Two-operand elementwise ops the GPU parses with one operand allowed to be a constant.
ELEMENTWISE_WITH_CONSTANT = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "SQUARED_DIFFERENCE",
                             "FLOOR_DIV", "FLOOR_MOD")


def runtime_layout(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The (B, H, W, C) shape the GPU gives a runtime tensor: rank 1 is a
    batch, rank 2 batch x channels, rank 3 batch x width x channels
    (model_builder_helper.cc, ``ExtractTensorShape``)."""
    dims = list(shape)
    if len(dims) <= 1:
        return (dims[0] if dims else 1, 1, 1, 1)
    if len(dims) == 2:
        return (dims[0], 1, 1, dims[1])
    if len(dims) == 3:
        return (dims[0], 1, dims[1], dims[2])
    return tuple(dims[:4])


def constant_layout(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The (B, H, W, C) shape the GPU gives the constant operand of an
    elementwise op: a scalar, a per-channel vector when every dimension but
    the last is 1, else an (H, W, C) tensor of its last dimensions."""
    dims = list(shape)
    if int(np.prod(dims)) == 1:
        return (1, 1, 1, 1)
    if all(d == 1 for d in dims[:-1]):
        return (1, 1, 1, dims[-1])
    if len(dims) == 4:
        return tuple(dims)
    return (1, *([1] * (3 - len(dims))), *dims)


def _fits(layout: tuple, output: tuple) -> bool:
    return all(a in (b, 1) for a, b in zip(layout, output))


def constant_operand_warning(op: Op) -> str | None:
    """An elementwise op with a constant operand whose operands the GPU lays
    out differently from their output: it then combines the wrong elements
    (measured on LiteRT's GPU accelerator; tests/test_gpu_accelerator.py),
    e.g. ADD of a rank-1 runtime tensor [C] and a constant [1, 1, C]."""
    if op.name not in ELEMENTWISE_WITH_CONSTANT or len(op.runtime_inputs) != 1 or len(op.const_inputs) != 1:
        return None
    runtime, constant, output = op.runtime_inputs[0], op.const_inputs[0], op.outputs[0]
    out = runtime_layout(output.shape)
    if _fits(runtime_layout(runtime.shape), out) and _fits(constant_layout(constant.shape), out):
        return None
    return (f"runtime {list(runtime.shape)} with constant {list(constant.shape)}: the GPU lays them out as "
            f"(B, H, W, C) {runtime_layout(runtime.shape)} and {constant_layout(constant.shape)}, which do not "
            f"broadcast to the output's {out}, and computes a wrong result")


def quantized_rank_warning(op: Op) -> str | None:
    """A quantized elementwise op whose two runtime operands differ in rank:
    LiteRT's GPU accelerator generates a shader for it that does not compile
    (it adds a float vector to an integer one) or a kernel that does not
    build (it cannot broadcast over the batch axis), and the op's output is
    never written (measured; the same op in float is right)."""
    if op.name not in ELEMENTWISE_WITH_CONSTANT or len(op.runtime_inputs) != 2:
        return None
    a, b = op.runtime_inputs
    if a.rank == b.rank or not {a.dtype, b.dtype} & set(QUANT8):
        return None
    return (f"{a.dtype} operands of rank {a.rank} and {b.rank} ({list(a.shape)}, {list(b.shape)}): the GPU "
            "accelerator's shader for it does not compile (or its kernel does not build), and the output is "
            "never written")


def gpu_warning(op: Op) -> str | None:
    """Ops the GPU delegates take but compute wrongly."""
    if op.name == "BATCH_MATMUL" and (op.options.get("adjX") or op.options.get("adjY")):
        flags = "/".join(f for f, k in (("adj_x", "adjX"), ("adj_y", "adjY")) if op.options.get(k))
        return (f"{flags}=true: the GPU delegate reads no adjoint flag (model_builder.cc), so the delegated "
                "op may compute A*B instead of A*B^T; compare GPU and CPU outputs on the phone")
    return constant_operand_warning(op) or quantized_rank_warning(op)


def computed_wrongly(graph: Graph) -> list[Fallback]:
    """Every op a GPU would compute wrongly, whether or not the classic
    delegate's support rules let it take the op (LiteRT's GPU accelerator
    takes more than they do)."""
    return [Fallback(op.index, op.name, w) for op in graph.ops for w in [gpu_warning(op)] if w]


def gpu_reason(op: Op, ctx: Context) -> str | None:
    """Why the GPU delegate would leave ``op`` on the CPU (None: it takes it)."""
    if is_const_fp16_dequantize(op):
        return None
    if op.name == POSTPROCESS_OP:
        return ON_THE_CPU
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


def check_gpu(graph_or_content) -> DelegateReport:
    graph = graph_or_content if isinstance(graph_or_content, Graph) else read(graph_or_content)
    return delegate_report(graph, "gpu", gpu_reason, Context(graph), GPU_DEFAULT_MAX_PARTITIONS,
                           "an app's GPU delegate with default options takes only the largest partition; "
                           "benchmark_model takes all", warning_fn=gpu_warning)
