"""Token layers shared by the ViT-style families: patch embedding, prefix
(class / distillation) tokens, learned position embeddings that follow the
input size, token slicing, stochastic depth, and bicubic resampling written
as two constant matrices (exact PyTorch semantics, no GATHER chains).
"""
from __future__ import annotations

import math

import keras
import numpy as np
from keras import layers, ops

from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.quantize_points import QuantizePoints
from edgevit.resample import bicubic_matrix, resample_grid


# --------------------------------------------------------------------------
# Bicubic resampling as a linear map
# --------------------------------------------------------------------------

@keras.saving.register_keras_serializable(package="edgevit")
class BicubicResize(QuantizePoints, keras.layers.Layer):
    """Resize ``[B, H, W, C]`` maps to ``size`` with PyTorch's bicubic
    interpolation, as two constant matrix products (along H, then W).

    TFLite has no bicubic op; written this way the resize is exact and runs
    as FULLY_CONNECTED ops with constant weights (int8 and GPU friendly)."""

    def __init__(self, size, antialias: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.size = tuple(int(s) for s in size)
        self.antialias = antialias

    def build(self, input_shape):
        h, w = input_shape[1:3]
        self._mh_t = bicubic_matrix(h, self.size[0], antialias=self.antialias).T.astype("float32")
        self._mw_t = bicubic_matrix(w, self.size[1], antialias=self.antialias).T.astype("float32")

    def call(self, x):
        import tensorflow as tf

        mark = self.quantize_point
        x = ops.transpose(x, (0, 3, 2, 1))                                            # [B, C, W, H]
        x = mark("rows", tf.linalg.matmul(x, mark("matrix_h", tf.constant(self._mh_t))))  # [B, C, W, H']
        x = ops.transpose(x, (0, 1, 3, 2))                                            # [B, C, H', W]
        x = tf.linalg.matmul(x, mark("matrix_w", tf.constant(self._mw_t)))               # [B, C, H', W']
        return ops.transpose(x, (0, 2, 3, 1))                                         # [B, H', W', C]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], *self.size, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "size": list(self.size), "antialias": self.antialias}


# --------------------------------------------------------------------------
# Patch embedding and tokens
# --------------------------------------------------------------------------

def patch_embed(x, dim: int, patch_size: int, *, strides: int | None = None, padding: int = 0,
                use_bias: bool = True, name: str = "patch_embed", flatten: bool = True):
    """Non-overlapping (or strided) conv patch embedding ``name.proj``;
    ``[B, N, dim]`` tokens in row-major order when ``flatten``."""
    if padding:
        x = layers.ZeroPadding2D(padding, name=f"{name}.pad")(x)
    x = layers.Conv2D(dim, patch_size, strides or patch_size, use_bias=use_bias,
                      kernel_initializer=DENSE_INIT, name=f"{name}.proj")(x)
    if flatten:
        x = to_tokens(x, name=f"{name}.flatten")
    return x


def to_tokens(x, name: str):
    """``[B, H, W, C]`` -> ``[B, H*W, C]``."""
    h, w, c = x.shape[1:]
    return layers.Reshape((h * w, c), name=name)(x)


def to_map(x, grid, name: str):
    """``[B, H*W, C]`` -> ``[B, H, W, C]``."""
    return layers.Reshape((*grid, x.shape[-1]), name=name)(x)


@keras.saving.register_keras_serializable(package="edgevit")
class PrefixTokens(keras.layers.Layer):
    """Prepends learned tokens (class token, distillation token) to
    ``[B, N, C]`` tokens; weights are named like the PyTorch parameters.

    ``std`` is the normal init of each token (timm ViT: 1e-6 class token,
    DeiT distillation token: 0.02). With ``concat=False`` only the
    ``[B, k, C]`` prefix is returned (its own tensor, see
    :func:`edgevit.layers.transformer_encoder` on token groups)."""

    def __init__(self, token_names=("cls_token",), std=(0.02,), concat: bool = True, **kwargs):
        super().__init__(**kwargs)
        self.token_names = tuple(token_names)
        self.std = tuple(float(s) for s in std)
        self.concat = concat

    def build(self, input_shape):
        self.tokens = [self.add_weight(name=n, shape=(1, 1, input_shape[-1]),
                                       initializer=keras.initializers.TruncatedNormal(stddev=s)
                                       if s >= 1e-3 else keras.initializers.RandomNormal(stddev=s))
                       for n, s in zip(self.token_names, self.std)]

    def call(self, x):
        batch = ops.shape(x)[0]
        prefix = [ops.broadcast_to(ops.convert_to_tensor(t, x.dtype), (batch, 1, x.shape[-1]))
                  for t in self.tokens]
        if not self.concat:
            return prefix[0] if len(prefix) == 1 else ops.concatenate(prefix, axis=1)
        return ops.concatenate([*prefix, x], axis=1)

    def compute_output_shape(self, input_shape):
        k = len(self.token_names)
        if not self.concat:
            return (input_shape[0], k, input_shape[-1])
        n = input_shape[1] + k if input_shape[1] is not None else None
        return (input_shape[0], n, input_shape[2])

    def get_config(self):
        return {**super().get_config(), "token_names": list(self.token_names), "std": list(self.std),
                "concat": self.concat}


@keras.saving.register_keras_serializable(package="edgevit")
class PositionEmbedding(QuantizePoints, keras.layers.Layer):
    """Adds a learned absolute position embedding named ``pos_embed``.

    ``layout="tokens"``: ``[1, num_prefix + h*w, C]`` added to ``[B, N, C]``
    (prefix tokens first, then the grid in row-major order). Called on a
    list ``[prefix, patches]`` it adds the two parts of the same weight to
    each and returns both.
    ``layout="map"``: ``[1, h, w, C]`` added to a ``[B, h, w, C]`` map.

    Weights saved at another input size are resampled bicubically on load
    (prefix entries kept as they are), as timm does when a checkpoint is used
    at a new resolution.

    ``sinusoid=True``: the fixed sine/cosine table of "Attention Is All You
    Need" over the ``num_prefix + h*w`` positions instead (T2T-ViT), a
    non-trainable weight (a checkpoint may still carry another table, e.g.
    one resampled for a new resolution).
    """

    def __init__(self, grid, num_prefix: int = 0, layout: str = "tokens", std: float = 0.02,
                 antialias: bool = True, sinusoid: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.grid = tuple(int(g) for g in grid)
        self.num_prefix, self.layout, self.std, self.antialias = num_prefix, layout, std, antialias
        self.sinusoid = sinusoid
        if sinusoid and layout != "tokens":
            raise ValueError("a sinusoid position table has the token layout")

    def _shape(self, channels):
        if self.layout == "map":
            return (1, *self.grid, channels)
        return (1, self.num_prefix + self.grid[0] * self.grid[1], channels)

    def build(self, input_shape):
        if isinstance(input_shape, (list, tuple)) and isinstance(input_shape[0], (list, tuple)):
            input_shape = input_shape[-1]
        shape = self._shape(input_shape[-1])
        initializer = keras.initializers.TruncatedNormal(stddev=self.std)
        if self.sinusoid:
            initializer = keras.initializers.Constant(sinusoid_table(shape[1], shape[2])[None])
        self.pos_embed = self.add_weight(name="pos_embed", shape=shape, initializer=initializer,
                                         trainable=not self.sinusoid)

    def call(self, x):
        q = self.quantize_point
        if isinstance(x, (list, tuple)):
            prefix, grid = x
            pos = ops.convert_to_tensor(self.pos_embed, grid.dtype)
            return [ops.add(prefix, q("prefix_embedding", pos[:, :self.num_prefix])),
                    ops.add(grid, q("embedding", pos[:, self.num_prefix:]))]
        return ops.add(x, q("embedding", ops.convert_to_tensor(self.pos_embed, x.dtype)))

    def compute_output_shape(self, input_shape):
        return input_shape

    def resample(self, value: np.ndarray) -> np.ndarray:
        """A stored ``pos_embed`` of another grid, resampled onto this one."""
        value = np.asarray(value)
        target = self._shape(value.shape[-1])
        if value.shape == target:
            return value
        if self.layout == "map":
            return resample_grid(value[0], self.grid, antialias=self.antialias)[None]
        prefix, grid_part = value[:, :self.num_prefix], value[:, self.num_prefix:]
        side = math.isqrt(grid_part.shape[1])
        if side * side != grid_part.shape[1] or value.shape[-1] != target[-1]:
            raise ValueError(f"{self.name}: cannot resample position embedding of shape "
                             f"{value.shape} to {target}")
        grid_part = resample_grid(grid_part[0].reshape(side, side, -1), self.grid, antialias=self.antialias)
        return np.concatenate([prefix, grid_part.reshape(1, -1, value.shape[-1])], axis=1)

    def load_own_variables(self, store):
        self.pos_embed.assign(self.resample(store["0"]))

    def get_config(self):
        return {**super().get_config(), "grid": list(self.grid), "num_prefix": self.num_prefix,
                "layout": self.layout, "std": self.std, "antialias": self.antialias, "sinusoid": self.sinusoid}


def sinusoid_table(positions: int, channels: int) -> np.ndarray:
    """``[positions, channels]``: channel pair (2i, 2i+1) holds sin and cos
    of ``position / 10000 ** (2i / channels)``."""
    angles = np.arange(positions)[:, None] / np.power(10000.0, 2 * (np.arange(channels) // 2) / channels)
    table = np.where(np.arange(channels) % 2 == 0, np.sin(angles), np.cos(angles))
    return table.astype("float32")


@keras.saving.register_keras_serializable(package="edgevit")
class TokenSlice(keras.layers.Layer):
    """Tokens ``start:stop`` of ``[B, N, C]``; a single index drops the axis."""

    def __init__(self, start: int, stop: int | None = None, squeeze: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.start, self.stop, self.squeeze = start, stop, squeeze

    def call(self, x):
        stop = x.shape[1] if self.stop is None else self.stop
        y = x[:, self.start:stop]
        return ops.reshape(y, (-1, x.shape[-1])) if self.squeeze else y

    def compute_output_shape(self, input_shape):
        if self.squeeze:
            return (input_shape[0], input_shape[-1])
        stop = input_shape[1] if self.stop is None else self.stop
        return (input_shape[0], stop - self.start, input_shape[-1])

    def get_config(self):
        return {**super().get_config(), "start": self.start, "stop": self.stop, "squeeze": self.squeeze}


@keras.saving.register_keras_serializable(package="edgevit")
class DropPath(keras.layers.Layer):
    """Stochastic depth: drops a whole residual branch per sample while
    training (rescaling the kept ones); identity at inference."""

    def __init__(self, rate: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)

    def call(self, x, training=None):
        if not training or self.rate == 0.0:
            return x
        keep = 1.0 - self.rate
        shape = (ops.shape(x)[0],) + (1,) * (len(x.shape) - 1)
        mask = ops.floor(keep + keras.random.uniform(shape, dtype=x.dtype))
        return x * mask / keep

    def get_config(self):
        return {**super().get_config(), "rate": self.rate}


def drop_path_rates(total_rate: float, depth: int) -> list[float]:
    """timm's linear stochastic-depth rule over ``depth`` blocks."""
    if depth <= 1:
        return [0.0] * depth
    return [total_rate * i / (depth - 1) for i in range(depth)]
