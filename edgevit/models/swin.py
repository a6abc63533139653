"""Swin Transformer v1 (Liu et al., 2021) and v2 (Liu et al., 2022):
a 4x4 patch embedding, then four stages of transformer blocks that attend
inside non-overlapping windows, every second block in windows shifted by
half a window; between stages, patch merging puts each 2x2 neighbourhood on
the channels and projects 4C -> 2C. v2 attends with cosine similarity
(L2-normalised queries and keys, a learned per-head logit scale clamped at
100), takes its relative position bias from an MLP on log-spaced
coordinates (``16 * sigmoid``), and normalises after attention and MLP
(post-norm) instead of before.

Deployable as the other families are: batch-1 tensors of rank <= 4 and no
ROLL, GATHER or rank-5 broadcast in the file.

- Windows: ``edgevit.layers.windows`` (one rank-4 transpose each way); the
  shift is two slices and a concatenation per axis. Windows and heads share
  one axis, ``[B, windows * heads, N, head_dim]``, so at batch 1 every
  attention tensor has batch 1, as in the other families' attention.
- Relative position bias: computed from the learned table (v1) or the MLP
  (v2) by an index gather while training; it depends on weights only, so
  the converter folds it into one constant per block, ``[1, 1, heads, N*N]``
  added to the scores viewed as ``[B, windows, heads, N*N]``. The logit
  scale of v2 likewise folds into the constant that scales the queries.
- Shift mask: one constant per stage, ``[1, windows, 1, N*N]`` (0 within a
  region, -100 across), added after the bias as a separate ADD (so that
  int8 keeps the bias's own fine grid; see ``edgevit.litert.requantize``
  for the masked scores).
- Patch merging: the 2x2 neighbours go to the channels in the official
  order (x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2], x[1::2, 1::2]) with
  RESHAPE, SPLIT and CONCATENATION only, so checkpoints load unpermuted.

Feature maps smaller than a window get one window the size of the map and
no shift, and maps that do not divide into windows are zero-padded before
the partition, as timm does; any multiple of 32 is a valid input size.
Names follow timm's modules (``layers.1.downsample.reduction``,
``layers.2.blocks.3.attn.relative_position_bias_table``, ``head.fc`` as
``head``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import keras
import numpy as np
from keras import layers, ops

from edgevit.layers import LayerNorm, drop_path_rates, mlp, patch_embed, to_map, to_tokens
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.patches import SpaceToChannels
from edgevit.layers.quantize_points import QuantizePoints
from edgevit.layers.tokens import DropPath
from edgevit.layers.windows import cyclic_shift, merge_windows, partition_windows, window_grid
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, image_input, mean_pool_head
from edgevit.registry import Preprocessing, Unpublished, builder_options, register_model, timm_weights

REFERENCE_SWIN = "https://github.com/microsoft/Swin-Transformer (timm swin_transformer.py)"
REFERENCE_SWINV2 = "https://github.com/microsoft/Swin-Transformer (timm swin_transformer_v2.py)"
PATCH_SIZE, LN_EPS = 4, 1e-5
MASK_VALUE = -100.0            # added to the scores of token pairs from different regions of a shifted window
MAX_LOGIT_SCALE = math.log(100.0)
BIAS_RANGE = 16.0              # v2: bias = 16 * sigmoid(MLP)
CPB_HIDDEN = 512


@dataclass(frozen=True)
class SwinConfig:
    embed_dim: int
    depths: tuple[int, int, int, int]
    heads: tuple[int, int, int, int]
    window: int
    version: int = 1
    pretrained_windows: tuple[int, int, int, int] = (0, 0, 0, 0)   # v2: windows of the pre-training

    def dim(self, stage: int) -> int:
        return self.embed_dim * 2 ** stage


_T, _S, _B, _L = ((96, (2, 2, 6, 2), (3, 6, 12, 24)), (96, (2, 2, 18, 2), (3, 6, 12, 24)),
                  (128, (2, 2, 18, 2), (4, 8, 16, 32)), (192, (2, 2, 18, 2), (6, 12, 24, 48)))
_FINE_TUNED = (12, 12, 12, 6)  # v2 checkpoints pre-trained at 192 with window 12

CONFIGS = {
    "swin_tiny": SwinConfig(*_T, 7), "swin_small": SwinConfig(*_S, 7), "swin_base": SwinConfig(*_B, 7),
    "swin_large": SwinConfig(*_L, 7), "swin_base_384": SwinConfig(*_B, 12), "swin_large_384": SwinConfig(*_L, 12),
    "swinv2_tiny": SwinConfig(*_T, 8, 2), "swinv2_small": SwinConfig(*_S, 8, 2), "swinv2_base": SwinConfig(*_B, 8, 2),
    "swinv2_tiny_w16": SwinConfig(*_T, 16, 2), "swinv2_small_w16": SwinConfig(*_S, 16, 2),
    "swinv2_base_w16": SwinConfig(*_B, 16, 2),
    "swinv2_base_w12_192": SwinConfig(*_B, 12, 2), "swinv2_large_w12_192": SwinConfig(*_L, 12, 2),
    "swinv2_base_w12to16": SwinConfig(*_B, 16, 2, _FINE_TUNED),
    "swinv2_base_w12to24": SwinConfig(*_B, 24, 2, _FINE_TUNED),
    "swinv2_large_w12to16": SwinConfig(*_L, 16, 2, _FINE_TUNED),
    "swinv2_large_w12to24": SwinConfig(*_L, 24, 2, _FINE_TUNED),
}


def stage_window(grid: int, window: int) -> tuple[int, int]:
    """(window, shift) of a stage whose map is ``grid`` x ``grid``: a map
    that fits in one window is one window, and nothing is shifted (timm)."""
    return (grid, 0) if grid <= window else (window, window // 2)


def relative_position_index(window: int) -> np.ndarray:
    """``[N * N]``: for each (query, key) token pair of a window, row-major,
    the row of the relative position table holding their offset."""
    coords = np.stack(np.meshgrid(np.arange(window), np.arange(window), indexing="ij")).reshape(2, -1)
    offsets = coords[:, :, None] - coords[:, None, :] + (window - 1)
    return (offsets[0] * (2 * window - 1) + offsets[1]).reshape(-1)


def log_spaced_coordinates(window: int, pretrained_window: int = 0) -> np.ndarray:
    """SwinV2's ``[(2w - 1)^2, 2]`` relative (dy, dx) offsets, scaled to
    [-8, 8] by the (pre-training) window and log-spaced:
    ``sign(t) * log2(|t| + 1) / 3``; float32 step by step, as timm."""
    span = np.arange(-(window - 1), window, dtype=np.float32)
    table = np.stack(np.meshgrid(span, span, indexing="ij"), -1)
    table = table / np.float32(max((pretrained_window or window) - 1, 1)) * np.float32(8.0)
    table = np.sign(table) * np.log2(np.abs(table) + np.float32(1.0)) / np.float32(3.0)
    return table.reshape(-1, 2).astype(np.float32)


def shift_mask(padded: int, window: int, shift: int) -> np.ndarray:
    """``[1, windows, 1, N * N]``: -100 where query and key of a shifted
    window come from different regions of the rolled map, 0 elsewhere
    (timm's ``get_attn_mask``, on the padded map)."""
    regions = np.zeros((padded, padded), np.float32)
    bounds = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
    for i, rows in enumerate(bounds):
        for j, cols in enumerate(bounds):
            regions[rows, cols] = 3 * i + j
    across = padded // window
    windows = regions.reshape(across, window, across, window).transpose(0, 2, 1, 3).reshape(across * across, -1)
    mask = np.where(windows[:, None, :] != windows[:, :, None], MASK_VALUE, 0.0).astype(np.float32)
    return mask.reshape(1, across * across, 1, -1)


@keras.saving.register_keras_serializable(package="edgevit")
class WindowAttention(QuantizePoints, keras.layers.Layer):
    """Swin's (shifted-)window multi-head self-attention over the
    ``[B, H*W, C]`` tokens of a ``grid`` map: roll by -shift, pad to whole
    windows, partition, attend with the relative position bias (and the
    shift mask), merge, crop, roll back. ``window`` and ``shift`` are the
    stage's (:func:`stage_window`)."""

    def __init__(self, dim: int, num_heads: int, grid: int, window: int, shift: int = 0, qkv_bias: bool = True,
                 **kwargs):
        super().__init__(**kwargs)
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.dim, self.num_heads, self.grid, self.window, self.shift = dim, num_heads, grid, window, shift
        self.qkv_bias = qkv_bias
        self.head_dim = dim // num_heads
        self.padded = -(-grid // window) * window
        self.windows = window_grid((self.padded, self.padded), (window, window))[0] ** 2
        self.tokens = window * window
        self.qkv = self.dense_class(3 * dim, use_bias=self.dense_bias(), kernel_initializer=DENSE_INIT, name="qkv")
        self.proj = self.dense_class(dim, kernel_initializer=DENSE_INIT, name="proj")
        self._index = relative_position_index(window)
        self._mask = shift_mask(self.padded, window, shift) if shift else None

    def dense_bias(self) -> bool:
        return self.qkv_bias

    def build(self, input_shape):
        self.qkv.build(input_shape)
        self.proj.build((*input_shape[:-1], self.dim))
        self.build_position_bias()

    def build_position_bias(self):
        self.relative_position_bias_table = self.add_weight(
            name="relative_position_bias_table", shape=((2 * self.window - 1) ** 2, self.num_heads),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02))

    def position_table(self):
        """``[(2w - 1)^2, heads]``: the bias of each relative offset."""
        return self.relative_position_bias_table

    def position_bias(self):
        """``[1, 1, heads, N * N]``, from weights only: a constant of the file."""
        bias = ops.take(self.position_table(), self._index, axis=0)            # [N*N, heads]
        return ops.reshape(ops.transpose(bias), (1, 1, self.num_heads, self.tokens * self.tokens))

    def project(self, x):
        return self.qkv(x)

    def call(self, x):
        mark = self.quantize_point
        qkv = mark("qkv", self.project(self.partition(x)))
        q, k, v = ops.split(ops.reshape(qkv, (-1, self.tokens, 3 * self.num_heads, self.head_dim)), 3, axis=2)
        scores = self.scores(q, k)
        attn = self.softmax_point("softmax", self.masked(scores))
        context = mark("context", self.matmul("context", attn, self.heads_first(v, (0, 2, 1, 3))))
        context = ops.reshape(context, (-1, self.num_heads, self.tokens, self.head_dim))
        out = ops.reshape(ops.transpose(context, (0, 2, 1, 3)), (-1, self.tokens, self.dim))
        return self.unpartition(self.proj(out))

    def scores(self, q, k):
        """``q k^T * head_dim^-0.5``, ``[B, windows * heads, N, N]``."""
        mark = self.quantize_point
        q = mark("query_scaled", q * self.head_dim ** -0.5)
        return mark("scores", self.matmul("scores", self.heads_first(q, (0, 2, 1, 3)),
                                          self.heads_first(k, (0, 2, 3, 1))))

    def masked(self, scores):
        """The scores plus the position bias, then the shift mask, as
        ``[B, windows, heads, N * N]`` so that both are constants with a
        unit axis where they repeat.

        The mask is a MUL by 1/0 and an ADD of 0/-100 (a masked pair's
        score becomes -100 rather than score - 100: after the softmax both
        are 0 in float32). A plain ADD of -100 would be folded by the
        converter into the bias ADD, and an int8 constant spanning [-100, b]
        rounds the bias to steps of 0.4; the masked ADD's own int8 grid is
        then narrowed to the scores' range, masked pairs saturating at its
        bottom (``edgevit.litert.requantize.masked_softmax_grids``)."""
        mark = self.quantize_point
        pairs = self.tokens * self.tokens
        x = ops.reshape(scores, (-1, self.windows, self.num_heads, pairs))
        x = mark("biased", ops.add(x, mark("bias", self.position_bias())))
        if self._mask is not None:
            keep = ops.convert_to_tensor((self._mask == 0).astype("float32"))
            x = mark("kept", ops.multiply(x, mark("keep", keep)))
            x = mark("masked", ops.add(x, mark("drop", ops.convert_to_tensor(self._mask))))
        return ops.reshape(x, (-1, self.windows * self.num_heads, self.tokens, self.tokens))

    def heads_first(self, x, order):
        """``[B * windows, N, heads, d]`` transposed by ``order`` (``(0, 2, 1, 3)``:
        ``[.., heads, N, d]``; keys ``(0, 2, 3, 1)``: ``[.., heads, d, N]``,
        no transpose inside the matmul for the GPU delegate to misread), with
        windows and heads on one axis."""
        x = ops.transpose(x, order)
        return ops.reshape(x, (-1, self.windows * self.num_heads, *x.shape[2:]))

    def partition(self, x):
        """``[B, H*W, C]`` tokens -> ``[B * windows, N, C]``."""
        x = ops.reshape(x, (-1, self.grid, self.grid, x.shape[-1]))
        if self.shift:
            x = cyclic_shift(x, (-self.shift, -self.shift))
        if self.padded != self.grid:
            pad = self.padded - self.grid
            x = ops.pad(x, ((0, 0), (0, pad), (0, pad), (0, 0)))
        return partition_windows(x, (self.window, self.window))

    def unpartition(self, x):
        """Inverse of :meth:`partition`."""
        x = merge_windows(x, (self.padded, self.padded), (self.window, self.window))
        if self.padded != self.grid:
            x = x[:, :self.grid, :self.grid]
        if self.shift:
            x = cyclic_shift(x, (self.shift, self.shift))
        return ops.reshape(x, (-1, self.grid * self.grid, x.shape[-1]))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "num_heads": self.num_heads, "grid": self.grid,
                "window": self.window, "shift": self.shift, "qkv_bias": self.qkv_bias}


