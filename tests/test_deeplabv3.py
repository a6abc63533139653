"""DeepLabV3 on MobileViT v1/v2/v3 and the backbones' feature maps: sizes as
published, where the output stride turns into dilation, and a graph that
converts to full int8 with nothing a phone's delegates refuse."""
from collections import Counter

import keras
import numpy as np
import pytest

import edgevit
from edgevit.errors import EdgevitError
from edgevit.export.convert import PRECISIONS
from edgevit.info import count_params
from edgevit.models.common import image_input
from edgevit.models.deeplabv3 import CONFIGS
from edgevit.models.features import feature_info
from edgevit.models.mobilevit import downsampling, mobilevit_features
from edgevit.models.mobilevit_v2 import mobilevit_v2_features
from edgevit.registry import get_spec
from tests.helpers import COSINE_FLOOR, assert_deployable, export_variant

# Trainable parameters of transformers' releases (21 VOC classes): the v1
# papers' 1.9 / 2.9 / 6.4 M; MobileViTv2-1.0's 13.3 M. Counted from
# transformers' models (test_counts_equal_transformers_models).
PUBLISHED_PARAMS = {
    "deeplabv3_mobilevit_v1_xxs": 1_854_853, "deeplabv3_mobilevit_v1_xs": 2_944_069,
    "deeplabv3_mobilevit_v1_s": 6_357_941, "deeplabv3_mobilevit_v2_100": 13_318_654,
}
SMALL = 128


def feature_model(features, name, output_stride):
    inputs = image_input(SMALL)
    return keras.Model(inputs, features(inputs, name, output_stride))


def test_registry_holds_the_segmenters_as_users_name_them():
    names = edgevit.list_models("deeplabv3_*")
    assert names == sorted(CONFIGS)
    assert {"deeplabv3_mobilevit_v1_xxs", "deeplabv3_mobilevit_v1_xs", "deeplabv3_mobilevit_v1_s",
            "deeplabv3_mobilevit_v2_100", "deeplabv3_mobilevit_v3_xs"} <= set(names)
    for name in names:
        spec = get_spec(name)
        assert (spec.task, spec.num_classes, spec.default_input_size) == ("segmentation", 21, 512)
    assert get_spec("mobilevit_v1_xxs").task == "classification" and get_spec("mobilevit_v1_xxs").num_classes == 1000


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_parameter_count_equals_published(name):
    assert get_spec(name).parameters == PUBLISHED_PARAMS[name]
    assert count_params(edgevit.create_model(name, input_size=64)) == PUBLISHED_PARAMS[name]


def test_mobilevitv3_voc_segmenters_have_the_releases_parameter_counts():
    """The MobileViTv3 README's VOC table, in millions (one decimal): the
    v1-based ones with ASPP 256, the v2-based ones with ASPP 512, as their configs."""
    readme = {"deeplabv3_mobilevit_v3_xxs": 2.0, "deeplabv3_mobilevit_v3_xs": 3.3, "deeplabv3_mobilevit_v3_s": 7.2,
              "deeplabv3_mobilevit_v3_050": 6.3, "deeplabv3_mobilevit_v3_100": 13.6}
    assert {name: round(get_spec(name).parameters / 1e6, 1) for name in readme} == readme


def test_counts_equal_transformers_models():
    transformers = pytest.importorskip("transformers")
    from edgevit.converters.hf_mobilevit import HF_CONFIGS

    for name in PUBLISHED_PARAMS:
        config_class, kwargs = HF_CONFIGS[name]
        config = getattr(transformers, config_class)(num_labels=21, output_stride=16,
                                                     aspp_out_channels=CONFIGS[name].aspp_channels, **kwargs)
        model_class = (transformers.MobileViTForSemanticSegmentation if config_class == "MobileViTConfig"
                       else transformers.MobileViTV2ForSemanticSegmentation)
        assert sum(p.numel() for p in model_class(config).parameters()) == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize("name", ["deeplabv3_mobilevit_v1_xxs", "deeplabv3_mobilevit_v2_050",
                                  "deeplabv3_mobilevit_v3_xxs"])
