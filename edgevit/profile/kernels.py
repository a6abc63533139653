"""Kernel families: what a function of LiteRT's CPU runtime computes, read
from its symbol name.

LiteRT's shared library keeps the names of XNNPACK's microkernels
(`xnn_qs8_qc8w_gemm_minmax_fp32_ukernel_4x16c4__asm_aarch64_neondot_ld128` is
an int8 GEMM, `xnn_x8_lut_ukernel_*` an int8 table lookup such as LOGISTIC),
of TFLite's builtin kernels (`tflite::optimized_ops::SoftmaxInt8LUT<...>`)
and of ruy, which computes the builtin BATCH_MATMUL and FULLY_CONNECTED. The
same table groups x86 samples (benchmarks/kernel_profile.py) and emulated
Arm64 instruction counts (edgevit.profile.arm); names are demangled C++.
"""
from __future__ import annotations

import re

# (family, pattern on the symbol), first match wins
FAMILIES = [
    ("weight packing at run time", r"packw|_pack_"),
    ("quantize / dequantize", r"_vcvt_ukernel|ConvertOp"),
    ("fp32 GEMM (dense, 1x1 conv, matmul)", r"^xnn_f32_(qc8w_)?gemm|^xnn_f32_ppmm"),
    ("fp32 conv (kxk)", r"^xnn_f32_(qc8w_)?igemm|^xnn_f32_conv_hwc"),
    ("fp32 depthwise conv", r"^xnn_f32_dwconv"),
    ("fp32 sigmoid", r"^xnn_f32_vsigmoid"),
    ("fp32 softmax", r"^xnn_f32_(raddstoreexpminusmax|rmax)|^xnn_compute_softmax|compute_reciprocal"),
    ("fp32 elementwise", r"^xnn_f32_v|^xnn_f32_r(sum|dsum|minmax)"),
    ("int8 GEMM (dense, 1x1 conv, matmul)", r"^xnn_q[sdu]8_.*_gemm|^xnn_qd8_.*_gemm|^xnn_qp8_.*_gemm"),
    ("int8 conv (kxk)", r"^xnn_q[sdu]8_.*igemm"),
    ("int8 depthwise conv", r"^xnn_q[su]8_.*dwconv"),
    ("int8 table lookup (LOGISTIC, TANH, ...)", r"^xnn_x8_lut|unary_ukernel_quantized"),
    ("int8 elementwise", r"^xnn_q[su]8_v|^xnn_q[su]8_r(sum|dsum)|binary_ukernel_quantized"),
    ("pad", r"_pad_|PadImpl|::Pad<|::Pad\("),
    ("transpose / copy", r"transpose|memmove|memcpy|memset|_copy_ukernel|^\[libc\.so"),
    ("ruy matmul (builtin BATCH_MATMUL, FULLY_CONNECTED)", r"ruy::|BatchMatMul"),
    ("softmax (builtin kernel)", r"^(void )?tflite::.*Softmax"),
    ("builtin kernels (other ops)", r"^(void )?tflite::(optimized|reference)_(integer_)?ops::|^(void )?tflite::ops::"),
    ("runtime (LiteRT, XNNPACK)", r"^(void )?tflite::|^xnn_|^pthreadpool|^\[libpywrap_litert"),
]
OTHER = "other (Python, libc, threads)"


def family_of(symbol: str) -> str:
    for family, pattern in FAMILIES:
        if re.search(pattern, symbol):
            return family
    return OTHER
