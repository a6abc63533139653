"""What every checkpoint importer shares.

An importer is data: an ordered list of :class:`Rule` s that rename a Keras
layer path (``layer_3.1.global_rep.0.attn/qkv``) to the module path of the
source checkpoint (``stages.2.1.transformer.0.attn.qkv``). The parameter
suffix (``.weight``, ``.running_var`` ...) and the layout transform follow
from the Keras layer type and the variable name:

=====================  ===================  ==============================
Keras                  checkpoint           transform
=====================  ===================  ==============================
Conv2D kernel          conv ``weight``      OIHW -> HWIO
DepthwiseConv2D        conv ``weight``      [C, 1, kh, kw] -> [kh, kw, C, 1]
Dense kernel           linear ``weight``    [out, in] (or 1x1 conv
                                            [out, in, 1, 1]) -> [in, out]
BatchNorm gamma/beta   ``weight``/``bias``  as is
moving_mean/variance   ``running_mean/var`` as is
LayerNorm gamma/beta   ``weight``/``bias``  as is
=====================  ===================  ==============================

Anything else (class tokens, position embeddings ...) is named explicitly by
a rule on the full variable path, with its own transform. The same tables
run backwards (:func:`export_state_dict`) to write checkpoints in a source's
naming, which the round-trip tests use.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from edgevit.errors import EdgevitError

TORCH_HINT = 'pip install "edgevit[torch]"'
TORCH_SUFFIXES = (".pth", ".pt", ".bin", ".ckpt", ".pth.tar", ".tar")
# Buffers PyTorch keeps that carry no information for inference.
IGNORED_SUFFIXES = ("num_batches_tracked", "unfolding_weights", "relative_position_index", "attn_mask")
# Top-level entries of training checkpoints that hold the model weights, in
# order of preference (EMA weights first, as timm's own loader does).
STATE_DICT_ENTRIES = ("state_dict_ema", "model_ema", "ema_state_dict", "state_dict", "model_state_dict",
                      "model", "module", "net")

Transform = Callable[[np.ndarray, tuple], np.ndarray]


# --------------------------------------------------------------------------
# reading checkpoints
# --------------------------------------------------------------------------

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
        header = json.loads(f.read(size))
        data = f.read()
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
        raise EdgevitError(f"Reading PyTorch checkpoints needs torch, which is not installed: {TORCH_HINT} "
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


def load_checkpoint(path: str | Path) -> Checkpoint:
    """Read a PyTorch (.pth/.pt/.bin/.ckpt) or safetensors checkpoint."""
    path = Path(path)
    if not path.exists():
        raise EdgevitError(f"Checkpoint {str(path)!r} does not exist.")
    if not path.is_file():
        raise EdgevitError(f"Checkpoint {str(path)!r} is not a file.")
    label = str(path)
    if _looks_like_safetensors(path):
        try:
            tensors = read_safetensors(path)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise EdgevitError(f"Could not read checkpoint {label!r} as safetensors: {_first_line(err)}") from None
        if not tensors:
            raise EdgevitError(f"Checkpoint {label!r} holds no tensors.")
        return Checkpoint(label, tensors)
    if not (path.name.endswith(TORCH_SUFFIXES) or _looks_like_torch(path)):
        raise EdgevitError(f"Checkpoint {label!r} is neither a PyTorch file (.pth, .pt, .bin, .ckpt) "
                           "nor a .safetensors file.")
    torch = import_torch()
    try:
        # argparse.Namespace: timm and cvnets training checkpoints store their arguments
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for corrupt or foreign files
        text = str(err)
        unsupported = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
        if unsupported:
            reason = (f"it stores Python objects ({unsupported.group(1)}) besides tensors, which are not "
                      "unpickled for safety; re-save the state dict alone: "
                      "torch.save(model.state_dict(), path)")
        elif isinstance(err, (EOFError, RuntimeError, pickle.UnpicklingError)) or "Unsupported operand" in text:
            reason = "not a PyTorch checkpoint, or a truncated or corrupt one"
        else:
            reason = _first_line(err)
        raise EdgevitError(f"Could not read checkpoint {label!r}: {reason}.") from None
    state, entry = _find_state_dict(obj, label)
    tensors = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            tensors[_strip_wrapper_prefix(str(key))] = _torch_to_numpy(value)
    return Checkpoint(label, tensors, entry)


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


# --------------------------------------------------------------------------
# layout transforms
# --------------------------------------------------------------------------

def conv_kernel(w, shape):
    return np.transpose(w, (2, 3, 1, 0))


def depthwise_kernel(w, shape):
    """[C*M, 1, kh, kw] (grouped conv, M outputs per input channel) -> [kh, kw, C, M]."""
    if w.ndim != 4 or len(shape) != 4 or w.shape[0] != shape[2] * shape[3]:
        return w
    return np.transpose(w.reshape(shape[2], shape[3], *w.shape[2:]), (2, 3, 0, 1))


def dense_kernel(w, shape):
    if w.ndim == 4:
        if w.shape[2:] != (1, 1):
            return w  # not a 1x1 conv: let the shape check report it
        w = w[:, :, 0, 0]
    return np.transpose(w)


def identity(w, shape):
    return w


def reshaped(w, shape):
    """Same values, another shape (e.g. timm's [1, 1, C] affine parameters)."""
    return w.reshape(shape) if w.size == math.prod(shape) else w


def _inverse_conv(w, as_conv):
    return np.transpose(w, (3, 2, 0, 1))


def _inverse_depthwise(w, as_conv):
    kh, kw, c, m = w.shape
    return np.transpose(w, (2, 3, 0, 1)).reshape(c * m, 1, kh, kw)


def _inverse_dense(w, as_conv):
    w = np.transpose(w)
    return w[:, :, None, None] if as_conv else w


def _inverse_identity(w, as_conv):
    return w


SUFFIXES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias",
            "moving_mean": "running_mean", "moving_variance": "running_var"}


