"""Run a .tflite file on a batch of inputs in a child process.

A delegate can abort the whole process (XNNPACK was once seen to die with
``double free or corruption``); running in a child turns that into an error
message instead of a crash of the caller.

Child usage: ``python -m edgevit.export.run_model MODEL INPUTS.npy OUTPUTS.npy
THREADS KERNELS``: inputs are float model inputs; outputs are float
(dequantized) model outputs; KERNELS is xnnpack, builtin or reference.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from edgevit.errors import EdgevitError
from edgevit.litert.interpreter import describe_child_failure, load_interpreter
from edgevit.litert.x86_levels import emulated_command
from edgevit.writing import save_array, temporary_folder


def quantize(x: np.ndarray, detail: dict) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    scale, zero_point = detail["quantization"]
    if dtype.kind == "f":
        return x.astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(dtype)


def dequantize(q: np.ndarray, detail: dict) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if np.dtype(detail["dtype"]).kind == "f":
        return q.astype(np.float32)
    return ((q.astype(np.float32) - zero_point) * scale).astype(np.float32)


def run_in_process(model_content: bytes, inputs: np.ndarray, num_threads: int = 1,
                   kernels: str = "xnnpack") -> np.ndarray:
    interp = load_interpreter(model_content, num_threads=num_threads, kernels=kernels)
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0], interp.get_output_details()[0]
    results = []
    for sample in inputs:
        interp.set_tensor(inp["index"], quantize(sample[None], inp))
        interp.invoke()
        results.append(dequantize(interp.get_tensor(out["index"]), out)[0])
    return np.stack(results)


def run_in_child(model_path: str | Path, inputs, num_threads: int = 1,
                 kernels: str = "xnnpack", timeout: float = 900, x86_level: str | None = None) -> np.ndarray:
    """``inputs``: an array, or an :class:`~edgevit.data.images.ImageSet`
    (handed to the child a batch at a time, which reads them one by one).
    ``x86_level``: run on the kernels of an older x86 CPU, emulated (see
    :mod:`edgevit.litert.x86_levels`); None: this machine's."""
    with temporary_folder("edgevit-run-") as tmp:
        in_path, out_path = tmp / "inputs.npy", tmp / "outputs.npy"
        save_array(in_path, inputs, np.float32)
        cmd = [sys.executable, "-m", "edgevit.export.run_model", str(model_path), str(in_path),
               str(out_path), str(num_threads), kernels]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        if x86_level is not None:
            cmd, env = emulated_command(x86_level, cmd, env)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise EdgevitError(f"LiteRT did not finish running {Path(model_path).name} "
                               f"within {timeout:.0f} s.") from None
        if proc.returncode != 0:
            raise EdgevitError(f"LiteRT failed running {Path(model_path).name}: "
                               f"{describe_child_failure(proc.returncode, proc.stderr)}")
        return np.load(out_path)


def _child_main(argv: list[str]) -> None:
    model_path, in_path, out_path, threads, kernels = argv
    outputs = run_in_process(Path(model_path).read_bytes(), saved_rows(Path(in_path)), num_threads=int(threads),
                             kernels=kernels)
    np.save(out_path, outputs)


def saved_rows(path: Path):
    """The rows of a .npy array (C order, as ``save_array`` writes it), read
    from the file one at a time."""
    with open(path, "rb") as file:
        version = np.lib.format.read_magic(file)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(file)
        row_bytes = int(np.prod(shape[1:])) * dtype.itemsize
        for _ in range(shape[0]):
            yield np.frombuffer(file.read(row_bytes), dtype).reshape(shape[1:])


if __name__ == "__main__":
    _child_main(sys.argv[1:])