@keras.saving.register_keras_serializable(package="edgevit")
class CosineWindowAttention(WindowAttention):
    """SwinV2's window attention: cosine similarity of L2-normalised queries
    and keys times a per-head ``exp(min(logit_scale, log 100))``, plus
    ``16 * sigmoid`` of a 2-layer MLP (``cpb_mlp``) on log-spaced relative
    coordinates; q and v have biases, k has none.

    Each normalisation is MEAN, ADD, RSQRT and MUL (the LayerNorm's integer
    ops): ``q * rsqrt(mean(q^2) + eps)`` is ``sqrt(head_dim)`` times the unit
    vector, and that factor goes into the constant that scales the queries.
    The MLP and the logit scale act on weights only, so the converter folds
    them: ``cpb_mlp`` stays a float Dense under QAT."""

    def __init__(self, dim: int, num_heads: int, grid: int, window: int, shift: int = 0, qkv_bias: bool = True,
                 pretrained_window: int = 0, **kwargs):
        self.pretrained_window = pretrained_window
        super().__init__(dim, num_heads, grid, window, shift, qkv_bias, **kwargs)
        self.cpb_hidden = layers.Dense(CPB_HIDDEN, activation="relu", kernel_initializer=DENSE_INIT,
                                       name="cpb_mlp.0")
        self.cpb_out = layers.Dense(num_heads, use_bias=False, kernel_initializer=DENSE_INIT, name="cpb_mlp.2")
        self._coordinates = log_spaced_coordinates(window, pretrained_window)
        # F.normalize divides by max(norm, 1e-12); here mean(x^2) gets its square over head_dim
        self.epsilon = 1e-24 / self.head_dim

    def dense_bias(self) -> bool:
        return False   # q_bias and v_bias are weights of their own; the keys get none

    def build_position_bias(self):
        self.cpb_hidden.build((None, 2))
        self.cpb_out.build((None, CPB_HIDDEN))
        self.logit_scale = self.add_weight(name="logit_scale", shape=(self.num_heads, 1, 1),
                                           initializer=keras.initializers.Constant(math.log(10.0)))
        if self.qkv_bias:
            self.q_bias = self.add_weight(name="q_bias", shape=(self.dim,), initializer="zeros")
            self.v_bias = self.add_weight(name="v_bias", shape=(self.dim,), initializer="zeros")

    def position_table(self):
        return self.cpb_out(self.cpb_hidden(ops.convert_to_tensor(self._coordinates)))

    def position_bias(self):
        # the sigmoid as 1 / (1 + exp(-x)): the converter folds those ops of a
        # constant, but leaves a LOGISTIC (which the GPU takes with no constant input)
        return BIAS_RANGE / (1.0 + ops.exp(-super().position_bias()))

    def projection_bias(self):
        """``[3C]``: q_bias, zeros for the keys, v_bias."""
        return ops.concatenate([self.q_bias, ops.zeros_like(self.q_bias), self.v_bias])

    def project(self, x):
        qkv = self.qkv(x)
        return ops.add(qkv, self.projection_bias()) if self.qkv_bias else qkv

    def query_scale(self):
        """``[1, 1, heads, 1]``: each head's logit scale over head_dim."""
        scale = ops.exp(ops.minimum(self.logit_scale, MAX_LOGIT_SCALE)) / float(self.head_dim)
        return ops.reshape(scale, (1, 1, self.num_heads, 1))

    def normalised(self, x, prefix: str):
        """``sqrt(head_dim) * x / |x|`` over the head dimension."""
        mark = self.quantize_point
        mean = mark(f"{prefix}_mean", ops.mean(mark(f"{prefix}_square", ops.multiply(x, x)), axis=-1, keepdims=True))
        inv_norm = mark(f"{prefix}_rsqrt", ops.rsqrt(mark(f"{prefix}_mean_eps", ops.add(mean, self.epsilon))))
        return ops.multiply(x, inv_norm)

    def scores(self, q, k):
        mark = self.quantize_point
        q = mark("query_scaled", ops.multiply(mark("query", self.normalised(q, "q")),
                                              mark("query_scale", self.query_scale())))
        keys = mark("keys", self.normalised(k, "k"))
        return mark("scores", self.matmul("scores", self.heads_first(q, (0, 2, 1, 3)),
                                          self.heads_first(keys, (0, 2, 3, 1))))

    def get_config(self):
        return {**super().get_config(), "pretrained_window": self.pretrained_window}


