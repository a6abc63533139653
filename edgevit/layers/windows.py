"""Window partition of a feature map and its inverse, in tensors of rank <= 4.

Window attention (CSWin's stripes, Swin's square windows) attends within
non-overlapping ``wh x ww`` windows of a ``[B, H, W, C]`` map. The usual
implementations view the map as ``[B, H/wh, wh, W/ww, ww, C]`` and permute
it at rank 6. Here the ``ww`` pixels of a window row travel with the
channels, which leaves a rank-4 view ``[B*H/wh, wh, W/ww, ww*C]``: one
transpose of its two middle axes brings the windows of a band together,
and a reshape gives ``[B*H/wh*W/ww, wh, ww, C]`` (windows in the batch
axis, row-major; pixels row-major inside each window, as the official
CSWin and Swin code order them).

Full-width windows (horizontal stripes) are contiguous in memory: the
partition is a single reshape. One-row windows need no transpose either.
Windows covering the whole map are the map itself.

The window maps feed attention (as ``[windows, wh*ww, C]`` tokens) and
per-window convolutions (CSWin's LePE: zero padding at every window border
is exactly what a convolution over the batch of windows does).
"""
from __future__ import annotations

import keras
from keras import ops


def _check(height: int, width: int, window) -> tuple[int, int]:
    wh, ww = (int(w) for w in window)
    if height % wh or width % ww:
        raise ValueError(f"a {height}x{width} map does not split into {wh}x{ww} windows")
    return wh, ww


@keras.saving.register_keras_serializable(package="edgevit")
class WindowPartition(keras.layers.Layer):
    """``[B, H, W, C]`` -> ``[B * (H/wh) * (W/ww), wh, ww, C]`` for ``window=(wh, ww)``."""

    def __init__(self, window, **kwargs):
        super().__init__(**kwargs)
        self.window = tuple(int(w) for w in window)

    def call(self, x):
        _, height, width, channels = x.shape
        wh, ww = _check(height, width, self.window)
        if ww == width:  # bands of full rows are contiguous
            return ops.reshape(x, (-1, wh, ww, channels))
        x = ops.reshape(x, (-1, wh, width // ww, ww * channels))  # [B*H/wh, wh, W/ww, ww*C]
        if wh > 1:
            x = ops.transpose(x, (0, 2, 1, 3))                    # [B*H/wh, W/ww, wh, ww*C]
        return ops.reshape(x, (-1, wh, ww, channels))

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        wh, ww = self.window
        windows = None if batch is None else batch * (height // wh) * (width // ww)
        return (windows, wh, ww, channels)

    def get_config(self):
        return {**super().get_config(), "window": list(self.window)}


@keras.saving.register_keras_serializable(package="edgevit")
class WindowMerge(keras.layers.Layer):
    """Inverse of :class:`WindowPartition`: windows ``[N, wh, ww, C]`` back
    onto a ``[B, H, W, C]`` map of ``grid=(H, W)``."""

    def __init__(self, grid, **kwargs):
        super().__init__(**kwargs)
        self.grid = tuple(int(g) for g in grid)

    def call(self, x):
        _, wh, ww, channels = x.shape
        height, width = self.grid
        _check(height, width, (wh, ww))
        if ww == width:
            return ops.reshape(x, (-1, height, width, channels))
        x = ops.reshape(x, (-1, width // ww, wh, ww * channels))  # [B*H/wh, W/ww, wh, ww*C]
        if wh > 1:
            x = ops.transpose(x, (0, 2, 1, 3))                    # [B*H/wh, wh, W/ww, ww*C]
        return ops.reshape(x, (-1, height, width, channels))

    def compute_output_shape(self, input_shape):
        windows, wh, ww, channels = input_shape
        height, width = self.grid
        batch = None if windows is None else windows // ((height // wh) * (width // ww))
        return (batch, height, width, channels)

    def get_config(self):
        return {**super().get_config(), "grid": list(self.grid)}
