"""Runs inside the emulated Arm64 Python (Debian's python3.11 with numpy 1.24
and the ai-edge-litert 1.4.0 aarch64 wheel), started by edgevit.profile.arm.

Standalone on purpose: the guest has no TensorFlow, Keras or edgevit, only
the standard library, numpy and ai_edge_litert. It reads a JSON job and runs
the model on each input with each kernel set asked for, writing the raw
outputs. When counting, each counted invoke is wrapped in marker syscalls
that the instruction-counting plugin (scripts/arm-emulator/insn_regions.c)
turns into one region; the guest's memory map is written last, so the host
can name the code each count ran in.

Usage (guest): python3.11 arm_guest.py JOB.json
"""
import ctypes
import json
import sys

import numpy as np
from ai_edge_litert import interpreter as litert

# the plugin's protocol: syscall(MARKER, MAGIC, op)
MAGIC = 0x65646765
OPEN, CLOSE, DUMP = 1, 2, 3
RESOLVERS = {"xnnpack": litert.OpResolverType.AUTO,
             "builtin": litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
             "reference": litert.OpResolverType.BUILTIN_REF}


def to_input(x, detail):
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return x.astype(dtype)
    scale, zero_point = detail["quantization"]
    info = np.iinfo(dtype)
    return np.clip(np.round(x / scale) + zero_point, info.min, info.max).astype(dtype)


def marker_call(number):
    syscall = ctypes.CDLL(None).syscall
    syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_ulong]
    return lambda op: syscall(number, MAGIC, op)


def run(content, inputs, kernels, job, marker):
    interpreter = litert.Interpreter(model_content=content, num_threads=job["threads"],
                                     experimental_op_resolver_type=RESOLVERS[kernels])
    interpreter.allocate_tensors()
    inp, outs = interpreter.get_input_details()[0], interpreter.get_output_details()
    results = []
    for i, sample in enumerate(inputs):
        interpreter.set_tensor(inp["index"], to_input(sample[None], inp))
        if marker is not None and i < job["counted"]:
            if i == 0:
                for _ in range(job["warmup"]):  # the first invokes plan and pack: not what a phone repeats
                    interpreter.invoke()
            marker(OPEN)
            interpreter.invoke()
            marker(CLOSE)
        else:
            interpreter.invoke()
        results.append(interpreter.get_tensor(outs[0]["index"])[0] if len(outs) == 1 else joined(interpreter, outs))
    scale, zero_point = outs[0]["quantization"] if len(outs) == 1 else (0.0, 0)  # scale 0: the values themselves
    np.savez(f"{job['outputs']}-{kernels}.npz", raw=np.stack(results), scale=np.float64(scale),
             zero_point=np.int64(zero_point))


def joined(interpreter, outs):
    """A detector's outputs, each dequantized and flattened, joined in order
    (as edgevit.litert.run_model joins them on the host)."""
    values = []
    for out in outs:
        raw, (scale, zero_point) = interpreter.get_tensor(out["index"])[0], out["quantization"]
        values.append((raw.astype(np.float32) if not scale else (raw.astype(np.float32) - zero_point) * scale).ravel())
    return np.concatenate(values)


def main(job_path):
    with open(job_path) as f:
        job = json.load(f)
    with open(job["model"], "rb") as f:
        content = f.read()
    inputs = np.load(job["inputs"])
    marker = marker_call(job["marker"]) if job["marker"] else None
    for kernels in job["kernels"]:
        run(content, inputs, kernels, job, marker)
    if marker is not None:
        marker(DUMP)
        with open("/proc/self/maps") as src, open(job["maps"], "w") as dst:
            dst.write(src.read())


if __name__ == "__main__":
    main(sys.argv[1])