def swin_block(x, cfg: SwinConfig, stage: int, index: int, grid: int, drop_path: float, name: str):
    """One block over ``[B, H*W, C]`` tokens: v1 x + attn(norm1(x)), then
    x + mlp(norm2(x)); v2 x + norm1(attn(x)), then x + norm2(mlp(x))."""
    dim = cfg.dim(stage)
    window, shift = stage_window(grid, cfg.window)
    shift = shift if index % 2 else 0
    if cfg.version == 1:
        attention = WindowAttention(dim, cfg.heads[stage], grid, window, shift, name=f"{name}.attn")
    else:
        attention = CosineWindowAttention(dim, cfg.heads[stage], grid, window, shift,
                                          pretrained_window=cfg.pretrained_windows[stage], name=f"{name}.attn")

    def branch(y, step: int, body):
        norm = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm{step}")
        y = body(norm(y)) if cfg.version == 1 else norm(body(y))
        return DropPath(drop_path, name=f"{name}.drop_path{step}")(y) if drop_path else y

    x = layers.Add(name=f"{name}.add1")([x, branch(x, 1, attention)])
    feed_forward = lambda y: mlp(y, 4 * dim, dim, activation="gelu", dropout=0.0, name=f"{name}.mlp")  # noqa: E731
    return layers.Add(name=f"{name}.add2")([x, branch(x, 2, feed_forward)])


