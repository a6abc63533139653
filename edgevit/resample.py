"""PyTorch's bicubic resampling (``F.interpolate(mode="bicubic",
align_corners=False)``) as constant matrices, with NumPy alone.

Layers build resize ops from these matrices, and the checkpoint importers
resample position embeddings with them; the importers read checkpoints
without TensorFlow, so nothing here may import it (or Keras).

``antialias`` is a required keyword everywhere: layers follow PyTorch's
default (no antialias) and timm resamples position embeddings with
antialias, and a default would silently pick one of them for the other.
"""
from __future__ import annotations

import numpy as np


def _cubic(x: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution kernel (PyTorch: a = -0.75, antialiased a = -0.5)."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x <= 1, near, np.where(x < 2, far, 0.0))


def bicubic_matrix(in_size: int, out_size: int, *, antialias: bool) -> np.ndarray:
    """The ``[out_size, in_size]`` matrix of PyTorch's 1-D bicubic resampling.

    Without ``antialias``: Keys' kernel with a = -0.75 and edge pixels
    repeated. With ``antialias``: the a = -0.5 kernel, stretched by the
    downscale factor, cut at the border and renormalised, as PyTorch's
    ``antialias=True`` path computes it. Resampling an image is
    ``M_h @ X @ M_w.T`` (separable).
    """
    scale = in_size / out_size
    m = np.zeros((out_size, in_size), np.float64)
    rows = np.arange(out_size)
    if not antialias:
        src = scale * (rows + 0.5) - 0.5
        base = np.floor(src).astype(int)
        t = src - base
        taps = np.arange(-1, 3)
        cols = np.clip(base[:, None] + taps, 0, in_size - 1)
        # np.add.at: clamped taps at the borders land on the same pixel and must add up
        np.add.at(m, (np.repeat(rows, len(taps)), cols.ravel()), _cubic(t[:, None] - taps, -0.75).ravel())
        return m
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    for i in rows:
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        w = _cubic((np.arange(lo, hi) - center + 0.5) * inv, -0.5)
        m[i, lo:hi] = w / w.sum()
    return m


def resample_grid(values: np.ndarray, new_grid, *, antialias: bool) -> np.ndarray:
    """Bicubically resample ``[H, W, C]`` values onto ``new_grid`` (h, w),
    in float64, returned in the input's dtype."""
    h, w = values.shape[:2]
    if (h, w) == tuple(new_grid):
        return values
    mh = bicubic_matrix(h, new_grid[0], antialias=antialias)
    mw = bicubic_matrix(w, new_grid[1], antialias=antialias)
    out = np.einsum("ih,hwc->iwc", mh, values.astype(np.float64))
    return np.einsum("jw,iwc->ijc", mw, out).astype(values.dtype)
