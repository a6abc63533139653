"""Tensor layouts: PyTorch's -> Keras' (``transform(w, keras_shape)``) and
back (``inverse(w, as_conv)``, for writing checkpoints in a source's
naming), and position embeddings fitted to the model's patch grid."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from edgevit.resample import resample_grid

Transform = Callable[[np.ndarray, tuple], np.ndarray]


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


def inverse_conv(w, as_conv):
    return np.transpose(w, (3, 2, 0, 1))


def inverse_depthwise(w, as_conv):
    kh, kw, c, m = w.shape
    return np.transpose(w, (2, 3, 0, 1)).reshape(c * m, 1, kh, kw)


def inverse_dense(w, as_conv):
    w = np.transpose(w)
    return w[:, :, None, None] if as_conv else w


def inverse_identity(w, as_conv):
    return w


def _prefix_tokens(n_old: int, n_new: int) -> int | None:
    """Class/distillation tokens in front of a square grid of patch tokens."""
    for p in range(0, 5):
        if n_old > p and n_new > p and math.isqrt(n_old - p) ** 2 == n_old - p \
                and math.isqrt(n_new - p) ** 2 == n_new - p:
            return p
    return None


def resample_pos_embed(pe: np.ndarray, target_shape: tuple, num_prefix_tokens: int | None = None,
                       antialias: bool = True) -> np.ndarray:
    """Fit a position embedding to the target shape: ``[1, prefix + H*W, C]``
    token layout (prefix tokens kept, found from the shapes when not given)
    or a ``[1, C, H, W]`` grid (PiT; returned as ``[1, H, W, C]``); the
    square patch grid is resampled bicubically, antialiased as timm does
    (``antialias=False``: as ``F.interpolate`` does by default)."""
    target_shape = tuple(target_shape)
    if pe.ndim == 4 and len(target_shape) == 4:
        if pe.shape[1] == target_shape[3] and pe.shape[3] != target_shape[3]:
            pe = np.transpose(pe, (0, 2, 3, 1))  # NCHW -> NHWC
        if pe.shape[3] != target_shape[3] or pe.shape == target_shape:
            return pe
        return resample_grid(pe[0], target_shape[1:3], antialias=antialias)[None]
    if pe.shape == target_shape or pe.ndim != 3 or len(target_shape) != 3 or pe.shape[-1] != target_shape[-1]:
        return pe  # the shape check names it
    prefix = num_prefix_tokens if num_prefix_tokens is not None else _prefix_tokens(pe.shape[1], target_shape[1])
    if prefix is None:
        return pe
    head, grid = pe[:, :prefix], pe[0, prefix:]
    old, new = grid.shape[0], target_shape[1] - prefix
    side_old, side_new = math.isqrt(old), math.isqrt(new)
    if side_old ** 2 != old or side_new ** 2 != new:
        return pe
    grid = resample_grid(grid.reshape(side_old, side_old, -1), (side_new, side_new), antialias=antialias)
    return np.concatenate([head, grid.reshape(1, new, -1)], axis=1)


def pos_embed_transform(num_prefix_tokens: int | None = None, antialias: bool = True) -> Transform:
    def transform(w, shape):
        return resample_pos_embed(w, shape, num_prefix_tokens, antialias)
    transform.resamples = True
    return transform
