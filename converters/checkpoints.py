"""Checkpoint files: reading PyTorch (.pth/.pt/.bin/.ckpt) and safetensors
checkpoints into NumPy, writing safetensors, and saving imported Keras
weights without leaving half a file behind."""
from __future__ import annotations

import argparse
import json
import math
import re
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping

import numpy as np

from edgevit.errors import EdgevitError, MissingPackage, first_line

TORCH_HINT = 'pip install "edgevit[torch]"'
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pth.tar", ".tar")
# Top-level entries of training checkpoints that hold the model weights, in
# order of preference (EMA weights first, as timm's own loader does).
STATE_DICT_ENTRIES = ("state_dict_ema", "model_ema", "ema_state_dict", "state_dict", "model_state_dict",
                      "model", "module", "net")
WEIGHTS_SUFFIX = ".weights.h5"


@dataclass
class Checkpoint:
    """Tensors of a checkpoint as float32/int NumPy arrays, by name."""

    path: str
    tensors: dict[str, np.ndarray]
    entry: str | None = None  # the training-checkpoint entry the weights came from

    def __len__(self):
        return len(self.tensors)


_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
                       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Read a .safetensors file with NumPy alone (no torch, no safetensors
    package): an 8-byte little-endian header length, a JSON header, raw data.
    BF16 tensors are widened to float32 exactly."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("file too short for a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > 100_000_000:
            raise ValueError("header length is implausible")
        try:
            header = json.loads(f.read(size))
        except RecursionError:
            raise ValueError("its JSON header nests too deeply") from None
        data = f.read()
    if not isinstance(header, dict):
        raise ValueError(f"its header is a JSON {type(header).__name__}, not an object")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[start:end]
        shape = tuple(info["shape"])
        dtype = info["dtype"]
        if dtype == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif dtype in _SAFETENSORS_DTYPES:
            arr = np.frombuffer(raw, dtype=np.dtype(_SAFETENSORS_DTYPES[dtype]).newbyteorder("<"))
        else:
            raise ValueError(f"tensor {name!r} has unsupported dtype {dtype}")
        if arr.size != math.prod(shape):
            raise ValueError(f"tensor {name!r} is truncated")
        tensors[name] = _as_numpy_float(arr.reshape(shape))
    return tensors


def write_safetensors(tensors: dict[str, np.ndarray], path: str | Path) -> None:
    """Write a .safetensors file with NumPy alone (tests and exports)."""
    codes = {np.dtype(v): k for k, v in _SAFETENSORS_DTYPES.items()}
    header, chunks, offset = {}, [], 0
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        raw = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for raw in chunks:
            f.write(raw)


def _as_numpy_float(arr: np.ndarray) -> np.ndarray:
    if np.issubdtype(arr.dtype, np.floating):
        return np.ascontiguousarray(arr, dtype=np.float32)
    return np.asarray(arr)


def import_torch():
    try:
        import torch
    except ImportError:
        raise MissingPackage(f"Reading PyTorch checkpoints needs torch, which is not installed: {TORCH_HINT} "
                           "(.safetensors files load without it).") from None
    return torch


def _torch_to_numpy(value):
    torch = import_torch()
    t = value.detach().cpu()
    if t.is_floating_point():
        return t.to(torch.float32).numpy()
    return t.numpy()


def _find_state_dict(obj, path: str):
    """The name -> tensor mapping inside whatever torch.load returned."""
    torch = import_torch()

    def is_state_dict(d):
        return isinstance(d, Mapping) and d and any(isinstance(v, torch.Tensor) for v in d.values())

    if is_state_dict(obj) and not any(k in obj for k in STATE_DICT_ENTRIES if isinstance(obj.get(k), Mapping)):
        return obj, None
    if isinstance(obj, Mapping):
        for entry in STATE_DICT_ENTRIES:
            value = obj.get(entry)
            if hasattr(value, "state_dict") and not isinstance(value, Mapping):
                value = value.state_dict()
            if is_state_dict(value):
                return value, entry
    if isinstance(obj, torch.nn.Module):
        return obj.state_dict(), None
    kind = type(obj).__name__
    keys = f" (top-level keys: {', '.join(map(str, list(obj)[:6]))})" if isinstance(obj, Mapping) else ""
    raise EdgevitError(f"{path!r} holds a {kind}, not a state dict of tensors{keys}.")