def patch_merging(x, grid: int, dim: int, version: int, name: str):
    """Each 2x2 neighbourhood's tokens on the channels (4C, official order),
    then v1 LayerNorm + Linear 4C -> 2C (no bias), v2 Linear then LayerNorm."""
    x = SpaceToChannels(name=f"{name}.merge")(to_map(x, (grid, grid), f"{name}.unflatten"))
    x = to_tokens(x, f"{name}.flatten")
    norm = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm")
    reduction = layers.Dense(dim, use_bias=False, kernel_initializer=DENSE_INIT, name=f"{name}.reduction")
    return reduction(norm(x)) if version == 1 else norm(reduction(x))


def build_swin(name: str, num_classes: int, input_size: int, *, drop_path_rate: float = 0.0) -> keras.Model:
    cfg = CONFIGS[name]
    inputs = image_input(input_size)
    x = patch_embed(inputs, cfg.embed_dim, PATCH_SIZE)
    x = LayerNorm(epsilon=LN_EPS, name="patch_embed.norm")(x)
    grid = input_size // PATCH_SIZE
    rates = drop_path_rates(drop_path_rate, sum(cfg.depths))
    for stage, depth in enumerate(cfg.depths):
        if stage:
            x = patch_merging(x, grid, cfg.dim(stage), cfg.version, name=f"layers.{stage}.downsample")
            grid //= 2
        for i in range(depth):
            x = swin_block(x, cfg, stage, i, grid, rates.pop(0), name=f"layers.{stage}.blocks.{i}")
    x = LayerNorm(epsilon=LN_EPS, name="norm")(x)
    return keras.Model(inputs, mean_pool_head(x, num_classes), name=name)


