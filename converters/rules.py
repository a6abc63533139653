"""Rename rules: how a Keras variable finds its checkpoint tensor.

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

import re
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np

from edgevit.errors import EdgevitError

from .checkpoints import Checkpoint
from .layouts import (Transform, conv_kernel, dense_kernel, depthwise_kernel, identity, inverse_conv, inverse_dense,
                      inverse_depthwise, inverse_identity, reshaped)

# Buffers PyTorch keeps that carry no information for inference.
IGNORED_SUFFIXES = ("num_batches_tracked", "unfolding_weights", "relative_position_index", "attn_mask",
                    "relative_coords_table")
SUFFIXES = {"kernel": "weight", "bias": "bias", "gamma": "weight", "beta": "bias",
            "moving_mean": "running_mean", "moving_variance": "running_var"}


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
                                    rule.inverse or inverse_identity)
                    break
                continue
            prefix = rule.apply(layer_path)
            if prefix is None:
                continue
            suffix = SUFFIXES.get(name)
            transform, inverse = identity, inverse_identity
            if suffix is None:  # a parameter of its own (gating_param, alpha ...): same name
                suffix, transform = name, reshaped
            if name == "kernel":
                if kind == "DepthwiseConv2D":
                    transform, inverse = depthwise_kernel, inverse_depthwise
                elif kind == "Dense":
                    transform, inverse = dense_kernel, inverse_dense
                else:
                    transform, inverse = conv_kernel, inverse_conv
            target = Target(var, path, f"{prefix}.{suffix}" if prefix else suffix, rule.transform or transform,
                            rule.inverse or inverse, rule.dense_as_conv)
            break
        if target is None:
            raise EdgevitError(f"The {source} importer has no rule for {model.name} weight {path!r} "
                               "(importer out of date with the model code).")
        targets.append(target)
    return targets


def stem_conv(model):
    """The convolution that reads the image: straight after the input, or
    after padding only (which keeps the channels apart)."""
    import keras

    tensor = model.inputs[0]
    while True:
        readers = [layer for layer in model.layers
                   if not isinstance(layer, keras.layers.InputLayer) and layer.input is tensor]
        layer = readers[0] if len(readers) == 1 else None
        if isinstance(layer, keras.layers.Conv2D) and layer.kernel.shape[2] == 3:
            return layer
        if not isinstance(layer, keras.layers.ZeroPadding2D):
            raise EdgevitError(f"{model.name}: the image does not go straight into one convolution, so a BGR "
                               "checkpoint cannot be made to take RGB by reversing its input channels.")
        tensor = layer.output


def take_rgb(targets: list[Target], model) -> None:
    """Make ``targets`` read a BGR-trained checkpoint into a model that takes
    RGB: the stem kernel's input channels are reversed on the way in (and
    out, when a checkpoint is written in the source's convention)."""
    path = stem_conv(model).kernel.path
    stem = next((t for t in targets if t.path == path), None)
    if stem is None:
        raise EdgevitError(f"{model.name}: no checkpoint tensor feeds the stem convolution {path!r}.")
    transform, inverse = stem.transform, stem.inverse
    stem.transform = lambda w, shape: transform(w, shape)[:, :, ::-1, :]
    stem.inverse = lambda w, as_conv: inverse(w[:, :, ::-1, :], as_conv)


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
    return {"tensors": len(values), "resampled": resampled,
            "ignored": sorted(k for k in ckpt.tensors if ignored(k) and k not in used)}


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