# --------------------------------------------------------------------------
# rename rules
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    """``pattern`` (a regex, full match) on a Keras layer path, or on a full
    variable path (``layer/variable``) when ``variable=True``; ``key`` is the
    checkpoint module path (or full tensor key for variable rules), a
    ``re`` template or a function of the match. ``dense_as_conv`` marks
    dense layers stored as 1x1 convolutions (for writing checkpoints)."""

    pattern: str
    key: str | Callable[[re.Match], str]
    variable: bool = False
    dense_as_conv: bool = False
    transform: Transform | None = None
    inverse: Callable[[np.ndarray], np.ndarray] | None = None

    def apply(self, text: str) -> str | None:
        m = re.fullmatch(self.pattern, text)
        if m is None:
            return None
        return self.key(m) if callable(self.key) else m.expand(self.key)


@dataclass
class Target:
    """One Keras variable and where its value comes from."""

    variable: object
    path: str
    key: str
    transform: Transform
    inverse: Callable
    dense_as_conv: bool = False


def _layer_of_variables(model) -> dict[int, object]:
    owners = {}
    for layer in model._flatten_layers(include_self=False, recursive=True):
        for v in list(layer._trainable_variables) + list(layer._non_trainable_variables):
            owners[id(v)] = layer
    return owners


def plan(model, rules: list[Rule], source: str) -> list[Target]:
    """Where every variable of ``model`` comes from under ``rules``."""
    owners = _layer_of_variables(model)
    targets = []
    for var in model.weights:
        path = var.path
        layer_path, _, name = path.rpartition("/")
        layer = owners.get(id(var))
        kind = type(layer).__name__ if layer is not None else ""
        target = None
        for rule in rules:
            if rule.variable:
                key = rule.apply(path)
                if key is not None:
                    target = Target(var, path, key, rule.transform or identity,
                                    rule.inverse or _inverse_identity)
                    break
                continue
            prefix = rule.apply(layer_path)
            if prefix is None:
                continue
            suffix = SUFFIXES.get(name)
            transform, inverse = identity, _inverse_identity
            if suffix is None:  # a parameter of its own (gating_param, alpha ...): same name
                suffix, transform = name, reshaped
            if name == "kernel":
                if kind == "DepthwiseConv2D":
                    transform, inverse = depthwise_kernel, _inverse_depthwise
                elif kind == "Dense":
                    transform, inverse = dense_kernel, _inverse_dense
                else:
                    transform, inverse = conv_kernel, _inverse_conv
            target = Target(var, path, f"{prefix}.{suffix}" if prefix else suffix, rule.transform or transform,
                            rule.inverse or inverse, rule.dense_as_conv)
            break
        if target is None:
            raise EdgevitError(f"The {source} importer has no rule for {model.name} weight {path!r} "
                               "(importer out of date with the model code).")
        targets.append(target)
    return targets


