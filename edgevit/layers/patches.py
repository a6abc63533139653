"""Unfold a feature map into patches and fold it back, in tensors of rank <= 4.

MobileViT attends across patches, separately for each pixel position inside a
patch. The usual implementations express this with 5-D/6-D reshapes and
transposes; here a SPACE_TO_DEPTH gathers the pixels of each patch into
channels, so one rank-4 transpose (or none) gives the layouts attention needs:

- ``pixels_in_batch=True``: ``[B * P, N, C]`` (MobileViT v1/v3 multi-head
  attention: every pixel position is an independent sequence of N tokens);
- ``pixels_in_batch=False``: ``[B, N, P, C]`` (MobileViT v2 separable
  attention and its per-sample GroupNorm need all of a sample in one batch
  entry; no transpose at all).

P = patch_size**2 pixels per patch, N = number of patches.
"""
from __future__ import annotations

import keras
from keras import ops


def _space_to_depth(x, block):
    import tensorflow as tf

    return tf.nn.space_to_depth(x, block)


def _depth_to_space(x, block):
    import tensorflow as tf

    return tf.nn.depth_to_space(x, block)


@keras.saving.register_keras_serializable(package="edgevit")
class Unfold(keras.layers.Layer):
    def __init__(self, patch_size: int = 2, pixels_in_batch: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.pixels_in_batch = pixels_in_batch

    def call(self, x):
        _, height, width, channels = x.shape
        pixels = self.patch_size ** 2
        tokens = (height // self.patch_size) * (width // self.patch_size)
        x = ops.reshape(_space_to_depth(x, self.patch_size), (-1, tokens, pixels, channels))
        if not self.pixels_in_batch:
            return x
        x = ops.transpose(x, (0, 2, 1, 3))
        return ops.reshape(x, (-1, tokens, channels))

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
        if self.pixels_in_batch:
            x = ops.reshape(x, (-1, pixels, grid_h * grid_w, channels))
            x = ops.transpose(x, (0, 2, 1, 3))
        x = ops.reshape(x, (-1, grid_h, grid_w, pixels * channels))
        return _depth_to_space(x, self.patch_size)

    def compute_output_shape(self, input_shape):
        batch = None
        if not self.pixels_in_batch and input_shape[0] is not None:
            batch = input_shape[0]
        return (batch, *self.grid, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "grid": list(self.grid), "patch_size": self.patch_size,
                "pixels_in_batch": self.pixels_in_batch}


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
