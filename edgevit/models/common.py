"""What several model families share: the image input, the classifier heads
and the ImageNet normalisation constants.

A helper belongs here once two families use it; what one family (or the
MobileViT versions among themselves) uses stays in that family's module.
"""
from __future__ import annotations

import keras
from keras import layers

from edgevit.layers import LayerNorm, TokenSlice
from edgevit.layers.conv import DENSE_INIT

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def image_input(input_size: int):
    """The ``[B, input_size, input_size, 3]`` input every model starts from;
    its name, ``image``, is the input name of exported files."""
    return keras.Input((input_size, input_size, 3), batch_size=None, name="image")


def class_token_head(cls_tokens, num_classes: int, *, epsilon: float):
    """Final LayerNorm over the prefix token(s), then the linear classifier on
    the class token (the first one). Returns (normalised tokens, logits): DeiT
    reads its distillation token from the former."""
    x = LayerNorm(epsilon=epsilon, name="norm")(cls_tokens)
    cls = TokenSlice(0, 1, squeeze=True, name="pool_cls")(x)
    return x, layers.Dense(num_classes, kernel_initializer=DENSE_INIT, name="head")(cls)


def mean_pool_head(tokens, num_classes: int):
    """Mean over the tokens, then the linear classifier (the MLP families have no class token)."""
    x = layers.GlobalAveragePooling1D(name="pool")(tokens)
    return layers.Dense(num_classes, kernel_initializer=DENSE_INIT, name="head")(x)


def transpose_tokens(x, name: str):
    """``[B, N, C]`` <-> ``[B, C, N]``: token mixing as a Dense over the last axis."""
    return layers.Permute((2, 1), name=name)(x)


def copy_all_but_head(source, target) -> None:
    """Copy every weight of ``source`` that ``target`` has with the same shape
    (all but a classifier of another class count)."""
    by_path = {w.path: w for w in source.weights}
    for w in target.weights:
        src = by_path.get(w.path)
        if src is not None and tuple(src.shape) == tuple(w.shape):
            w.assign(src)
