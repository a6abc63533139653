"""The one way edgevit builds a LiteRT interpreter: ai-edge-litert, or
tflite_runtime where only that is installed (device-style installs).

Validation and host latency runs build it in child processes, so how such a
child failed is described here too.
"""
from __future__ import annotations

import signal

from edgevit.errors import EdgevitError

# LiteRT's default CPU path (XNNPACK delegate), the optimized builtin kernels
# without the default delegate, and the slow reference kernels.
KERNELS = ("xnnpack", "builtin", "reference")


def _litert():
    try:
        from ai_edge_litert import interpreter as litert
    except ImportError:  # device-style installs ship only tflite_runtime
        from tflite_runtime import interpreter as litert
    return litert


def load_interpreter(model_content: bytes, num_threads: int = 1, kernels: str = "xnnpack",
                     preserve_all_tensors: bool = False):
    """An interpreter over ``model_content`` (not yet allocated). With
    ``preserve_all_tensors`` every intermediate tensor stays readable after
    ``invoke()`` (layer-by-layer comparisons)."""
    if kernels not in KERNELS:
        raise EdgevitError(f"Unknown LiteRT kernels {kernels!r}; choose from {', '.join(KERNELS)}.")
    litert = _litert()
    resolver = {"xnnpack": litert.OpResolverType.AUTO,
                "builtin": litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                "reference": litert.OpResolverType.BUILTIN_REF}[kernels]
    return litert.Interpreter(model_content=model_content, num_threads=num_threads,
                              experimental_op_resolver_type=resolver,
                              experimental_preserve_all_tensors=preserve_all_tensors)


def describe_child_failure(returncode: int, stderr: str) -> str:
    """Why a child process running LiteRT failed: the signal that killed it or
    its exit status, with the last line it wrote to stderr."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        reason = f"the interpreter process was killed by {name}"
    else:
        reason = f"exit status {returncode}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"{reason}" + (f" ({lines[-1].strip()})" if lines else "")
