"""CSWin Transformer (Dong et al., 2022): a four-stage hierarchy (a 7x7
stride-4 conv embedding, then stride-2 3x3 conv merges that double the
width, each followed by a LayerNorm) whose blocks attend within
cross-shaped windows: half of the heads within vertical stripes (full
height, ``split`` columns wide), the other half within horizontal stripes
(full width, ``split`` rows), both on their own half of the channels. A
3x3 depthwise convolution of the values within each stripe (LePE, the
locally-enhanced positional encoding) is added to the attention output;
there is no position embedding. The last stage attends over its whole map
with all heads. LayerNorm over the final map, mean over positions, head.

The official code views the stripes at rank 6; here a stripe is a window of
:class:`edgevit.layers.windows.WindowPartition` (rank <= 4 at any batch):
horizontal stripes are a reshape of the map, vertical ones one transpose of
a rank-4 view. The residual stream stays a ``[B, H, W, C]`` map.

Sizes, names and conventions follow the official repository
(microsoft/CSWin-Transformer ``models/cswin.py``): one ``qkv`` projection
whose output channels are (q | k | v) with the vertical-stripe half first
in each, per-branch ``attns.{0,1}.get_v`` depthwise convs, attention scale
head_dim ** -0.5, LayerNorm eps 1e-5, exact GELU. At input sizes where a
stage's map is narrower than its stripes, a stripe is the whole map (as the
official code does when they are equal).
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
from keras import layers, ops

from edgevit.errors import EdgevitError
from edgevit.layers import HeadAttention, LayerNorm, drop_path_rates, mlp
from edgevit.layers.conv import DENSE_INIT
from edgevit.layers.tokens import DropPath
from edgevit.layers.windows import WindowMerge, WindowPartition
from edgevit.models.common import IMAGENET_MEAN, IMAGENET_STD, image_input
from edgevit.registry import Preprocessing, builder_options, register_model, url_weights

REFERENCE_CSWIN = "https://github.com/microsoft/CSWin-Transformer (models/cswin.py)"
# Official evaluation (timm's loader with the model's default_cfg): bicubic,
# crop 0.9 at 224 (shorter side 248), crop 1.0 at 384, ImageNet mean/std.
PREPROCESS_CSWIN_224 = Preprocessing(224, 248, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
PREPROCESS_CSWIN_384 = Preprocessing(384, 384, "bicubic", IMAGENET_MEAN, IMAGENET_STD)
LN_EPS = 1e-5
# PyTorch's default Conv2d initialisation (the official code keeps it for its
# convolutions): uniform within 1 / sqrt(fan_in). Keras counts a depthwise
# kernel's fan-in over all channels, so LePE's bound (fan-in 9) is explicit.
TORCH_CONV_INIT = {"class_name": "VarianceScaling",
                   "config": {"scale": 1.0 / 3.0, "mode": "fan_in", "distribution": "uniform"}}
LEPE_INIT = {"class_name": "RandomUniform", "config": {"minval": -1.0 / 3.0, "maxval": 1.0 / 3.0}}


@dataclass(frozen=True)
class CSWinConfig:
    embed_dim: int
    depths: tuple[int, int, int, int]
    heads: tuple[int, int, int, int]
    splits: tuple[int, int, int] = (1, 2, 7)  # stripe width of stages 1-3; stage 4 attends over its whole map
    mlp_ratio: float = 4.0


CONFIGS = {
    "cswin_tiny": CSWinConfig(64, (1, 2, 21, 1), (2, 4, 8, 16)),
    "cswin_small": CSWinConfig(64, (2, 4, 32, 2), (2, 4, 8, 16)),
    "cswin_base": CSWinConfig(96, (2, 4, 32, 2), (4, 8, 16, 32)),
    "cswin_large": CSWinConfig(144, (2, 4, 32, 2), (6, 12, 24, 24)),
    "cswin_base_384": CSWinConfig(96, (2, 4, 32, 2), (4, 8, 16, 32), (1, 2, 12)),
    "cswin_large_384": CSWinConfig(144, (2, 4, 32, 2), (6, 12, 24, 24), (1, 2, 12)),
}


@keras.saving.register_keras_serializable(package="edgevit")
class ChannelSplit(keras.layers.Layer):
    """Split the last axis into ``parts`` equal tensors (one SPLIT op)."""

    def __init__(self, parts: int, **kwargs):
        super().__init__(**kwargs)
        self.parts = int(parts)

    def call(self, x):
        return ops.split(x, self.parts, axis=-1)

    def compute_output_shape(self, input_shape):
        return [(*input_shape[:-1], input_shape[-1] // self.parts)] * self.parts

    def get_config(self):
        return {**super().get_config(), "parts": self.parts}


def stripes(grid: tuple[int, int], split: int) -> list[tuple[int, int]]:
    """The (vertical, horizontal) stripe windows of a stage's map."""
    height, width = grid
    return [(height, min(split, width)), (min(split, height), width)]


