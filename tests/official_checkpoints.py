"""Checkpoints in an official repository's naming, written from edgevit's
own weights: what the tests of a naming whose official code cannot run in
CI use (cvnets / MobileViTv3, CSWin). They pin the naming with a hash of the
official state dict's tensor names and shapes, write a checkpoint as the
release does and import it back bit for bit."""
from __future__ import annotations

import hashlib
import zlib
from pathlib import Path

import numpy as np

from edgevit.converters import import_weights
from edgevit.converters.api import importers_for, targets_for
from edgevit.converters.checkpoints import write_safetensors
from edgevit.converters.rules import export_state_dict
from edgevit.registry import get_spec
from tests.helpers import assert_same_weights


def state_dict_in(model, source: str) -> dict[str, np.ndarray]:
    """``model``'s weights in the ``source`` importer's naming, layouts and
    channel order (as its official checkpoints were trained)."""
    return export_state_dict(targets_for(model, importers_for(get_spec(model.name).family)[source]))


def names_and_shapes_hash(state_dict) -> tuple[int, str]:
    """(tensor count, hash of the sorted ``name:shape`` lines)."""
    lines = sorted(f"{k}:{tuple(v.shape)}" for k, v in state_dict.items())
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def write_checkpoint(state_dict, path: Path, entry: str | None = None) -> Path:
    """``torch.save`` of the state dict (under ``entry`` of a training
    checkpoint when given) at ``path``, or ``.safetensors`` beside it when
    torch is absent."""
    try:
        import torch
    except ImportError:
        path = path.with_suffix(".safetensors")
        write_safetensors(state_dict, path)
        return path
    tensors = {k: torch.from_numpy(v) for k, v in state_dict.items()}
    torch.save({"epoch": 0, entry: tensors} if entry else tensors, path)
    return path


def assert_imports_back(path: Path, model, source: str, tensors: int, input_size: int) -> None:
    """Importing ``path`` detects ``source``, reads ``tensors`` tensors and
    gives ``model``'s weights back bit for bit."""
    result = import_weights(path, model.name, input_size=input_size)
    assert result.report["source"] == source and result.report["tensors"] == tensors
    assert_same_weights(model, result.model)


def seeded_tensor(name: str, shape: tuple) -> np.ndarray:
    """A random value for the tensor ``name`` that depends on its name and
    shape alone, scaled as :func:`edgevit.converters.parity.randomize_`
    scales it: the same weights can be given to the official model (by the
    script that recorded its logits) and written for the import, so a test
    needs no stored state dict."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "running_var":
        value = rng.random(shape) * 1.5 + 0.5
    elif leaf == "running_mean":
        value = rng.standard_normal(shape) * 0.2
    elif len(shape) <= 1:
        value = rng.random(shape) * 0.8 + 0.6 if leaf == "weight" else rng.standard_normal(shape) * 0.1
    else:
        value = rng.standard_normal(shape) * (1.0 / max(1, int(np.prod(shape[1:])))) ** 0.5
    return value.astype(np.float32)