def test_logits_are_nhwc_at_the_output_stride(name):
    model = edgevit.create_model(name, input_size=SMALL)
    out = model(np.random.default_rng(0).random((1, SMALL, SMALL, 3), np.float32), training=False)
    assert tuple(out.shape) == (1, SMALL // 16, SMALL // 16, 21)
    assert tuple(edgevit.create_model(name, num_classes=5, input_size=64).output.shape) == (None, 4, 4, 5)


def test_output_stride_becomes_dilation_as_transformers_and_cvnets_place_it():
    assert downsampling(32) == ((2, 1), (2, 1), (2, 1))
    assert downsampling(16) == ((2, 1), (2, 1), (1, 1))
    assert downsampling(8) == ((2, 1), (1, 1), (1, 2))
    with pytest.raises(ValueError):
        downsampling(4)


@pytest.mark.parametrize("features,name", [(mobilevit_features, "mobilevit_v1_xxs"),
                                           (mobilevit_v2_features, "mobilevit_v2_050"),
                                           (mobilevit_features, "mobilevit_v3_xxs")])
@pytest.mark.parametrize("output_stride", [8, 16, 32])
def test_feature_maps_strides_channels_and_dilations(features, name, output_stride):
    model = feature_model(features, name, output_stride)
    strides = [SMALL // int(f.shape[1]) for f in model.outputs]
    assert strides == [min(s, output_stride) for s in (8, 16, 32)]
    classifier = edgevit.create_model(name, input_size=SMALL)
    assert [int(f.shape[-1]) for f in model.outputs] == [
        int(classifier.get_layer(f"layer_{i}.1.{'fusion' if 'v1' in name or 'xxs' in name else 'conv_proj'}.conv")
            .output.shape[-1]) for i in (3, 4, 5)]
    dilations = {layer.name: layer.dilation_rate[0] for layer in model.layers
                 if isinstance(layer, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D))}
    want_5 = {8: 2, 16: 1, 32: 1}[output_stride]
    assert dilations["layer_5.0.conv_3x3.conv"] == want_5 and dilations["layer_4.0.conv_3x3.conv"] == 1
    # the MobileViT blocks' own 3x3 convolutions stay undilated (the known trap)
    assert all(d == 1 for n, d in dilations.items() if ".1." in n)
    # same layers, same weights: a classifier's ImageNet weights fill the backbone by name
    shapes = {w.path: tuple(w.shape) for w in classifier.weights}
    assert all(shapes[w.path] == tuple(w.shape) for w in model.weights)


def test_create_features_as_timm_features_only(tmp_path):
    classifier = edgevit.create_model("mobilevit_v2_050", input_size=64)
    path = tmp_path / "classifier.weights.h5"
    classifier.save_weights(path)
    model = edgevit.create_features("mobilevit_v2_050", input_size=64, output_stride=16, weights=str(path))
    assert feature_info(model) == [{"reduction": 8, "channels": 128}, {"reduction": 16, "channels": 192},
                                   {"reduction": 16, "channels": 256}]
    values = {w.path: w.numpy() for w in classifier.weights}
    assert all(np.array_equal(values[w.path], w.numpy()) for w in model.weights)
    with pytest.raises(EdgevitError, match="features API"):
        edgevit.create_features(edgevit.list_models("deit*")[0], input_size=64)
    with pytest.raises(EdgevitError, match="output_stride"):
        edgevit.create_features("mobilevit_v1_xxs", input_size=64, output_stride=4)


def test_backbone_takes_the_classifier_weights_by_name():
    classifier = edgevit.create_model("mobilevit_v1_xxs", input_size=SMALL)
    segmenter = edgevit.create_model("deeplabv3_mobilevit_v1_xxs", input_size=SMALL)
    shapes = {w.path: tuple(w.shape) for w in classifier.weights}
    backbone = [w for w in segmenter.weights if w.path in shapes]
    # all but conv_1x1_exp (a kernel, BatchNorm's four) and head.fc (kernel, bias)
    assert len(backbone) == len(classifier.weights) - 7
    assert all(shapes[w.path] == tuple(w.shape) for w in backbone)


def _int8_file(model, size):
    import tensorflow as tf

    fn = tf.function(lambda x: model(x, training=False),
                     input_signature=[tf.TensorSpec((1, size, size, 3), tf.float32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], model)
    converter.experimental_lower_to_saved_model = False
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(0)
    converter.representative_dataset = lambda: ([rng.random((1, size, size, 3), np.float32)] for _ in range(2))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    converter.inference_input_type = converter.inference_output_type = tf.int8
    return converter.convert()


@pytest.mark.parametrize("name", ["deeplabv3_mobilevit_v1_xxs", "deeplabv3_mobilevit_v2_050"])
def test_converts_to_full_int8_without_shape_ops_or_float(name):
    from edgevit.litert.delegates import check
    from edgevit.litert.flatbuffer import read

    graph = read(_int8_file(edgevit.create_model(name, input_size=SMALL), SMALL))
    ops = Counter(op.name for op in graph.ops)
    refused = {"SHAPE", "GATHER", "PACK", "DEQUANTIZE", "QUANTIZE", "SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND"}
    assert not refused & set(ops)
    assert ops["RESIZE_BILINEAR"] == 1  # the image-pooling branch, from 1x1
    assert {t.dtype for t in graph.tensors} <= {"int8", "int32"}
    assert max(t.rank for t in graph.tensors) <= 4
    out = graph.tensors[graph.outputs[0]]
    assert list(out.shape) == [1, SMALL // 16, SMALL // 16, 21]
    reports = check(graph)
    assert reports["gpu"].fallbacks == []
    # NNAPI before Android 14 refuses only the LayerNorms' RSQRT, which the export rewrites (rsqrt_as_convolutions)
    assert {f.op for f in reports["nnapi"].fallbacks} <= {"RSQRT"}


def test_dilated_backbone_converts_with_dilated_kernels():
    """Output stride 8 dilates depthwise kernels: TFLite keeps the dilation in
    DEPTHWISE_CONV_2D instead of wrapping it in SPACE_TO_BATCH_ND."""
    from edgevit.litert.flatbuffer import read

    graph = read(_int8_file(feature_model(mobilevit_features, "mobilevit_v1_xxs", 8), SMALL))
    ops = Counter(op.name for op in graph.ops)
    assert "SPACE_TO_BATCH_ND" not in ops and "BATCH_TO_SPACE_ND" not in ops
    assert any(op.name == "DEPTHWISE_CONV_2D" and op.options.get("dilationHFactor") == 2 for op in graph.ops)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deeplabv3_mobilevit_v1_xxs"])
@pytest.mark.parametrize("precision", PRECISIONS)
def test_full_matrix(tmp_path, name, precision):
    """Every precision of a segmenter converts, passes the audit, and LiteRT's
    logits follow the Keras model's pixel by pixel (random weights, BatchNorm
    statistics re-estimated; at SMALL px: 512 takes minutes per file).
    Measured per-pixel cosines (2026-11-29): fp32 1.0, fp16 1.0, dynamic
    0.9973, int16x8 0.9949, int8_mixed 0.9181, int8 0.9223."""
    report = export_variant(tmp_path, name, precision, SMALL)
    assert_deployable(report)
    assert report["io"]["output"]["shape"] == [1, SMALL // 16, SMALL // 16, 10]
    agreement = report["agreement"]
    assert agreement["pixels"] == agreement["samples"] * (SMALL // 16) ** 2
    assert agreement["cosine_mean"] > COSINE_FLOOR[precision], agreement