def _preprocessing(size: int, crop: float = 0.9) -> Preprocessing:
    return Preprocessing(size, int(math.floor(size / crop)), "bicubic", IMAGENET_MEAN, IMAGENET_STD)


# timm's default tag for each (what timm's pretrained=True loads) with timm's own
# ImageNet top-1; the in22k-fine-tuned ones where timm defaults to them.
PRETRAINED = {
    "swin_tiny": timm_weights("swin_tiny_patch4_window7_224.ms_in1k", 81.388, "MIT"),
    "swin_small": timm_weights("swin_small_patch4_window7_224.ms_in22k_ft_in1k", 83.330, "MIT"),
    "swin_base": timm_weights("swin_base_patch4_window7_224.ms_in22k_ft_in1k", 85.276, "MIT"),
    "swin_large": timm_weights("swin_large_patch4_window7_224.ms_in22k_ft_in1k", 86.320, "MIT"),
    "swin_base_384": timm_weights("swin_base_patch4_window12_384.ms_in22k_ft_in1k", 86.442, "MIT"),
    "swin_large_384": timm_weights("swin_large_patch4_window12_384.ms_in22k_ft_in1k", 87.142, "MIT"),
    "swinv2_tiny": timm_weights("swinv2_tiny_window8_256.ms_in1k", 81.824, "MIT"),
    "swinv2_small": timm_weights("swinv2_small_window8_256.ms_in1k", 83.844, "MIT"),
    "swinv2_base": timm_weights("swinv2_base_window8_256.ms_in1k", 84.246, "MIT"),
    "swinv2_tiny_w16": timm_weights("swinv2_tiny_window16_256.ms_in1k", 82.828, "MIT"),
    "swinv2_small_w16": timm_weights("swinv2_small_window16_256.ms_in1k", 84.216, "MIT"),
    "swinv2_base_w16": timm_weights("swinv2_base_window16_256.ms_in1k", 84.608, "MIT"),
    "swinv2_base_w12_192": Unpublished(
        "its official weights are ImageNet-22k pretraining (timm/swinv2_base_window12_192.ms_in22k, 21,841 "
        "classes), not ImageNet-1k; the fine-tuned 1k ones are swinv2_base_w12to16 and swinv2_base_w12to24"),
    "swinv2_large_w12_192": Unpublished(
        "its official weights are ImageNet-22k pretraining (timm/swinv2_large_window12_192.ms_in22k, 21,841 "
        "classes), not ImageNet-1k; the fine-tuned 1k ones are swinv2_large_w12to16 and swinv2_large_w12to24"),
    "swinv2_base_w12to16": timm_weights("swinv2_base_window12to16_192to256.ms_in22k_ft_in1k", 86.270, "MIT"),
    "swinv2_large_w12to16": timm_weights("swinv2_large_window12to16_192to256.ms_in22k_ft_in1k", 86.934, "MIT"),
    "swinv2_base_w12to24": timm_weights("swinv2_base_window12to24_192to384.ms_in22k_ft_in1k", 87.142, "MIT"),
    "swinv2_large_w12to24": timm_weights("swinv2_large_window12to24_192to384.ms_in22k_ft_in1k", 87.474, "MIT"),
}

