"""Unfold a feature map into patches and fold it back, in tensors of rank <= 4.

MobileViT attends across patches, separately for each pixel position inside a
patch. The usual implementations express this with 5-D/6-D reshapes and
transposes. Here the p x p pixel positions are peeled off with reshapes and
SPLITs (a row of patches viewed as p image rows, a patch row as p pixels per
channel group) and regrouped with one CONCATENATION, giving the layouts
attention needs:

- ``pixels_in_batch=True``: ``[P * B, N, C]`` (MobileViT v1/v3 multi-head
  attention: every pixel position is an independent sequence of N tokens);
- ``pixels_in_batch=False``: ``[B, N, P, C]`` (MobileViT v2 separable
  attention and its per-sample GroupNorm need a whole sample in one entry).

P = patch_size**2 pixel positions (row-major inside the patch), N patches
(row-major). Only RESHAPE, SPLIT and CONCATENATION are used: all three have
int8, int16 and GPU kernels, unlike SPACE_TO_DEPTH under int16x8.
"""
from __future__ import annotations

import keras
from keras import ops


def pixel_planes(x, patch_size: int) -> list:
    """The P maps ``[B, H/p, W/p, C]`` holding pixel (i, j) of every patch, in
    row-major (i, j) order."""
    _, height, width, channels = x.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    rows = ops.split(ops.reshape(x, (-1, grid_h, patch_size * width, channels)), patch_size, axis=2)
    planes = []
    for row in rows:
        planes += ops.split(ops.reshape(row, (-1, grid_h, grid_w, patch_size * channels)), patch_size, axis=3)
    return planes


def merge_pixel_planes(planes: list, patch_size: int):
    """Inverse of :func:`pixel_planes`."""
    _, grid_h, grid_w, channels = planes[0].shape
    rows = [ops.reshape(ops.concatenate(planes[i:i + patch_size], axis=3),
                        (-1, grid_h, grid_w * patch_size, channels))
            for i in range(0, len(planes), patch_size)]
    return ops.reshape(ops.concatenate(rows, axis=2), (-1, grid_h * patch_size, grid_w * patch_size, channels))


@keras.saving.register_keras_serializable(package="edgevit")
class Unfold(keras.layers.Layer):
    def __init__(self, patch_size: int = 2, pixels_in_batch: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.pixels_in_batch = pixels_in_batch

    def call(self, x):
        channels = x.shape[-1]
        tokens = (x.shape[1] // self.patch_size) * (x.shape[2] // self.patch_size)
        planes = pixel_planes(x, self.patch_size)
        if self.pixels_in_batch:
            return ops.concatenate([ops.reshape(p, (-1, tokens, channels)) for p in planes], axis=0)
        return ops.concatenate([ops.reshape(p, (-1, tokens, 1, channels)) for p in planes], axis=2)

    def get_config(self):
        return {**super().get_config(), "patch_size": self.patch_size,
                "pixels_in_batch": self.pixels_in_batch}


@keras.saving.register_keras_serializable(package="edgevit")
class Fold(keras.layers.Layer):
    """Inverse of :class:`Unfold` onto a ``grid`` of (height, width) pixels."""

    def __init__(self, grid, patch_size: int = 2, pixels_in_batch: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.grid = tuple(grid)
        self.patch_size = patch_size
        self.pixels_in_batch = pixels_in_batch

    def call(self, x):
        channels = x.shape[-1]
        pixels = self.patch_size ** 2
        grid_h, grid_w = self.grid[0] // self.patch_size, self.grid[1] // self.patch_size
        planes = ops.split(x, pixels, axis=0 if self.pixels_in_batch else 2)
        planes = [ops.reshape(p, (-1, grid_h, grid_w, channels)) for p in planes]
        return merge_pixel_planes(planes, self.patch_size)

    def compute_output_shape(self, input_shape):
        batch = None
        if not self.pixels_in_batch and input_shape[0] is not None:
            batch = input_shape[0]
        return (batch, *self.grid, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "grid": list(self.grid), "patch_size": self.patch_size,
                "pixels_in_batch": self.pixels_in_batch}


@keras.saving.register_keras_serializable(package="edgevit")
class SpaceToChannels(keras.layers.Layer):
    """``[B, H, W, C]`` -> ``[B, H/2, W/2, 4C]``: each 2x2 neighbourhood's
    pixels on the channels in column-major order, (0, 0), (1, 0), (0, 1),
    (1, 1) (Swin's patch merging: ``x[0::2, 0::2], x[1::2, 0::2],
    x[0::2, 1::2], x[1::2, 1::2]``), so official checkpoints load
    unpermuted. RESHAPE, SPLIT and CONCATENATION only, like :class:`Unfold`
    (SPACE_TO_DEPTH orders them row-major and has no int16 kernel)."""

    def call(self, x):
        top_left, top_right, bottom_left, bottom_right = pixel_planes(x, 2)
        return ops.concatenate([top_left, bottom_left, top_right, bottom_right], axis=3)

    def compute_output_shape(self, input_shape):
        batch, height, width, channels = input_shape
        return (batch, height // 2, width // 2, 4 * channels)


@keras.saving.register_keras_serializable(package="edgevit")
class ResizeBilinear(keras.layers.Layer):
    """Bilinear resize with PyTorch's ``align_corners`` semantics (both exist
    in the official MobileViT code: v1/v3 use False, v2 uses True)."""

    def __init__(self, size, align_corners: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.size = tuple(size)
        self.align_corners = align_corners

    def call(self, x):
        import tensorflow as tf

        return tf.raw_ops.ResizeBilinear(images=x, size=self.size, align_corners=self.align_corners,
                                         half_pixel_centers=not self.align_corners)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *self.size, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "size": list(self.size), "align_corners": self.align_corners}