def ignored(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in IGNORED_SUFFIXES


def _shape(a) -> tuple:
    return tuple(int(d) for d in a.shape)


def match_score(targets: list[Target], ckpt: Checkpoint) -> float:
    """Share of the model's tensors the checkpoint names (format detection)."""
    keys = {t.key for t in targets}
    return len(keys & set(ckpt.tensors)) / max(1, len(keys))


def assign(model, targets: list[Target], ckpt: Checkpoint, source: str) -> dict:
    """Fill ``model`` from ``ckpt``, or raise one clear EdgevitError naming
    the first tensor of another shape, the missing or the extra tensors."""
    values, missing, resampled = [], [], []
    for t in targets:
        if t.key not in ckpt.tensors:
            missing.append(t.key)
            continue
        raw = ckpt.tensors[t.key]
        want = _shape(t.variable)
        value = t.transform(raw, want)
        if _shape(value) != want:
            raise EdgevitError(
                f"{ckpt.path!r} is not a {source} checkpoint of {model.name}: tensor {t.key!r} has shape "
                f"{_shape(raw)}, {model.name} needs {_expected_source_shape(t, want)} "
                "(a checkpoint of another variant or architecture?).")
        if getattr(t.transform, "resamples", False) and _shape(raw) != want:
            resampled.append(f"{t.key} {_shape(raw)} -> {want}")
        values.append((t, value))
    used = {t.key for t in targets}
    extra = [k for k in ckpt.tensors if k not in used and not ignored(k)]
    if missing:
        also = f" and has {len(extra)} it has no place for, e.g. {_few(extra)}" if extra else ""
        raise EdgevitError(f"{ckpt.path!r} lacks {len(missing)} of the {len(targets)} tensors {model.name} needs "
                           f"({source} naming), e.g. {_few(missing)}{also}: a checkpoint of another variant?")
    if extra:
        raise EdgevitError(f"{ckpt.path!r} has {len(extra)} tensors {model.name} has no place for "
                           f"({source} naming), e.g. {_few(extra)}: a checkpoint of a larger variant?")
    for t, value in values:
        t.variable.assign(value.astype(t.variable.dtype, copy=False))
    return {"tensors": len(values), "resampled": resampled, "ignored": sorted(k for k in ckpt.tensors if ignored(k) and k not in used)}


def _expected_source_shape(t: Target, keras_shape: tuple) -> tuple:
    try:
        return _shape(t.inverse(np.zeros(keras_shape, np.float32), t.dense_as_conv))
    except Exception:
        return keras_shape


def _few(keys: list[str], n: int = 3) -> str:
    shown = ", ".join(repr(k) for k in keys[:n])
    return shown + (f" and {len(keys) - n} more" if len(keys) > n else "")


def export_state_dict(targets: list[Target]) -> dict[str, np.ndarray]:
    """The model's weights in the source's naming and layouts (tests write
    cvnets / MobileViTv3 checkpoints with it)."""
    out = {}
    for t in targets:
        out[t.key] = np.ascontiguousarray(t.inverse(np.asarray(t.variable.numpy()), t.dense_as_conv))
    return out


# --------------------------------------------------------------------------
# position embeddings
# --------------------------------------------------------------------------

def _keys_cubic(x: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel (PyTorch: a = -0.75, antialiased a = -0.5)."""
    x = np.abs(x)
    return np.where(x <= 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0))


def bicubic_matrix(n_in: int, n_out: int, antialias: bool = True) -> np.ndarray:
    """[n_out, n_in] matrix of ``F.interpolate(mode="bicubic",
    align_corners=False, antialias=...)`` along one axis.

    timm resamples position embeddings with ``antialias=True``: PyTorch then
    uses the a = -0.5 kernel, widened by the downscale factor, truncated at
    the borders and renormalised; without antialias it uses a = -0.75 with
    border indices clamped."""
    scale = n_in / n_out
    m = np.zeros((n_out, n_in), np.float64)
    rows = np.arange(n_out)
    if not antialias:
        src = (rows + 0.5) * scale - 0.5
        base = np.floor(src).astype(int)
        t = src - base
        for k in range(4):
            np.add.at(m, (rows, np.clip(base - 1 + k, 0, n_in - 1)), _keys_cubic(t + 1 - k, -0.75))
        return m
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    for i in rows:
        center = scale * (i + 0.5)
        lo, hi = max(int(center - support + 0.5), 0), min(int(center + support + 0.5), n_in)
        js = np.arange(lo, hi)
        w = _keys_cubic((js - center + 0.5) * inv, -0.5)
        m[i, lo:hi] = w / w.sum()
    return m


def resample_grid(grid: np.ndarray, new_hw: tuple[int, int], antialias: bool = True) -> np.ndarray:
    """Bicubic resize of a ``[H, W, C]`` grid as timm resamples position
    embeddings (``F.interpolate(..., mode="bicubic", antialias=True)``)."""
    h, w, _ = grid.shape
    if (h, w) == tuple(new_hw):
        return grid
    mh, mw = bicubic_matrix(h, new_hw[0], antialias), bicubic_matrix(w, new_hw[1], antialias)
    out = np.einsum("ih,hwc->iwc", mh, grid.astype(np.float64))
    out = np.einsum("jw,iwc->ijc", mw, out)
    return out.astype(np.float32)


def _prefix_tokens(n_old: int, n_new: int) -> int | None:
    """Class/distillation tokens in front of a square grid of patch tokens."""
    for p in range(0, 5):
        if n_old > p and n_new > p and math.isqrt(n_old - p) ** 2 == n_old - p \
                and math.isqrt(n_new - p) ** 2 == n_new - p:
            return p
    return None


def resample_pos_embed(pe: np.ndarray, target_shape: tuple, num_prefix_tokens: int | None = None) -> np.ndarray:
    """Fit a position embedding to the target shape: ``[1, prefix + H*W, C]``
    token layout (prefix tokens kept, found from the shapes when not given)
    or a ``[1, C, H, W]`` grid (PiT; returned as ``[1, H, W, C]``); the
    square patch grid is resampled as timm does."""
    target_shape = tuple(target_shape)
    if pe.ndim == 4 and len(target_shape) == 4:
        if pe.shape[1] == target_shape[3] and pe.shape[3] != target_shape[3]:
            pe = np.transpose(pe, (0, 2, 3, 1))  # NCHW -> NHWC
        if pe.shape[3] != target_shape[3] or _shape(pe) == target_shape:
            return pe
        return resample_grid(pe[0], target_shape[1:3])[None]
    if _shape(pe) == target_shape or pe.ndim != 3 or len(target_shape) != 3 or pe.shape[-1] != target_shape[-1]:
        return pe  # the shape check names it
    prefix = num_prefix_tokens if num_prefix_tokens is not None else _prefix_tokens(pe.shape[1], target_shape[1])
    if prefix is None:
        return pe
    head, grid = pe[:, :prefix], pe[0, prefix:]
    old, new = grid.shape[0], target_shape[1] - prefix
    side_old, side_new = math.isqrt(old), math.isqrt(new)
    if side_old ** 2 != old or side_new ** 2 != new:
        return pe
    grid = resample_grid(grid.reshape(side_old, side_old, -1), (side_new, side_new))
    return np.concatenate([head, grid.reshape(1, new, -1)], axis=1)


def pos_embed_transform(num_prefix_tokens: int | None = None) -> Transform:
    def transform(w, shape):
        return resample_pos_embed(w, shape, num_prefix_tokens)
    transform.resamples = True
    return transform


# --------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------

WEIGHTS_SUFFIX = ".weights.h5"


def save_weights_atomic(model, output: str | Path) -> Path:
    """``model.save_weights`` to a temporary file next to ``output``, then
    an atomic rename: an interrupted import never leaves half a file."""
    output = Path(output)
    if not output.name.endswith(WEIGHTS_SUFFIX):
        raise EdgevitError(f"Output {str(output)!r} must end in {WEIGHTS_SUFFIX} (a Keras weights file).")
    if output.parent and not output.parent.exists():
        raise EdgevitError(f"Output folder {str(output.parent)!r} does not exist.")
    tmp = output.with_name(f".{output.name[:-len(WEIGHTS_SUFFIX)]}.{os.getpid()}.tmp{WEIGHTS_SUFFIX}")
    try:
        model.save_weights(tmp)
        os.replace(tmp, output)
    except OSError as err:
        raise EdgevitError(f"Could not write {str(output)!r}: {_first_line(err)}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return output


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


@dataclass
class Importer:
    """Rules of one checkpoint source for one model family."""

    source: str
    family: str
    rules: Callable[[object], list[Rule]]  # model -> rules (may depend on depth etc.)
    reference: str = ""
    head: tuple[str, ...] = ("head.fc",)  # Keras classifier layer(s)
    notes: str = ""


IMPORTERS: dict[tuple[str, str], Importer] = {}


def register(importer: Importer) -> Importer:
    IMPORTERS[(importer.source, importer.family)] = importer
    return importer