_SWIN = dict(family="swin", default_input_size=224, preprocessing=_preprocessing(224), input_size_multiple=32,
             reference=REFERENCE_SWIN, checkpoint_formats=("timm", "official"), options=builder_options(build_swin),
             pretrained=PRETRAINED)
_SWIN_384 = {**_SWIN, "default_input_size": 384, "preprocessing": _preprocessing(384, 1.0)}
_SWINV2 = {**_SWIN, "family": "swinv2", "default_input_size": 256, "preprocessing": _preprocessing(256),
           "reference": REFERENCE_SWINV2}
_SWINV2_192 = {**_SWINV2, "default_input_size": 192, "preprocessing": _preprocessing(192)}
_SWINV2_384 = {**_SWINV2, "default_input_size": 384, "preprocessing": _preprocessing(384, 1.0)}


@register_model(**_SWIN)
def swin_tiny(num_classes: int = 1000, input_size: int = 224, **options):
    return build_swin("swin_tiny", num_classes, input_size, **options)


@register_model(**_SWIN)
def swin_small(num_classes: int = 1000, input_size: int = 224, **options):
    return build_swin("swin_small", num_classes, input_size, **options)


@register_model(**_SWIN)
def swin_base(num_classes: int = 1000, input_size: int = 224, **options):
    return build_swin("swin_base", num_classes, input_size, **options)


