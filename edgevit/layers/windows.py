"""Windows of a feature map, in tensors of rank <= 4: the partition of a
``[B, H, W, C]`` map into non-overlapping ``wh x ww`` windows and back, and
the cyclic shift of a map written as slices and concatenations.

The usual partition is a rank-6 permutation
``[B, H/wh, wh, W/ww, ww, C] -> [B, H/wh, W/ww, wh, ww, C]``, and the usual
shift is ``torch.roll``: TFLite has no ROLL op, and a rank-6 TRANSPOSE
becomes a Flex op no delegate runs. Here the window rows stay merged with
the batch and each window's columns with the channels, so one rank-4
TRANSPOSE does the permutation: ``[B * H/wh, wh, W/ww, ww * C] ->
[B * H/wh, W/ww, wh, ww * C]``. The windows come out in row-major order,
pixels row-major inside each window, as in the reference implementations.
Full-width windows (horizontal stripes) and one-row windows need no
transpose: they are contiguous in memory.

Windows may be rectangular: square windows are Swin's, windows of the full
height or width are stripes (CSWin's cross-shaped attention). Attention
takes them as tokens (:func:`partition_windows`); per-window convolutions
(CSWin's LePE) take them as maps (:class:`WindowPartition`), where the zero
padding at every window border is what a convolution over the batch of
windows does.
"""
from __future__ import annotations

import keras
from keras import ops


def window_grid(grid, window) -> tuple[int, int]:
    """How many windows fit along the height and the width of ``grid``."""
    (height, width), (wh, ww) = grid, window
    if height % wh or width % ww:
        raise ValueError(f"a {height}x{width} map does not split into {wh}x{ww} windows")
    return height // wh, width // ww


def partition_windows(x, window):
    """``[B, H, W, C]`` -> ``[B * nH * nW, wh * ww, C]``: the ``wh x ww``
    windows (row-major), each as a sequence of tokens (row-major)."""
    _, height, width, channels = x.shape
    wh, ww = window
    _, across = window_grid((height, width), window)
    x = ops.reshape(x, (-1, wh, across, ww * channels))
    if wh > 1 and across > 1:  # otherwise the transpose moves a unit axis: the reshapes alone do it
        x = ops.transpose(x, (0, 2, 1, 3))
    return ops.reshape(x, (-1, wh * ww, channels))


def merge_windows(x, grid, window):
    """Inverse of :func:`partition_windows`: ``[B * nH * nW, wh * ww, C]``
    -> ``[B, H, W, C]`` for a map of ``grid`` (H, W)."""
    height, width = grid
    wh, ww = window
    channels = x.shape[-1]
    _, across = window_grid(grid, window)
    x = ops.reshape(x, (-1, across, wh, ww * channels))
    if wh > 1 and across > 1:
        x = ops.transpose(x, (0, 2, 1, 3))
    return ops.reshape(x, (-1, height, width, channels))


def cyclic_shift(x, shift):
    """``torch.roll(x, shift, dims=(1, 2))`` of a ``[B, H, W, C]`` map: each
    axis as two slices swapped by one CONCATENATION (a negative shift moves
    rows and columns up and left)."""
    for axis, amount in zip((1, 2), shift):
        size = x.shape[axis]
        amount %= size
        if amount:
            cut = size - amount
            head, tail = (x[:, cut:], x[:, :cut]) if axis == 1 else (x[:, :, cut:], x[:, :, :cut])
            x = ops.concatenate([head, tail], axis=axis)
    return x


@keras.saving.register_keras_serializable(package="edgevit")
class WindowPartition(keras.layers.Layer):
    """:func:`partition_windows` as maps: ``[B, H, W, C]`` ->
    ``[B * nH * nW, wh, ww, C]`` for ``window=(wh, ww)``."""

    def __init__(self, window, **kwargs):
        super().__init__(**kwargs)
        self.window = tuple(int(w) for w in window)

    def call(self, x):
        wh, ww = self.window
        return ops.reshape(partition_windows(x, self.window), (-1, wh, ww, x.shape[-1]))

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
        return merge_windows(ops.reshape(x, (-1, wh * ww, channels)), self.grid, (wh, ww))

    def compute_output_shape(self, input_shape):
        windows, wh, ww, channels = input_shape
        height, width = self.grid
        batch = None if windows is None else windows // ((height // wh) * (width // ww))
        return (batch, height, width, channels)

    def get_config(self):
        return {**super().get_config(), "grid": list(self.grid)}
