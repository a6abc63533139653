"""Run a .tflite file on a batch of inputs in a child process.

A delegate can abort the whole process (XNNPACK was once seen to die with
``double free or corruption``); running in a child turns that into an error
message instead of a crash of the caller.

Child usage: ``python -m edgevit.litert.run_model MODEL INPUTS.npy OUTPUTS.npy
THREADS KERNELS``: inputs are float model inputs; outputs are float
(dequantized) model outputs; KERNELS is xnnpack, builtin or reference.
``python -m edgevit.litert.run_model --stream MODEL THREADS KERNELS`` runs
batches as they come (:class:`StreamedRun`): each a frame on standard input,
its outputs a frame on standard output, so that neither side holds more than
a batch, nor writes the images to a file.
"""
from __future__ import annotations

import io
import os
import select
import struct
import subprocess
import sys
import tempfile
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
    return _runner(model_content, num_threads, kernels)(inputs)


def _runner(model_content: bytes, num_threads: int, kernels: str):
    """A function from a batch of inputs to the file's outputs, on one
    interpreter: a file with several outputs (a detector's) gives each
    sample's outputs flattened and joined in the graph's order
    (:func:`split_outputs` takes them apart), so that every comparison of
    runs sees all of them."""
    interp = _allocated(model_content, num_threads, kernels)
    outs = interp.get_output_details()

    def run(inputs) -> np.ndarray:
        if len(outs) == 1:
            return np.stack([values for values, in _each_sample(interp, outs, inputs)])
        return np.stack([np.concatenate([v.ravel() for v in values]) for values in _each_sample(interp, outs, inputs)])

    return run


def outputs_by_signature(model_content: bytes, num_threads: int = 1, kernels: str = "xnnpack"):
    """A function from a batch of inputs to the file's outputs, one array
    [N, *shape] each, ordered by their names in the file's signature. A
    converter may write a file's output tensors in another order than the
    model's outputs; the signature names them as the model did ("boxes",
    "scores") or by position ("output_0", "output_1"): sorted, either is in
    the model's order. A file without a signature: the graph's order."""
    interp = _allocated(model_content, num_threads, kernels)
    outs = interp.get_output_details()
    if interp.get_signature_list():
        named = interp.get_signature_runner().get_output_details()
        outs = [named[key] for key in sorted(named)]
    return lambda inputs: [np.stack(values) for values in zip(*_each_sample(interp, outs, inputs))]


def _allocated(model_content: bytes, num_threads: int, kernels: str):
    interp = load_interpreter(model_content, num_threads=num_threads, kernels=kernels)
    interp.allocate_tensors()
    return interp


def _each_sample(interp, outs: list[dict], inputs):
    """For each sample of ``inputs``, the tensors of ``outs`` (output
    details of ``interp``), dequantized."""
    inp = interp.get_input_details()[0]
    for sample in inputs:
        interp.set_tensor(inp["index"], quantize(sample[None], inp))
        interp.invoke()
        yield [dequantize(interp.get_tensor(out["index"]), out)[0] for out in outs]


def split_outputs(model_content: bytes, joined: np.ndarray) -> list[np.ndarray]:
    """A run's joined outputs of a file with several outputs ([N, values])
    as one array per output, [N, *shape without the batch]."""
    from edgevit.litert.flatbuffer import read

    graph = read(model_content)
    shapes = [graph.tensors[index].shape[1:] for index in graph.outputs]
    ends = np.cumsum([int(np.prod(shape)) for shape in shapes])[:-1]
    return [part.reshape(len(joined), *shape) for part, shape in zip(np.split(joined, ends, axis=1), shapes)]


def run_in_child(model_path: str | Path, inputs, num_threads: int = 1,
                 kernels: str = "xnnpack", timeout: float = 900, x86_level: str | None = None) -> np.ndarray:
    """``inputs``: an array, or an :class:`~edgevit.data.images.ImageSet`
    (handed to the child a batch at a time, which reads them one by one).
    ``x86_level``: run on the kernels of an older x86 CPU, emulated (see
    :mod:`edgevit.litert.x86_levels`); None: this machine's."""
    with temporary_folder("edgevit-run-") as tmp:
        in_path, out_path = tmp / "inputs.npy", tmp / "outputs.npy"
        save_array(in_path, inputs, np.float32)
        cmd = [sys.executable, "-m", "edgevit.litert.run_model", str(model_path), str(in_path),
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


class StreamedRun:
    """``run(batch)``: the outputs of a .tflite file for each batch, from one
    LiteRT child process fed a batch at a time (``with StreamedRun(...) as
    run``). ``timeout``: seconds a batch may take."""

    def __init__(self, model_path: str | Path, num_threads: int = 1, kernels: str = "xnnpack",
                 timeout: float = 900):
        self.name, self.timeout = Path(model_path).name, timeout
        self.command = [sys.executable, "-m", "edgevit.litert.run_model", "--stream", str(model_path),
                        str(num_threads), kernels]

    def __enter__(self):
        self.log = tempfile.TemporaryFile("w+")
        self.child = subprocess.Popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
        return self

    def __call__(self, inputs: np.ndarray) -> np.ndarray:
        try:
            _write_frame(self.child.stdin, np.ascontiguousarray(inputs, np.float32))
            return _read_frame(self.child.stdout, self.timeout)
        except TimeoutError:
            raise EdgevitError(f"LiteRT did not finish running {self.name} on a batch within {self.timeout:.0f} s.") \
                from None
        except (OSError, EOFError):  # the child ended: a broken pipe, or no answer
            self.child.wait()
            self.log.seek(0)
            raise EdgevitError(f"LiteRT failed running {self.name}: "
                               f"{describe_child_failure(self.child.returncode, self.log.read())}") from None

    def __exit__(self, *exc):
        try:
            self.child.stdin.close()
        except OSError:
            pass
        try:
            self.child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        self.log.close()


def _write_frame(stream, array: np.ndarray) -> None:
    """An array as a frame: its .npy bytes after their length."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    stream.write(struct.pack("<Q", buffer.tell()) + buffer.getvalue())
    stream.flush()


def _read_frame(stream, timeout: float | None = None) -> np.ndarray | None:
    """The array of the next frame; None where the stream ends before one
    (EOFError where one waits for it, ``timeout`` given; TimeoutError when
    nothing comes within ``timeout`` seconds)."""
    header = _read_exactly(stream, 8, timeout)
    if not header and timeout is None:
        return None
    if len(header) < 8:
        raise EOFError
    (length,) = struct.unpack("<Q", header)
    body = _read_exactly(stream, length, timeout)
    if len(body) < length:
        raise EOFError
    return np.load(io.BytesIO(body), allow_pickle=False)


def _read_exactly(stream, count: int, timeout: float | None) -> bytes:
    """``count`` bytes of ``stream``, fewer where it ends first."""
    data = b""
    while len(data) < count:
        if timeout is not None and not select.select([stream], [], [], timeout)[0]:
            raise TimeoutError
        chunk = os.read(stream.fileno(), count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _stream_main(argv: list[str]) -> None:
    model_path, threads, kernels = argv
    frames = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # what a native library prints goes to the log, not into the frames
    run = _runner(Path(model_path).read_bytes(), int(threads), kernels)
    while (inputs := _read_frame(sys.stdin.buffer)) is not None:
        _write_frame(frames, run(inputs).astype(np.float32))


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
    if sys.argv[1] == "--stream":
        _stream_main(sys.argv[2:])
    else:
        _child_main(sys.argv[1:])