def misfit_stage(cfg: CSWinConfig, input_size: int) -> tuple[int, int] | None:
    """(stage, map side) of the first stage whose map does not split into
    its stripes at ``input_size`` (a multiple of 32), or None."""
    side = input_size // 4
    for stage, split in enumerate(cfg.splits, 1):
        if side > split and side % split:
            return stage, side
        side = -(-side // 2)
    return None


def check_input_size(cfg: CSWinConfig, name: str, input_size: int) -> None:
    misfit = misfit_stage(cfg, input_size)
    if misfit is None:
        return
    stage, side = misfit
    fitting = [next((s for s in sizes if misfit_stage(cfg, s) is None), None)
               for sizes in (range(input_size - 32, 0, -32), range(input_size + 32, 64 * input_size, 32))]
    raise EdgevitError(f"Input size {input_size} does not work for {name}: stage {stage}'s {side}x{side} map does "
                       f"not split into stripes {cfg.splits[stage - 1]} wide; e.g. "
                       f"{' or '.join(str(s) for s in fitting if s)}.")


def stripe_attention(q, k, v, window, num_heads: int, name: str):
    """Attention within the ``window`` s of ``[B, H, W, C]`` maps q, k, v,
    plus LePE (the values' 3x3 depthwise conv within each window)."""
    grid, channels = tuple(q.shape[1:3]), q.shape[-1]
    if tuple(window) != grid:
        partition = WindowPartition(window, name=f"{name}.partition")
        q, k, v = partition(q), partition(k), partition(v)
    to_tokens = layers.Reshape((window[0] * window[1], channels), name=f"{name}.to_tokens")
    y = HeadAttention(num_heads, name=f"{name}.attn")([to_tokens(q), to_tokens(k), to_tokens(v)])
    y = layers.Reshape((*window, channels), name=f"{name}.to_windows")(y)
    lepe = layers.DepthwiseConv2D(3, padding="same", depthwise_initializer=LEPE_INIT, name=f"{name}.get_v")(v)
    y = layers.Add(name=f"{name}.add_lepe")([y, lepe])
    if tuple(window) != grid:
        y = WindowMerge(grid, name=f"{name}.merge")(y)
    return y


def cross_shaped_attention(x, num_heads: int, windows: list, name: str):
    """``proj`` of the stripe attention of each branch (one branch: the
    whole map), each on its share of the heads and of the channels."""
    dim, branches = x.shape[-1], len(windows)
    qkv = layers.Dense(3 * dim, kernel_initializer=DENSE_INIT, name=f"{name}.qkv")(x)
    q, k, v = ChannelSplit(3, name=f"{name}.split_qkv")(qkv)
    if branches > 1:  # each of q, k, v holds the branches' channels in turn; XNNPACK splits into 2-4 parts only
        q, k, v = (ChannelSplit(branches, name=f"{name}.split_{t}")(part) for t, part in zip("qkv", (q, k, v)))
    else:
        q, k, v = [q], [k], [v]
    outs = [stripe_attention(q[b], k[b], v[b], window, num_heads // branches, name=f"{name}.attns.{b}")
            for b, window in enumerate(windows)]
    y = outs[0] if branches == 1 else layers.Concatenate(axis=-1, name=f"{name}.join")(outs)
    return layers.Dense(dim, kernel_initializer=DENSE_INIT, name=f"{name}.proj")(y)


def cswin_block(x, num_heads: int, windows: list, mlp_ratio: float, drop_path: float, name: str):
    """x + cross-shaped attention(LN(x)), then x + MLP(LN(x))."""
    dim = x.shape[-1]
    y = cross_shaped_attention(LayerNorm(epsilon=LN_EPS, name=f"{name}.norm1")(x), num_heads, windows, name)
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path1")(y)
    x = layers.Add(name=f"{name}.add1")([x, y])
    y = LayerNorm(epsilon=LN_EPS, name=f"{name}.norm2")(x)
    y = mlp(y, int(dim * mlp_ratio), dim, activation="gelu", dropout=0.0, name=f"{name}.mlp")
    if drop_path:
        y = DropPath(drop_path, name=f"{name}.drop_path2")(y)
    return layers.Add(name=f"{name}.add2")([x, y])


def conv_embed(x, filters: int, kernel_size: int, strides: int, padding: int, name: str):
    """PyTorch-padded conv, then LayerNorm over the channels."""
    x = layers.ZeroPadding2D(padding, name=f"{name}.pad")(x)
    x = layers.Conv2D(filters, kernel_size, strides, kernel_initializer=TORCH_CONV_INIT, name=f"{name}.conv")(x)
    return LayerNorm(epsilon=LN_EPS, name=f"{name}.norm")(x)


def build_cswin(cfg: CSWinConfig, name: str, num_classes: int, input_size: int, *,
                drop_path_rate: float = 0.0) -> keras.Model:
    """A CSWin model of ``cfg`` (the registered variants use ``CONFIGS``)."""
    check_input_size(cfg, name, input_size)
    inputs = image_input(input_size)
    x = conv_embed(inputs, cfg.embed_dim, 7, 4, 2, name="stage1_conv_embed")
    rates = drop_path_rates(drop_path_rate, sum(cfg.depths))
    for stage, depth in enumerate(cfg.depths):
        if stage:
            x = conv_embed(x, 2 * x.shape[-1], 3, 2, 1, name=f"merge{stage}")
        grid = tuple(x.shape[1:3])
        windows = stripes(grid, cfg.splits[stage]) if stage < 3 else [grid]
        for i in range(depth):
            x = cswin_block(x, cfg.heads[stage], windows, cfg.mlp_ratio, rates.pop(0), name=f"stage{stage + 1}.{i}")
    x = LayerNorm(epsilon=LN_EPS, name="norm")(x)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    logits = layers.Dense(num_classes, kernel_initializer=DENSE_INIT, name="head")(x)
    return keras.Model(inputs, logits, name=name)


# The official release (training checkpoints: the importer reads state_dict_ema where present); top-1 as the
# official README reports it. _large and _large_384 were pretrained on ImageNet-22k, then fine-tuned on 1k.
_RELEASE = "https://github.com/microsoft/CSWin-Transformer/releases/download/v0.1.0/"
PRETRAINED = {
    name: url_weights(_RELEASE + file, "", top1, "MIT", tag=file.removesuffix(".pth"), naming="official")
    for name, file, top1 in [
        ("cswin_tiny", "cswin_tiny_224.pth", 82.8), ("cswin_small", "cswin_small_224.pth", 83.6),
        ("cswin_base", "cswin_base_224.pth", 84.2), ("cswin_large", "cswin_large_224.pth", 86.5),
        ("cswin_base_384", "cswin_base_384.pth", 85.5), ("cswin_large_384", "cswin_large_384.pth", 87.5)]
}

_CSWIN = dict(family="cswin", default_input_size=224, preprocessing=PREPROCESS_CSWIN_224, input_size_multiple=32,
              reference=REFERENCE_CSWIN, checkpoint_formats=("official",), options=builder_options(build_cswin),
              pretrained=PRETRAINED)
_CSWIN_384 = {**_CSWIN, "default_input_size": 384, "preprocessing": PREPROCESS_CSWIN_384}


@register_model(**_CSWIN)
def cswin_tiny(num_classes: int = 1000, input_size: int = 224, **options):
    return build_cswin(CONFIGS["cswin_tiny"], "cswin_tiny", num_classes, input_size, **options)


@register_model(**_CSWIN)
def cswin_small(num_classes: int = 1000, input_size: int = 224, **options):
    return build_cswin(CONFIGS["cswin_small"], "cswin_small", num_classes, input_size, **options)


@register_model(**_CSWIN)
def cswin_base(num_classes: int = 1000, input_size: int = 224, **options):
    return build_cswin(CONFIGS["cswin_base"], "cswin_base", num_classes, input_size, **options)


@register_model(**_CSWIN)
def cswin_large(num_classes: int = 1000, input_size: int = 224, **options):
    return build_cswin(CONFIGS["cswin_large"], "cswin_large", num_classes, input_size, **options)


@register_model(**_CSWIN_384)
def cswin_base_384(num_classes: int = 1000, input_size: int = 384, **options):
    return build_cswin(CONFIGS["cswin_base_384"], "cswin_base_384", num_classes, input_size, **options)


@register_model(**_CSWIN_384)
def cswin_large_384(num_classes: int = 1000, input_size: int = 384, **options):
    return build_cswin(CONFIGS["cswin_large_384"], "cswin_large_384", num_classes, input_size, **options)