def check_checkpoint_file(path: str | Path) -> Path:
    """An existing file that is no Keras file (cheap, before TensorFlow loads)."""
    path = Path(path)
    if not path.exists():
        raise EdgevitError(f"Checkpoint {str(path)!r} does not exist.")
    if not path.is_file():
        raise EdgevitError(f"Checkpoint {str(path)!r} is not a file.")
    if path.name.endswith((".keras", ".h5")):
        raise EdgevitError(f"{str(path)!r} is a Keras file, not a PyTorch or safetensors checkpoint: edgevit "
                           "reads it as it is (`edgevit convert MODEL --weights FILE`, or `edgevit convert "
                           "FILE.keras`); import-weights is for PyTorch checkpoints.")
    return path


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a PyTorch (.pth/.pt/.bin/.ckpt) or safetensors checkpoint."""
    path = check_checkpoint_file(path)
    label = str(path)
    if _looks_like_safetensors(path):
        try:
            tensors = read_safetensors(path)
        except (ValueError, KeyError, TypeError) as err:
            raise EdgevitError(f"Could not read checkpoint {label!r} as safetensors: {first_line(err)}") from None
        if not tensors:
            raise EdgevitError(f"Checkpoint {label!r} holds no tensors.")
        return Checkpoint(label, tensors)
    if not (path.name.endswith(TORCH_SUFFIXES) or _looks_like_torch(path)):
        raise EdgevitError(f"Checkpoint {label!r} is neither a PyTorch file (.pth, .pt, .bin, .ckpt) "
                           "nor a .safetensors file.")
    torch = import_torch()
    _refuse_zip_bombs(path)
    try:
        # argparse.Namespace: timm and cvnets training checkpoints store their arguments
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for corrupt or foreign files
        reason = err.strerror if isinstance(err, PermissionError) else _unpickling_refusal(str(err))
        raise EdgevitError(f"Could not read checkpoint {label!r}: {reason}.") from None
    state, entry = _find_state_dict(obj, label)
    tensors = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            tensors[_strip_wrapper_prefix(str(key))] = _torch_to_numpy(value)
    return Checkpoint(label, tensors, entry)


# How torch's weights-only unpickler names what it refused: "Unsupported global: GLOBAL x.Y was not an allowed
# global" for a class it does not know, "Trying to load unsupported GLOBAL posix.system whose module posix is
# blocked" for a function of a module it never allows (os, subprocess, ...).
_REFUSED_GLOBAL = re.compile(r"unsupported (?:global: )?GLOBAL ([\w.]+)( whose module [\w.]+ is blocked)?", re.I)


def _unpickling_refusal(torch_message: str) -> str:
    """Why torch.load(weights_only=True) refused a file, in words."""
    refused = _REFUSED_GLOBAL.search(torch_message)
    if refused is None:  # random bytes fail deep in the unpickler or the zip reader with any exception type
        return "not a PyTorch checkpoint, or a truncated or corrupt one"
    name, blocked = refused.groups()
    if blocked:
        return (f"it asks to run {name} when it is loaded, which edgevit never does (a checkpoint of weights "
                "runs no code): do not use this file unless you know who made it and why")
    return (f"it stores Python objects ({name}) besides tensors, which are not unpickled for safety; re-save the "
            "state dict alone: torch.save(model.state_dict(), path)")


def _refuse_zip_bombs(path: Path) -> None:
    """A PyTorch zip checkpoint with a member that would inflate far beyond
    its stored size is refused before torch reads it (torch stores tensors
    uncompressed, but loads deflated ones: a 262 KB file gave a 256 MiB
    tensor)."""
    from edgevit.saving import inflates_like_a_bomb

    try:
        with zipfile.ZipFile(path) as archive:
            bomb = next((info for info in archive.infolist() if inflates_like_a_bomb(info)), None)
    except (zipfile.BadZipFile, OSError, EOFError):
        return  # a legacy pickle, or damage torch reports in its own words
    if bomb is not None:
        raise EdgevitError(f"Could not read checkpoint {str(path)!r}: its member {bomb.filename} would inflate from "
                           f"{bomb.compress_size:,} to {bomb.file_size:,} bytes (a decompression bomb, not a "
                           "checkpoint).")


def _strip_wrapper_prefix(key: str) -> str:
    # DistributedDataParallel / torch.compile wrappers
    for prefix in ("module.", "_orig_mod."):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key


def _looks_like_safetensors(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] < 100_000_000


def _looks_like_torch(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    return head.startswith(b"PK\x03\x04") or head[:1] == b"\x80"  # zip archive or legacy pickle


def save_weights_atomic(model, output: str | Path) -> Path:
    """Write ``model``'s weights to ``output`` whole or not at all
    (:func:`edgevit.writing.staged`; the file is rendered in memory first)."""
    from edgevit.writing import staged, weights_h5

    output = Path(output)
    if not output.name.endswith(WEIGHTS_SUFFIX):
        raise EdgevitError(f"Output {str(output)!r} must end in {WEIGHTS_SUFFIX} (a Keras weights file).")
    if not output.parent.is_dir():
        raise EdgevitError(f"Output folder {str(output.parent)!r} does not exist.")
    content = weights_h5(model)
    with staged([output]) as staging:
        staging.write_bytes(output, content)
    return output
