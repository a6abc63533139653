"""Feature maps of the MobileViT backbones, as timm's ``features_only``: the
outputs of layers 3, 4 and 5 (strides 8, 16 and 32), or fewer strides by
dilation (``output_stride`` 16 or 8, as DeepLabV3 runs them).

A features model has the classifier's layers and names up to layer 5, so the
classifier's weights (``weights="imagenet"``, a weights file) fill it by name.
"""
from __future__ import annotations

import keras

from edgevit.errors import EdgevitError
from edgevit.models.common import copy_all_but_head, image_input
from edgevit.models.mobilevit import CONFIGS as V1_BASED
from edgevit.models.mobilevit import OUTPUT_STRIDES, mobilevit_features
from edgevit.models.mobilevit_v2 import CONFIGS as V2_BASED
from edgevit.models.mobilevit_v2 import mobilevit_v2_features
from edgevit.registry import check_input_size, create_model, get_spec


def build_features(name: str, input_size: int, output_stride: int = 32) -> keras.Model:
    """The backbone of the classifier ``name`` with random weights; its
    outputs are the feature maps of layers 3, 4 and 5."""
    if output_stride not in OUTPUT_STRIDES:
        raise EdgevitError(f"output_stride must be one of {', '.join(map(str, OUTPUT_STRIDES))}, got {output_stride}.")
    features = mobilevit_features if name in V1_BASED else mobilevit_v2_features if name in V2_BASED else None
    if features is None:
        raise EdgevitError(f"{name} has no features API: only the MobileViT v1, v2 and v3 backbones have one.")
    inputs = image_input(input_size)
    return keras.Model(inputs, features(inputs, name, output_stride), name=f"{name}_features")


def create_features(name: str, input_size: int | None = None, output_stride: int = 32,
                    weights: str | None = None) -> keras.Model:
    """The backbone of the registered classifier ``name``: outputs the feature
    maps at strides 8, 16, 32 (capped at ``output_stride``), with the
    classifier's ``weights`` (as :func:`edgevit.create_model` takes them)."""
    spec = get_spec(name)
    input_size = spec.default_input_size if input_size is None else int(input_size)
    check_input_size(spec, input_size)
    model = build_features(name, input_size, output_stride)
    if weights is not None:
        copy_all_but_head(create_model(name, input_size=input_size, weights=weights), model)
    return model


def feature_info(model: keras.Model) -> list[dict]:
    """Each output's stride (``reduction``, as timm names it) and channels."""
    size = int(model.inputs[0].shape[1])
    return [{"reduction": size // int(out.shape[1]), "channels": int(out.shape[-1])} for out in model.outputs]