@register_model(**_SWIN)
def swin_large(num_classes: int = 1000, input_size: int = 224, **options):
    return build_swin("swin_large", num_classes, input_size, **options)


@register_model(**_SWIN_384)
def swin_base_384(num_classes: int = 1000, input_size: int = 384, **options):
    return build_swin("swin_base_384", num_classes, input_size, **options)


@register_model(**_SWIN_384)
def swin_large_384(num_classes: int = 1000, input_size: int = 384, **options):
    return build_swin("swin_large_384", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_tiny(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_tiny", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_small(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_small", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_base(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_base", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_tiny_w16(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_tiny_w16", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_small_w16(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_small_w16", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_base_w16(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_base_w16", num_classes, input_size, **options)


@register_model(**_SWINV2_192)
def swinv2_base_w12_192(num_classes: int = 1000, input_size: int = 192, **options):
    return build_swin("swinv2_base_w12_192", num_classes, input_size, **options)


@register_model(**_SWINV2_192)
def swinv2_large_w12_192(num_classes: int = 1000, input_size: int = 192, **options):
    return build_swin("swinv2_large_w12_192", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_base_w12to16(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_base_w12to16", num_classes, input_size, **options)


@register_model(**_SWINV2)
def swinv2_large_w12to16(num_classes: int = 1000, input_size: int = 256, **options):
    return build_swin("swinv2_large_w12to16", num_classes, input_size, **options)


@register_model(**_SWINV2_384)
def swinv2_base_w12to24(num_classes: int = 1000, input_size: int = 384, **options):
    return build_swin("swinv2_base_w12to24", num_classes, input_size, **options)


@register_model(**_SWINV2_384)
def swinv2_large_w12to24(num_classes: int = 1000, input_size: int = 384, **options):
    return build_swin("swinv2_large_w12to24", num_classes, input_size, **options)
