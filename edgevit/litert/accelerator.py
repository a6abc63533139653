"""Runs a .tflite file on LiteRT's GPU accelerator and compares its outputs
with XNNPACK's on the same inputs: whether the GPU takes every op, which ops
it leaves on the CPU, and whether it computes the same answer.

The rule tables (gpu_rules.py) say what a GPU delegate should accept; only a
run shows what it computes. ai-edge-litert ships a GPU accelerator built on
WebGPU over Vulkan, so any machine with a Vulkan driver can run it: a phone
GPU's, or the software SwiftShader driver in Debian's chromium package on a
machine without a GPU. Both models run in a child process, because a GPU
driver can abort the process it runs in.

Child usage: ``python -m edgevit.litert.accelerator MODEL INPUTS.npy OUTPUTS.npz
REFERENCE(0|1)`` (float inputs, already preprocessed; writes the dequantized
outputs of both runs, of TFLite's reference kernels when asked, and whether
the GPU took every op).
"""
from __future__ import annotations

import ctypes.util
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edgevit.memory import release_memory
from edgevit.writing import save_array, temporary_folder

SWIFTSHADER_ICD = Path("/usr/lib/chromium/vk_swiftshader_icd.json")
ICD_FOLDERS = (Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d"), Path("/usr/local/share/vulkan/icd.d"))
HOW_TO_GET_A_DEVICE = ("for a software Vulkan device: apt-get install chromium libvulkan1, then "
                       f"export VK_ICD_FILENAMES={SWIFTSHADER_ICD} (or run scripts/install-test-tools.sh)")
# Mean output cosine GPU vs XNNPACK below which a file is reported as
# computing another answer on the GPU. Float math differs only in rounding.
AGREEMENT_FLOOR = {"fp32": 0.999, "fp16": 0.999}
INTEGER_AGREEMENT_FLOOR = 0.995
# The images every agreement check of a file runs on (`edgevit check` and
# `edgevit convert` alike): held-out sample photos, preprocessed as the
# file's metadata says, so that both judge a file on the same evidence.
DEFAULT_IMAGES = 16
# Seconds the child may take (ssdlite_mobilevit_v1_xs at 320 px on SwiftShader: 220 s for 16 images, 2 busy cores).
TIMEOUT_SECONDS = 900


def integer_floor(kernels_cosine: float | None) -> float:
    """The mean cosine another kernel set's outputs of an integer file must
    reach against XNNPACK's. Integer kernels may round a value one step
    differently, and a network whose logits lie close together (random or
    barely trained weights, few classes) amplifies such steps. So the floor
    is 0.995, or where TFLite's own two CPU kernel sets (XNNPACK and the
    reference kernels) part further on the same images, twice their cosine
    distance: a margin for what a few images can show (on 8 images of one
    2-class QAT model that distance ranged from 0.004 to 0.04, and the
    GPU's from 0.003 to 0.034: with the distance itself as the floor, one
    set of 8 failed the GPU and another passed it)."""
    if kernels_cosine is None:
        return INTEGER_AGREEMENT_FLOOR
    return min(INTEGER_AGREEMENT_FLOOR, 2.0 * kernels_cosine - 1.0)

_UNSUPPORTED_HEADER = "Following operations are not supported by GPU delegate"
_PLACEMENT = re.compile(r"(\d+) operations will run on the GPU, and the remaining (\d+) operations? "
                        r"will run on the CPU")
_ADAPTER = re.compile(r"Selected adapter: ([^,\n]+)")
_OP_LINE = re.compile(r"[A-Z][A-Z0-9_]*: ")  # "BATCH_MATMUL: Not supported batched mat mul case: ..."
_CHILD_ERROR = "edgevit-accelerator-error: "
_NO_DEVICE = ("No adapters found", "Couldn't load Vulkan", "Failed to load Vulkan")
# errors LiteRT logs on every run (vendor plugins this install does not have)
_LOG_NOISE = ("compiler_plugin", "npu_registry", "litert_compiled_model.h", "compiled_model.cc", "Could not load")


@dataclass
class GpuRun:
    """One run of a file on the GPU accelerator against XNNPACK; ``ran`` is
    False (with ``reason``) when no GPU run happened."""
    ran: bool
    reason: str = ""
    device: str = ""
    fully_accelerated: bool | None = None
    ops_on_gpu: int | None = None
    ops_on_cpu: int | None = None
    # ops the accelerator named as left on the CPU: {"op", "reason"}
    cpu_ops: list[dict] = field(default_factory=list)
    agreement: dict | None = None       # GPU vs XNNPACK (edgevit.litert.agreement)
    floor: float | None = None          # the mean cosine the GPU output must reach
    # integer files: mean cosine of XNNPACK vs TFLite's reference kernels
    cpu_kernels_cosine: float | None = None
    images: str = ""
    # errors the GPU logged while it ran (a shader that failed to compile
    # leaves its output unwritten)
    errors: list[str] = field(default_factory=list)

    @property
    def agrees(self) -> bool | None:
        if not self.ran:
            return None
        return self.agreement["cosine_mean"] >= self.floor

    def to_dict(self) -> dict:
        return {**asdict(self), "agrees": self.agrees}

    def summary(self) -> str:
        """One line for reports."""
        if not self.ran:
            return f"not run: {self.reason}"
        a = self.agreement
        placement = "fully accelerated" if self.fully_accelerated else \
            f"NOT fully accelerated ({self._cpu_side()})"
        line = (f"{placement}; {'agrees with' if self.agrees else 'DISAGREES with'} XNNPACK on {a['samples']} "
                f"images: cosine mean {a['cosine_mean']:.5f}, min {a['cosine_min']:.5f}, max abs error "
                f"{a['max_abs_logit_error']:.3g}, {'pixel argmax' if 'pixels' in a else 'top-1'} agreement "
                f"{a['top1_agreement'] * 100:.0f}% ({self.device})")
        if not self.agrees:
            line += f"; the mean cosine must reach {self.floor:.4g}"
        if self.cpu_kernels_cosine is not None and self.floor < INTEGER_AGREEMENT_FLOOR:
            line += (f"; XNNPACK and TFLite's reference kernels agree to {self.cpu_kernels_cosine:.4f} on these "
                     "images (integer rounding): the floor is twice that distance")
        if self.errors:
            line += f"; the GPU logged {len(self.errors)} error(s), first: {self.errors[0]}"
        return line

    def _cpu_side(self) -> str:
        counted = f"{self.ops_on_cpu} ops on the CPU" if self.ops_on_cpu is not None else "ops on the CPU"
        named = ", ".join(f"{g['op']}: {g['reason']}" for g in self.cpu_ops[:4])
        return counted + (f": {named}" if named else "; the accelerator did not name them")


def vulkan_environment() -> dict:
    """The environment for a child that runs the GPU accelerator: the
    SwiftShader driver is used when it is installed and no driver is chosen."""
    env = dict(os.environ)
    if not env.get("VK_ICD_FILENAMES") and SWIFTSHADER_ICD.is_file():
        env["VK_ICD_FILENAMES"] = str(SWIFTSHADER_ICD)
    return env


def missing_vulkan() -> str | None:
    """Why no Vulkan device can exist here (None: a loader and a driver are
    installed; the accelerator may still find no usable adapter)."""
    if ctypes.util.find_library("vulkan") is None:
        return "no Vulkan loader (libvulkan.so.1) is installed"
    chosen = [p for p in vulkan_environment().get("VK_ICD_FILENAMES", "").split(os.pathsep) if p]
    if chosen:
        return None if any(Path(p).is_file() for p in chosen) else \
            f"VK_ICD_FILENAMES names no existing file ({':'.join(chosen)})"
    if any(folder.is_dir() and any(folder.glob("*.json")) for folder in ICD_FOLDERS):
        return None
    return "no Vulkan driver (ICD) is installed"


def run_on_gpu(model_path: str | Path, inputs: np.ndarray, precision: str, images: str = "",
               timeout: float = TIMEOUT_SECONDS) -> GpuRun:
    """Run ``model_path`` on ``inputs`` (the values its input takes) with
    XNNPACK and with the GPU accelerator, in a child process, and compare the
    outputs: the logits of a file that outputs probabilities
    (``edgevit.litert.logits_view``)."""
    missing = missing_vulkan()
    if missing:
        return GpuRun(False, f"no Vulkan device ({missing}); {HOW_TO_GET_A_DEVICE}")
    with temporary_folder("edgevit-gpu-") as tmp:
        save_array(tmp / "inputs.npy", inputs.astype(np.float32))
        return _run_inputs_file(model_path, tmp, len(inputs), precision, images, timeout)


def _run_inputs_file(model_path: str | Path, tmp: Path, count: int, precision: str, images: str,
                     timeout: float) -> GpuRun:
    """:func:`run_on_gpu` on the ``count`` inputs saved in ``tmp``/inputs.npy."""
    from edgevit.litert.logits_view import logits_file

    name = Path(model_path).name
    with logits_file(model_path) as model_path:
        in_path, out_path = tmp / "inputs.npy", tmp / "outputs.npz"
        integer = precision not in AGREEMENT_FLOOR
        cmd = [sys.executable, "-m", "edgevit.litert.accelerator", str(model_path), str(in_path), str(out_path),
               "1" if integer else "0"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=vulkan_environment())
        except subprocess.TimeoutExpired:
            return GpuRun(False, f"the GPU accelerator did not finish running {name} within {timeout:.0f} s")
        log = proc.stderr
        if proc.returncode != 0:
            return GpuRun(False, _failure(proc.returncode, log))
        outputs = np.load(out_path)
        from edgevit.litert.agreement import agreement, per_image

        placement = _PLACEMENT.search(log)
        adapter = _ADAPTER.search(log)
        cpu, gpu = (per_image(outputs[k], count) for k in ("cpu", "gpu"))
        kernels_cosine = agreement(cpu, per_image(outputs["reference"], count))["cosine_mean"] \
            if integer else None
        floor = integer_floor(kernels_cosine) if integer else AGREEMENT_FLOOR[precision]
        ops_on_cpu, cpu_ops = int(placement.group(2)) if placement else None, unsupported_ops(log)
        # with the CPU allowed as a fallback, is_fully_accelerated() can say
        # True while the log lists ops it left on the CPU
        fully = bool(outputs["fully_accelerated"]) and not ops_on_cpu and not cpu_ops
        return GpuRun(True, device=adapter.group(1).strip() if adapter else "GPU", fully_accelerated=fully,
                      ops_on_gpu=int(placement.group(1)) if placement else None, ops_on_cpu=ops_on_cpu,
                      cpu_ops=cpu_ops,
                      agreement=agreement(cpu, gpu), floor=floor, cpu_kernels_cosine=kernels_cosine, images=images,
                      errors=_run_errors(log))


def run_file_on_gpu(path: Path, count: int = DEFAULT_IMAGES) -> GpuRun:
    """``path`` on the GPU accelerator against XNNPACK, on ``count`` held-out
    sample photos preprocessed as the file's embedded metadata says."""
    missing = missing_vulkan()
    if missing:
        return GpuRun(False, f"no Vulkan device ({missing}); {HOW_TO_GET_A_DEVICE}")
    from edgevit.litert.metadata_check import trusted_metadata

    content = path.read_bytes()
    precision = (trusted_metadata(content) or {}).get("precision") or precision_of(content)
    with temporary_folder("edgevit-gpu-") as tmp:
        described = _save_inputs(content, count, tmp / "inputs.npy")
        # the inputs live on in the file only, and what making them took goes back to the system: this
        # process's memory adds to the child's while it runs (ssdlite_mobilevit_v1_xs at 320 px: the export's
        # peak, docs/benchmarks.md)
        release_memory()
        return _run_inputs_file(path, tmp, count, precision, described, TIMEOUT_SECONDS)


def _save_inputs(content: bytes, count: int, path: Path) -> str:
    """Write ``content``'s inputs for ``count`` held-out sample photos to
    ``path``; what they are."""
    from edgevit.litert.inputs import inputs_for_file

    inputs, described = inputs_for_file(content, count)
    save_array(path, inputs.astype(np.float32))
    return described


def precision_of(content: bytes) -> str:
    """"int8" when any runtime tensor is integer-quantized, else "fp32"."""
    from edgevit.litert.flatbuffer import read

    graph = read(content)
    quantized = any(t.dtype in ("int8", "uint8", "int16") for op in graph.ops for t in op.outputs)
    return "int8" if quantized else "fp32"


def unsupported_ops(log: str) -> list[dict]:
    """The ops the accelerator's log names as left on the CPU, with its reasons."""
    found, listing = [], False
    for line in log.splitlines():
        text = line.strip()
        if _UNSUPPORTED_HEADER in text:
            listing = True
        elif listing and _PLACEMENT.search(text):
            listing = False
        elif listing and _OP_LINE.match(text):
            op, _, reason = text.partition(":")
            entry = {"op": op, "reason": reason.strip()}
            if entry not in found:
                found.append(entry)
    return found


def _run_errors(log: str) -> list[str]:
    """The GPU's validation errors, one line each (Dawn logs a block per error)."""
    return list(dict.fromkeys(line.split("Validation error:", 1)[1].strip() for line in log.splitlines()
                              if "Validation error:" in line and "due to a previous error" not in line))


def _failure(returncode: int, log: str) -> str:
    from edgevit.litert.interpreter import describe_child_failure

    if not any(line.startswith(_CHILD_ERROR) for line in log.splitlines()):
        return f"the GPU accelerator process failed: {describe_child_failure(returncode, log)}"
    for cause in _NO_DEVICE:
        if cause in log:
            return f"the GPU accelerator found no usable Vulkan device ({cause}); {HOW_TO_GET_A_DEVICE}"
    # the exception names only source lines; the log says what went wrong
    errors = [line.strip() for line in log.splitlines()
              if "ERROR" in line and not any(noise in line for noise in _LOG_NOISE)]
    return f"the GPU accelerator failed: {errors[-1] if errors else 'no reason logged'}"


# ---------------------------------------------------------------- child process
def _io_tensors(model_content: bytes):
    """(the input tensor, every output tensor)."""
    from edgevit.litert.flatbuffer import read

    graph = read(model_content)
    return graph.tensors[graph.inputs[0]], [graph.tensors[index] for index in graph.outputs]


def _to_input(x: np.ndarray, tensor) -> np.ndarray:
    dtype = np.dtype(tensor.dtype)
    if dtype.kind == "f":
        return x.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(np.round(x / tensor.scale) + tensor.zero_point, info.min, info.max).astype(dtype)


def _from_output(y: np.ndarray, tensor) -> np.ndarray:
    if np.dtype(tensor.dtype).kind == "f" or tensor.scale is None:
        return y.astype(np.float32)
    return ((y.astype(np.float32) - tensor.zero_point) * tensor.scale).astype(np.float32)


def _run(model_path: str, inputs: np.ndarray, accelerator) -> tuple[np.ndarray, bool]:
    from ai_edge_litert.compiled_model import CompiledModel

    input_tensor, output_tensors = _io_tensors(Path(model_path).read_bytes())
    model = CompiledModel.from_file(model_path, hardware_accel=accelerator)
    in_buffers, out_buffers = model.create_input_buffers(0), model.create_output_buffers(0)

    def output(i: int, tensor) -> np.ndarray:
        dtype = np.dtype(tensor.dtype)
        count = model.get_output_buffer_requirements(i, 0)["buffer_size"] // dtype.itemsize
        raw = np.asarray(out_buffers[i].read(count, dtype))[:int(np.prod(tensor.shape))]
        return _from_output(raw, tensor).reshape(tensor.shape)[0]

    results = []
    for sample in inputs:
        in_buffers[0].write(_to_input(sample[None], input_tensor))
        model.run_by_index(0, in_buffers, out_buffers)
        outputs = [output(i, tensor) for i, tensor in enumerate(output_tensors)]
        # a detector's outputs joined, as edgevit.litert.run_model joins them
        results.append(outputs[0] if len(outputs) == 1 else np.concatenate([o.ravel() for o in outputs]))
    return np.stack(results), bool(model.is_fully_accelerated())


def _child_main(argv: list[str]) -> int:
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator

    model_path, in_path, out_path, with_reference = argv
    inputs = np.load(in_path)
    outputs = {}
    try:
        # the GPU first, while this process holds nothing else: its compiled shaders and buffers are most of
        # the child's memory (0.5 GB for a 320 px detector on SwiftShader), and what ran before it would add
        # to them. With the CPU allowed too, ops the GPU refuses run there instead of failing the compilation.
        gpu, fully = _run(model_path, inputs, HardwareAccelerator.GPU | HardwareAccelerator.CPU)
        cpu, _ = _run(model_path, inputs, HardwareAccelerator.CPU)
    except RuntimeError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        print(_CHILD_ERROR + (lines[-1] if lines else type(err).__name__), file=sys.stderr)
        return 3
    if with_reference == "1":
        from edgevit.litert.run_model import run_in_process

        outputs["reference"] = run_in_process(Path(model_path).read_bytes(), inputs, kernels="reference")
    np.savez(out_path, cpu=cpu, gpu=gpu, fully_accelerated=fully, **outputs)
    return 0


if __name__ == "__main__":
    raise SystemExit(_child_main(sys.argv[1:]))
